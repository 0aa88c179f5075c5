"""Fuzzing budget and the count of cases tried, printed at the end of the pytest run.

GOODPUT_FUZZ_EXAMPLES scales the budget (default 1.0 = what CI runs in about a minute; 10 for a long local run).
Every fuzz test derandomizes Hypothesis, so a given budget tries the same cases each run.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest

CASES: Counter[str] = Counter()


def budget(examples: int) -> int:
    return max(1, int(examples * float(os.environ.get("GOODPUT_FUZZ_EXAMPLES", "1"))))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "fuzz: property-based and schema-driven fuzzing with a fixed budget")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/fuzz/" in item.nodeid:
            item.add_marker(pytest.mark.fuzz)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not CASES:
        return
    terminalreporter.section("fuzz cases tried")
    for name, n in sorted(CASES.items()):
        terminalreporter.write_line(f"{n:>8}  {name}")
    terminalreporter.write_line(f"{sum(CASES.values()):>8}  total")
