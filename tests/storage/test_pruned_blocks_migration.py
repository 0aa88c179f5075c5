"""Revision 0010: runs.detail_pruned_version and step_blocks.pruned. A run pruned before it (its step blocks went
with its rows) keeps NULL, so its stored analyses stay final; downgrade drops both columns and keeps every row."""

from __future__ import annotations

from sqlalchemy import inspect, text

from services.storage.db import make_engine
from services.storage.migrate import downgrade, schema_drift, upgrade
from services.storage.runs import get_run


def columns(engine, table: str) -> set[str]:
    return {c["name"] for c in inspect(engine).get_columns(table)}


def test_runs_pruned_before_0010_stay_final_and_downgrade_keeps_every_row(database_url: str) -> None:
    engine = make_engine(database_url)
    upgrade(engine, "0009")
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO runs (id, run_id, project, status, version, ledger_version, detail_pruned_at) "
                          "VALUES (1, 'old', 'default', 'finished', 3, 3, 1700000000.0), "
                          "(2, 'going', 'default', 'running', 5, -1, NULL)"))
        conn.execute(text("INSERT INTO step_blocks (run_pk, attempt, block, changes, summary) "
                          "VALUES (2, 0, 0, 4, :b)"), {"b": b"summary"})

    upgrade(engine)  # through 0010
    assert schema_drift(engine) == []
    with engine.connect() as conn:
        old, going = get_run(conn, "old"), get_run(conn, "going")
        assert old.detail_pruned_version is None and not old.analysed_from_blocks
        assert going.detail_pruned_at is None and going.analysed_from_blocks
        assert conn.execute(text("SELECT summary, pruned FROM step_blocks")).one() == (b"summary", None)

    downgrade(engine, "0009")
    assert "detail_pruned_version" not in columns(engine, "runs") and "pruned" not in columns(engine, "step_blocks")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM runs")).scalar_one() == 2
        assert bytes(conn.execute(text("SELECT summary FROM step_blocks")).scalar_one()) == b"summary"
    upgrade(engine)
    assert schema_drift(engine) == []
    engine.dispose()
