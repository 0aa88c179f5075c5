"""The database goes away under a collector with tokens: every route answers 503 + Retry-After, never 500.

The database is made unreachable for real (its connections terminated and the database renamed, so new
connections are refused by PostgreSQL), with the token cache off so that every request has to ask it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import make_url

from services.collector.app import create_app
from services.settings import ServerSettings, ServiceSettings
from services.storage.tokens import create_token
from tests.conftest import create_postgres_database, drop_postgres_database

pytestmark = pytest.mark.postgres
T = 1_700_000_000.0


def _step(i: int) -> dict[str, Any]:
    return {"event_id": f"down-s{i}", "run_id": "down", "kind": "step", "time": T + i, "attempt": 0,
            "rank": 0, "step": i, "start": T + i - 1, "end": T + i}


@contextmanager
def _database_gone(admin_url: str, url: str) -> Iterator[None]:
    name = make_url(url).database
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
        conn.execute(f'ALTER DATABASE "{name}" RENAME TO "{name}_away"')
    try:
        yield
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'ALTER DATABASE "{name}_away" RENAME TO "{name}"')


@pytest.fixture
def postgres_url(postgres_admin_url: str) -> Iterator[str]:
    url = create_postgres_database(postgres_admin_url)
    try:
        yield url
    finally:
        drop_postgres_database(postgres_admin_url, url)


def test_every_route_answers_503_with_retry_after_while_the_database_is_unreachable(
        postgres_admin_url: str, postgres_url: str) -> None:
    from services.storage.db import make_engine
    from services.storage.migrate import upgrade

    engine = make_engine(postgres_url)
    upgrade(engine)
    with engine.begin() as conn:
        write, _ = create_token(conn, kind="write", project="team", name="jobs")
        read, _ = create_token(conn, kind="read", project="*", name="ops")
    server = ServerSettings(database_url=postgres_url, serve_dashboard=True, auth_cache_ttl_s=0, warm_analyses_s=0)
    settings = ServiceSettings(server=server)
    app = create_app(settings, engine=engine)
    writer_auth = {"Authorization": f"Bearer {write}"}
    reader_auth = {"Authorization": f"Bearer {read}"}
    with TestClient(app, raise_server_exceptions=False) as client:
        assert client.post("/v1/events", json={"events": [_step(1)]}, headers=writer_auth).status_code == 200
        with _database_gone(postgres_admin_url, postgres_url):
            engine.dispose()  # no pooled connection survives: every request has to connect
            answers = {
                "ingest": client.post("/v1/events", json={"events": [_step(2)]}, headers=writer_auth),
                "runs": client.get("/v1/runs", headers=reader_auth),
                "run": client.get("/v1/runs/down", headers=reader_auth),
                "waste": client.get("/v1/runs/down/waste", headers=reader_auth),
                "live": client.get("/v1/live", headers=reader_auth),
                "metrics": client.get("/metrics", headers=reader_auth),
                "report": client.get("/v1/runs/down/report?format=json", headers=reader_auth),
                "dashboard": client.get("/dashboard/", headers=reader_auth),
            }
            for name, answer in answers.items():
                assert answer.status_code == 503, (name, answer.status_code, answer.text)
                assert int(answer.headers["Retry-After"]) >= 1, name
                assert answer.json()["error"]["code"] == "storage_unavailable", (name, answer.text)
        engine.dispose()
        # back: the batch that was refused is accepted when resent, and nothing was stored twice
        assert client.post("/v1/events", json={"events": [_step(2)]}, headers=writer_auth).status_code == 200
        run = client.get("/v1/runs/down", headers=reader_auth)
        assert run.status_code == 200, run.text
    engine.dispose()
