"""`goodput failures RUN_ID` says why each failed attempt failed in the words of the run page and the report."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from services.cli.output import print_failures
from tests.analysis.test_failure_causes import GLOO, killed_rank_3, launcher_saw, two_attempts, views_of


def test_each_failed_attempt_is_one_line_with_its_rank_host_signal_and_error(
        capsys: pytest.CaptureFixture[str]) -> None:
    views = views_of(two_attempts([*killed_rank_3(), launcher_saw(3, -9, 26.2)]))
    api: Any = SimpleNamespace(view=lambda run_id, project=None: views)
    assert print_failures(api, "s1") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "run s1: 1 failed attempt"
    assert lines[1].startswith("attempt 0  ")
    assert lines[1].endswith(f"failed at step 20: rank 3 on h1 killed by SIGKILL (exit code -9); "
                             f"error (rank 0): {GLOO}")
    assert print_failures(api, "s1", as_json=True) == 0
    (failure,) = json.loads(capsys.readouterr().out)
    assert failure["cause"]["signal"] == "SIGKILL" and failure["cause"]["rank"] == 3
