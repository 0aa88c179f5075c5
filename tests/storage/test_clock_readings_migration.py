"""Revision 0009: clock_readings is created, and the step block summaries stored before (without clock groups) are
deleted so that each block is summarised again from its rows; every other row stays. Downgrade drops the table and
keeps the rest."""

from __future__ import annotations

from sqlalchemy import inspect, text

from services.analysis.run_data import run_data_from_events
from services.analysis.step_blocks import summarize_steps
from services.analysis.step_summary import merge_blocks
from services.storage.db import make_engine
from services.storage.migrate import current_revision, downgrade, head_revision, schema_drift, upgrade
from services.storage.runs import get_run
from services.storage.step_blocks import load_summarised_run_data
from tests.analysis.test_clocks import two_hosts

COUNTED = ("runs", "events", "steps", "step_marks", "step_blocks")


def counts(engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {t: int(conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()) for t in COUNTED}


def test_old_block_summaries_go_and_are_made_again_with_clock_groups(database_url: str) -> None:
    engine = make_engine(database_url)
    upgrade(engine, "0008")
    sim = two_hosts(60.0, hours=0.03)  # 108 steps: one block
    steps = [e for e in sim.events if e["kind"] == "steps"]
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO runs (id, run_id, project, status, version, ledger_version) "
                          "VALUES (1, 'skewed', 'default', 'running', 1, -1)"))
        for e in steps:
            for s, t0, t1 in zip(e["step"], e["start"], e["end"], strict=True):
                conn.execute(text("INSERT INTO steps (run_pk, attempt, rank, step, start_time, end_time, comm) "
                                  "VALUES (1, :a, :r, :s, :t0, :t1, 0.05)"),
                             {"a": e["attempt"], "r": e["rank"], "s": s, "t0": t0, "t1": t1})
            conn.execute(text("INSERT INTO step_marks (run_pk, attempt, block, rank, changes) "
                              "VALUES (1, :a, 0, :r, 1)"), {"a": e["attempt"], "r": e["rank"]})
        conn.execute(text("INSERT INTO step_blocks (run_pk, attempt, block, changes, summary) "
                          "VALUES (1, 0, 0, 16, :b)"), {"b": b"a summary of revision 0008"})
    before = counts(engine)

    upgrade(engine)  # through 0009, which drops the stored summaries
    assert current_revision(engine) == head_revision() and schema_drift(engine) == []
    assert "clock_readings" in inspect(engine).get_table_names()
    assert counts(engine) == {**before, "step_blocks": 0}
    with engine.connect() as conn:
        run = get_run(conn, "skewed")
    summary = load_summarised_run_data(engine, run).step_summary  # the block, summarised again from its rows
    expected = merge_blocks(summarize_steps(run_data_from_events("skewed", steps).steps))
    assert summary is not None and len(summary.clocks) == 1
    assert summary.clocks[0].deviation.tolist() == expected.clocks[0].deviation.tolist()
    assert len(summary.clocks[0].deviation) == 2  # two clocks: node001's is 60 s ahead

    downgrade(engine, "0008")
    assert "clock_readings" not in inspect(engine).get_table_names()
    assert counts(engine) == {**before, "step_blocks": 1}  # the new summary stays: the older code reads it
    upgrade(engine)
    assert schema_drift(engine) == []
    engine.dispose()
