"""Shared fixtures: a migrated throwaway database per test (SQLite file and local PostgreSQL), one per module for
live hang detection's scenarios (`live_db`), and an app on it."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # the server's packages are imported lazily: the client's suite runs without them
    from fastapi.testclient import TestClient
    from sqlalchemy import Engine

    from services.settings import ServiceSettings
    from tests.live_database import LiveDatabase

POSTGRES_ADMIN_URL = os.environ.get("GOODPUT_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")


@pytest.fixture(scope="session")
def postgres_admin_url() -> str:
    import psycopg

    try:
        with psycopg.connect(POSTGRES_ADMIN_URL, connect_timeout=5):
            pass
    except psycopg.OperationalError as exc:
        pytest.fail(
            f"PostgreSQL is not reachable at {POSTGRES_ADMIN_URL} ({exc}); start it with "
            "`pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start` or set GOODPUT_TEST_POSTGRES")
    return POSTGRES_ADMIN_URL


def create_postgres_database(admin_url: str) -> str:
    import psycopg
    from sqlalchemy.engine import make_url

    name = f"goodput_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return make_url(admin_url).set(database=name).render_as_string(hide_password=False)


def drop_postgres_database(admin_url: str, url: str) -> None:
    import psycopg
    from sqlalchemy.engine import make_url

    name = make_url(url).database
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def throwaway_database(request: pytest.FixtureRequest, folder: Path) -> Iterator[str]:
    """The URL of an empty database of the kind `request.param` names: a SQLite file in `folder`, or a database
    on the local PostgreSQL, dropped afterwards."""
    if request.param == "sqlite":
        yield f"sqlite:///{folder / 'goodput.db'}"
        return
    admin = request.getfixturevalue("postgres_admin_url")
    url = create_postgres_database(admin)
    try:
        yield url
    finally:
        drop_postgres_database(admin, url)


@contextmanager
def migrated_engine(url: str) -> Iterator[Engine]:
    from services.storage.db import make_engine
    from services.storage.migrate import upgrade

    engine = make_engine(url)
    upgrade(engine)
    yield engine
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with throwaway_database(request, tmp_path) as url:
        yield url


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    with migrated_engine(database_url) as engine:
        yield engine


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def live_db(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveDatabase]:
    """One migrated database per module and kind, where each test stores its scenarios and reads their live state
    as the collector does (tests/live_database.py); every scenario is stored in a project of its own."""
    from tests.live_database import LiveDatabase

    with throwaway_database(request, tmp_path_factory.mktemp("live")) as url, migrated_engine(url) as engine:
        yield LiveDatabase(engine)


@pytest.fixture
def settings(database_url: str) -> ServiceSettings:
    from services.settings import ServerSettings, ServiceSettings

    # no background analyses: tests that count builds see only their own (tests/collector/test_warm_analyses.py)
    return ServiceSettings(server=ServerSettings(database_url=database_url, serve_dashboard=False, warm_analyses_s=0))


@pytest.fixture
def client(settings: ServiceSettings, engine: Engine) -> Iterator[TestClient]:
    from fastapi.testclient import TestClient

    from services.collector.app import create_app

    with TestClient(create_app(settings, engine=engine)) as test_client:
        yield test_client
