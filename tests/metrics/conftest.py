from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import create_postgres_database, drop_postgres_database


def pytest_configure(config: pytest.Config) -> None:
    # Until pyproject.toml's [tool.pytest.ini_options] markers lists it.
    config.addinivalue_line("markers", "prometheus: starts a real Prometheus server (Debian package prometheus)")


@pytest.fixture
def postgres_url(postgres_admin_url: str) -> Iterator[str]:
    """A throwaway PostgreSQL database for a `goodput serve` of the test's own."""
    url = create_postgres_database(postgres_admin_url)
    yield url
    drop_postgres_database(postgres_admin_url, url)
