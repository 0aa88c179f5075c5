"""Revision 0015: the event rows of step records whose rows are in block rows go, and so do the heartbeats between
each (run, attempt, rank)'s earliest and latest; the rest stays. Downgrade drops the index only."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text

from services.analysis.step_blocks import BLOCK_STEPS
from services.storage.db import make_engine
from services.storage.migrate import current_revision, downgrade, head_revision, schema_drift, upgrade
from tests.analysis.scenarios import T0


def test_upgrade_deletes_the_moved_records_and_the_heartbeats_between_and_keeps_the_rest(database_url: str) -> None:
    engine = make_engine(database_url)
    upgrade(engine, "0014")
    events: list[dict[str, Any]] = []
    for run_pk in (1, 2):
        for rank in (0, 1):
            # run 1 rank 0 left blocks 0 and 1 (block rows); every other rank is in its first block
            for step in range(0, 2 * BLOCK_STEPS + 5, 10) if (run_pk, rank) == (1, 0) else range(0, 40, 10):
                events.append({"pk": run_pk, "id": f"s{rank}-{step}", "kind": "steps", "t": T0 + step,
                               "r": rank, "s": step + 9})  # a record of ten steps: `step` is its last
            events += [{"pk": run_pk, "id": f"h{rank}-{i}", "kind": "heartbeat", "t": T0 + 5 * i, "r": rank, "s": i}
                       for i in range(6)]
        events.append({"pk": run_pk, "id": "end", "kind": "attempt_end", "t": T0 + 999, "r": 0, "s": None})
    with engine.begin() as conn:
        for run_pk in (1, 2):
            conn.execute(text("INSERT INTO runs (id, run_id, project, status, version, ledger_version) "
                              "VALUES (:pk, :id, 'default', 'running', 1, -1)"), {"pk": run_pk, "id": f"r{run_pk}"})
        conn.execute(text("INSERT INTO events (run_pk, event_id, kind, time, attempt, rank, step) "
                          "VALUES (:pk, :id, :kind, :t, 0, :r, :s)"), events)
        conn.execute(text("INSERT INTO step_columns (run_pk, attempt, rank, block, end_time, rows, data) "
                          "VALUES (1, 0, 0, :b, :t, 1, :d)"),
                     [{"b": b, "t": T0 + b, "d": b"\x00"} for b in (0, 1)])

    upgrade(engine)
    assert current_revision(engine) == head_revision() and schema_drift(engine) == []
    with engine.connect() as conn:
        kept = {(pk, event_id) for pk, event_id in conn.execute(text("SELECT run_pk, event_id FROM events"))}
    # run 1 rank 0: its records ending in block 2 stay (the one spanning blocks 1 and 2 included), the rest went
    moved = {(1, f"s0-{step}") for step in range(0, 2 * BLOCK_STEPS + 5, 10) if step + 9 < 2 * BLOCK_STEPS}
    between = {(pk, f"h{rank}-{i}") for pk in (1, 2) for rank in (0, 1) for i in range(1, 5)}
    assert kept == {(e["pk"], e["id"]) for e in events} - moved - between

    downgrade(engine, "0014")
    assert current_revision(engine) == "0014"
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM events")).scalar_one() == len(kept)
    engine.dispose()
