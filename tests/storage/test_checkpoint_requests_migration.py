from __future__ import annotations

from sqlalchemy import inspect

from services.storage.db import make_engine
from services.storage.migrate import downgrade, upgrade


def test_revision_0002_adds_checkpoint_requests_and_its_downgrade_removes_them(database_url: str) -> None:
    engine = make_engine(database_url)
    upgrade(engine, "0002")
    tables = set(inspect(engine).get_table_names())
    assert "checkpoint_requests" in tables
    assert {ix["name"] for ix in inspect(engine).get_indexes("checkpoint_requests")} == {
        "ix_checkpoint_requests_run_fulfilled"}
    downgrade(engine, "0001")
    assert "checkpoint_requests" not in set(inspect(engine).get_table_names())
    assert "runs" in set(inspect(engine).get_table_names())
    engine.dispose()
