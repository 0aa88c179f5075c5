"""The writer keeps its connection between groups, never what it read through it: a database emptied and renumbered
under it (as a benchmark or a restore does) gets the next batch into the right run (both backends). A cache of runs'
keys was tried and failed this: a renumbered key pointed at another run, silently."""

from __future__ import annotations

import json
import time

from sqlalchemy import text

from services.collector.batch import parse_batch
from services.storage.records import IngestRecord
from services.storage.writer import BatchWriter


def _batch(event_id: str, step: int) -> list[IngestRecord]:
    now = time.time()
    event = {"event_id": event_id, "run_id": "held", "kind": "steps", "time": now, "attempt": 0, "rank": 0,
             "step": [step], "start": [now - 1.0], "end": [now - 0.5]}
    return parse_batch(json.dumps({"events": [event]}).encode(), max_events=10, max_rows=10)


def test_a_run_key_the_database_no_longer_has_is_looked_up_again(engine) -> None:
    writer = BatchWriter(engine)
    writer.start()
    try:
        assert writer.submit(_batch("a", 1)).result(timeout=30).accepted == 1  # the run's key is cached now
        with engine.begin() as conn:  # emptied and renumbered under the writer
            if engine.dialect.name == "postgresql":
                conn.execute(text("TRUNCATE steps, step_marks, events, runs RESTART IDENTITY CASCADE"))
            else:
                for table in ("steps", "step_marks", "events", "runs"):
                    conn.execute(text(f"DELETE FROM {table}"))
            conn.execute(text("INSERT INTO runs (run_id, project, status, version, ledger_version) "
                              "VALUES ('other', 'default', 'running', 0, -1)"))  # takes the cached key's place
        assert writer.submit(_batch("b", 2)).result(timeout=30).accepted == 1
    finally:
        writer.stop()
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT r.run_id, s.step FROM steps s JOIN runs r ON r.id = s.run_pk")).all()
    assert [tuple(r) for r in rows] == [("held", 2)]
