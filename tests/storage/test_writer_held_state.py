"""The writer keeps its connection and its runs' keys between groups: a database emptied and renumbered under it (as
a benchmark or a restore does) still gets the next batch into the right run (both backends). A kept key that now
names another run is caught in the same transaction (services.storage.write: the run's update matches no row, or the
keys behind duplicates are read back), and the group is written again with every run looked up."""

from __future__ import annotations

import json
import time

from sqlalchemy import text

from services.collector.batch import parse_batch
from services.storage.records import IngestRecord
from services.storage.step_columns import stored_step_keys
from services.storage.write import write_batches
from services.storage.writer import BatchWriter


def _batch(event_id: str, step: int, run_id: str = "held", now: float | None = None) -> list[IngestRecord]:
    now = time.time() if now is None else now
    event = {"event_id": event_id, "run_id": run_id, "kind": "steps", "time": now, "attempt": 0, "rank": 0,
             "step": [step], "start": [now - 1.0], "end": [now - 0.5]}
    return parse_batch(json.dumps({"events": [event]}).encode(), max_events=10, max_rows=10)


def _empty_and_renumber(engine) -> None:
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(text("TRUNCATE steps, step_marks, events, runs RESTART IDENTITY CASCADE"))
        else:
            for table in ("steps", "step_marks", "events", "runs"):
                conn.execute(text(f"DELETE FROM {table}"))
        conn.execute(text("INSERT INTO runs (run_id, project, status, version, ledger_version) "
                          "VALUES ('other', 'default', 'running', 0, -1)"))  # takes the kept key's place


def _steps_by_run(engine) -> list[tuple[str, int]]:
    with engine.connect() as conn:
        run_ids = dict(conn.execute(text("SELECT id, run_id FROM runs")).all())
        keys = stored_step_keys(conn)
    return sorted((run_ids[pk], step) for pk, step in zip(keys["run_pk"].tolist(), keys["step"].tolist(),
                                                          strict=True))


def test_a_run_key_the_database_no_longer_has_is_looked_up_again(engine) -> None:
    writer = BatchWriter(engine)
    writer.start()
    try:
        assert writer.submit(_batch("a", 1)).result(timeout=30).accepted == 1  # the run's key is kept now
        _empty_and_renumber(engine)
        assert writer.submit(_batch("b", 2)).result(timeout=30).accepted == 1
    finally:
        writer.stop()
    assert _steps_by_run(engine) == [("held", 2)]


def test_a_kept_key_behind_a_duplicate_is_checked_before_the_duplicate_is_believed(engine) -> None:
    """The run that took the kept key holds an event with the same id and content: without the check, the batch
    would be counted a duplicate of that other run's event, and nothing of it stored."""
    now = time.time()
    writer = BatchWriter(engine)
    writer.start()
    try:
        assert writer.submit(_batch("a", 1, now=now)).result(timeout=30).accepted == 1  # held's key is kept now
        _empty_and_renumber(engine)
        assert writer.submit(_batch("a", 1, run_id="other", now=now)).result(timeout=30).accepted == 1
        assert writer.submit(_batch("a", 1, now=now)).result(timeout=30).accepted == 1
    finally:
        writer.stop()
    assert _steps_by_run(engine) == [("held", 1), ("other", 1)]


def test_one_kept_key_gone_among_a_groups_runs_is_caught(engine) -> None:
    """A group touches all its runs at once (one round trip on PostgreSQL): one run of several whose kept key no
    longer names it is enough to write the group again with every run looked up."""
    known: dict[tuple[str, str], int] = {}
    write_batches(engine, [_batch("a1", 1, run_id="a"), _batch("b1", 1, run_id="b"), _batch("c1", 1, run_id="c")],
                  known_runs=known)
    with engine.begin() as conn:
        conn.execute(text("UPDATE runs SET run_id = 'renamed' WHERE run_id = 'b'"))
    results = write_batches(engine, [_batch("a2", 2, run_id="a"), _batch("b2", 2, run_id="b"),
                                     _batch("c2", 2, run_id="c")], known_runs=known)
    assert [r.accepted for r in results] == [1, 1, 1]
    assert _steps_by_run(engine) == [("a", 1), ("a", 2), ("b", 2), ("c", 1), ("c", 2), ("renamed", 1)]
