"""Revision 0007: steps and collectives become day partitions on PostgreSQL with every row kept; downgrade makes
them plain tables again with every row kept. SQLite gains the pruned mark and run_products only."""

from __future__ import annotations

import time

from sqlalchemy import inspect, text

from services.storage.db import make_engine
from services.storage.migrate import downgrade, upgrade
from services.storage.retention import day_of, partition_name

NOW = time.time()
ENDS = (NOW - 400 * 86_400, NOW - 3 * 86_400, NOW - 60)  # long ago (DEFAULT partition), 3 days ago, now


def rows(engine) -> dict[str, list[tuple[float, ...]]]:
    with engine.connect() as conn:
        return {t: sorted(tuple(r) for r in conn.execute(text(f"SELECT run_pk, step, end_time FROM {t}")))
                for t in ("steps", "collectives")}


def partitioned(engine) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(text("SELECT c.relname FROM pg_partitioned_table p JOIN pg_class c "
                                     "ON c.oid = p.partrelid")).scalars())


def test_raw_rows_move_into_day_partitions_and_back_on_downgrade(database_url: str) -> None:
    engine = make_engine(database_url)
    upgrade(engine, "0006")
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO runs (id, run_id, project, status, version, ledger_version) "
                          "VALUES (1, 'r', 'default', 'running', 1, -1)"))
        for k, end in enumerate(ENDS):
            conn.execute(text("INSERT INTO steps (run_pk, attempt, rank, step, start_time, end_time) "
                              "VALUES (1, 0, 0, :s, :e - 1, :e)"), {"s": k, "e": end})
            conn.execute(text("INSERT INTO collectives (run_pk, attempt, rank, step, op, start_time, end_time) "
                              "VALUES (1, 0, 0, :s, 'allreduce', :e - 1, :e)"), {"s": k, "e": end})
    before = rows(engine)

    upgrade(engine, "0007")
    assert rows(engine) == before
    assert "detail_pruned_at" in {c["name"] for c in inspect(engine).get_columns("runs")}
    if engine.dialect.name == "postgresql":
        assert partitioned(engine) == {"steps", "collectives"}
        with engine.connect() as conn:
            where = {name: conn.execute(text(f'SELECT count(*) FROM "{name}"')).scalar() for name in (
                "steps_default", partition_name("steps", day_of(ENDS[1])), partition_name("steps", day_of(ENDS[2])))}
        assert where == {"steps_default": 1, partition_name("steps", day_of(ENDS[1])): 1,
                         partition_name("steps", day_of(ENDS[2])): 1}

    downgrade(engine, "0006")
    assert rows(engine) == before
    assert "run_products" not in inspect(engine).get_table_names()
    if engine.dialect.name == "postgresql":
        assert partitioned(engine) == set()
        assert not [t for t in inspect(engine).get_table_names() if t.startswith(("steps_", "collectives_"))]
    upgrade(engine, "0007")
    assert rows(engine) == before
    engine.dispose()
