"""Revision 0011: the attempts stored before launches existed keep their numbers, and a launch that arrives after the
upgrade is numbered after them."""

from __future__ import annotations

import json

from sqlalchemy import text

from services.collector.batch import parse_batch
from services.storage.db import make_engine
from services.storage.migrate import current_revision, downgrade, head_revision, schema_drift, upgrade
from services.storage.write import write_batches
from tests.analysis.scenarios import T0


def test_upgrade_records_the_stored_attempts_and_a_later_launch_continues_after_them(database_url: str) -> None:
    engine = make_engine(database_url)
    upgrade(engine, "0010")
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO runs (run_id, project, status, version, ledger_version) "
                          "VALUES ('old', 'default', 'running', 1, -1)"))
        pk = conn.execute(text("SELECT id FROM runs WHERE run_id = 'old'")).scalar_one()
        for event_id, attempt, t in (("a", 0, T0), ("b", 0, T0 + 5), ("c", 1, T0 + 100)):
            conn.execute(text("INSERT INTO events (run_pk, event_id, kind, time, attempt, rank) "
                              "VALUES (:pk, :id, 'heartbeat', :t, :a, 0)"), {"pk": pk, "id": event_id, "t": t,
                                                                           "a": attempt})
    upgrade(engine)
    assert current_revision(engine) == head_revision() and schema_drift(engine) == []
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT launch, client_attempt, attempt, start_time FROM attempt_numbers "
                                 "ORDER BY client_attempt")).all()
    assert [tuple(r) for r in rows] == [("", 0, 0, T0), ("", 1, 1, T0 + 100)]

    relaunch = {"event_id": "new-1", "run_id": "old", "kind": "attempt_start", "time": T0 + 200, "attempt": 0,
                "rank": 0, "world_size": 1, "host": "elsewhere", "launch": "fresh-spool"}
    (result,) = write_batches(engine, [parse_batch(json.dumps({"events": [relaunch]}).encode(), max_events=10,
                                                   max_rows=10)])
    assert result.accepted == 1
    with engine.connect() as conn:
        assert conn.execute(text("SELECT attempt FROM events WHERE event_id = 'new-1'")).scalar_one() == 2
    downgrade(engine, "0010")
    assert current_revision(engine) == "0010"
    engine.dispose()
