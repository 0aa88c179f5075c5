from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # Until pyproject.toml's [tool.pytest.ini_options] markers lists it.
    config.addinivalue_line("markers", "prometheus: starts a real Prometheus server (Debian package prometheus)")
