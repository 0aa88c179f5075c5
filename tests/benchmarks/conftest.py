"""Fixtures of the benchmarks' tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import create_postgres_database, drop_postgres_database


@pytest.fixture
def postgres_url(postgres_admin_url: str) -> Iterator[str]:
    """A throwaway PostgreSQL database, empty (not migrated)."""
    url = create_postgres_database(postgres_admin_url)
    yield url
    drop_postgres_database(postgres_admin_url, url)
