"""Bytes the database keeps per stored step, on PostgreSQL and SQLite, and the growth per GPU-day.

A simulated run (8 ranks, one step a second per rank, a heartbeat every 5 s per rank, no failures) is written
through the collector's writer in time order, as the clients send it: compact `steps` records with each step's
collective seconds inline (`comm`), one step per record at `--steps-per-record 1` (the client posts every 0.2 s, so
at one step a second each record holds one step) or more. What is measured is the growth of every table and index a
step or a heartbeat touches (`steps` and `step_columns` partitions, `events`, `step_marks`), from an empty migrated
database: PostgreSQL `pg_total_relation_size` summed over the tables (partitions included) after VACUUM FULL: the
bytes the rows take, not the tables' high-water mark (`steps` keeps each rank's current block only; the space of the
rows moved out into block rows is reused by later inserts once autovacuum has passed, which a short benchmark does
not wait for). SQLite the file size after a WAL checkpoint (its free pages are reused by later inserts too). A
GPU-day is 86,400 steps (one rank per GPU, one step a second). PostgreSQL also: the bytes of the run's step blocks,
which a pruned run keeps.

    python -m benchmarks.storage_growth [--hours 1] [--steps-per-record 1]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import text

from benchmarks._common import machine, postgres_database
from services.collector.batch import parse_batch
from services.simulate import SimConfig, simulate
from services.storage.db import make_engine
from services.storage.migrate import upgrade
from services.storage.step_blocks import fold_step_blocks
from services.storage.step_columns import stored_step_count
from services.storage.writer import BatchWriter

GPU_DAY_STEPS = 86_400


def _store(url: str, events: list[dict[str, Any]]) -> None:
    engine = make_engine(url)
    writer = BatchWriter(engine)
    writer.start()
    try:
        for i in range(0, len(events), 2000):
            records = parse_batch(json.dumps({"events": events[i:i + 2000]}).encode(), max_events=10**6,
                                  max_rows=10**8)
            writer.submit(records).result(timeout=600)
    finally:
        writer.stop()
    engine.dispose()


def _postgres_bytes(url: str) -> dict[str, int]:
    engine = make_engine(url)
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("VACUUM FULL ANALYZE")
        out = {}
        for table in ("steps", "step_columns", "collectives", "events", "step_marks"):
            total = conn.execute(text(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c WHERE c.relname = :t "
                "OR c.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = CAST(:t AS regclass))"),
                {"t": table}).scalar()
            out[table] = int(total or 0)
    engine.dispose()
    return out


def _sqlite_bytes(path: Path) -> dict[str, int]:
    engine = make_engine(f"sqlite:///{path}")
    with engine.connect() as conn:
        conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    engine.dispose()
    return {"file": os.path.getsize(path)}


def _row_counts(url: str) -> dict[str, int]:
    engine = make_engine(url)
    with engine.connect() as conn:
        out = {t: int(conn.execute(text(f"SELECT count(*) FROM {t}")).scalar() or 0) for t in ("collectives", "events")}
        out["heartbeats"] = int(conn.execute(text("SELECT count(*) FROM events WHERE kind = 'heartbeat'")).scalar_one())
        out["steps"] = stored_step_count(conn)  # in `steps` and in block rows
    engine.dispose()
    return out


def _kept_when_pruned(url: str) -> int:
    """Bytes of the run's step blocks (`step_blocks`, `step_marks`: what a pruned run keeps of its steps), summarised
    as the collector's analysis does."""
    engine = make_engine(url)
    with engine.connect() as conn:
        run_pk = int(conn.execute(text("SELECT id FROM runs")).scalar_one())
    fold_step_blocks(engine, run_pk)
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("VACUUM ANALYZE")
        kept = sum(int(conn.execute(text("SELECT pg_total_relation_size(CAST(:t AS regclass))"), {"t": t}).scalar()
                       or 0) for t in ("step_blocks", "step_marks"))
    engine.dispose()
    return kept


def measure(url: str, events: list[dict[str, Any]], size: Any) -> tuple[int, dict[str, int], dict[str, int]]:
    engine = make_engine(url)
    upgrade(engine)
    engine.dispose()
    before = size()
    _store(url, events)
    after = size()
    grown = {k: after[k] - before[k] for k in after}
    return sum(grown.values()), grown, _row_counts(url)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=1.0, help="hours of steps per rank (8 ranks)")
    parser.add_argument("--steps-per-record", type=int, default=1)
    args = parser.parse_args()
    config = SimConfig(run_id="growth", ranks=8, hours=args.hours, step_s=1.0, mtbf_s=None, queue_s=0,
                       records_per_rank=args.steps_per_record, start_time=time.time() - args.hours * 3600 - 600,
                       heartbeat_s=5.0)
    events = sorted(simulate(config).events, key=lambda e: e["time"])
    beats = sum(e["kind"] == "heartbeat" for e in events)
    print(f"storage growth: {machine()}; 8 ranks x {args.hours:g} h, {args.steps_per_record} step(s) per record, "
          f"{beats:,} heartbeats sent")
    results = {}
    with postgres_database() as url:
        results["PostgreSQL"] = measure(url, events, lambda: _postgres_bytes(url))
        kept = _kept_when_pruned(url)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "growth.db"
        results["SQLite"] = measure(f"sqlite:///{path}", events, lambda: _sqlite_bytes(path))
    for name, (total, grown, rows) in results.items():
        steps = rows["steps"]
        per_step = total / steps
        parts = ", ".join(f"{k} {v / 1e6:.2f} MB = {v / steps:.1f} B/step" for k, v in grown.items())
        print(f"{name}: {steps:,} steps, {rows['events']:,} event rows ({rows['heartbeats']:,} heartbeats) kept; "
              f"{total / 1e6:.2f} MB ({parts})")
        print(f"  {per_step:.1f} bytes per stored step, heartbeats included -> {per_step * GPU_DAY_STEPS / 1e6:.2f} MB "
              "per GPU-day")
        if name == "PostgreSQL":
            print(f"  kept when the run is pruned (docs/retention.md): its step blocks, {kept / steps:.1f} bytes per "
                  f"step ({kept / total:.1%} of the raw rows)")


if __name__ == "__main__":
    main()
