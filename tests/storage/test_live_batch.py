"""The running runs of a fleet list are judged from states read for all of them at once
(services.storage.live_batch): each must be the state services.storage.live reads of the run alone, field by field,
for running, hung, restarted, pruned, clock-skewed and finished runs, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import text

from services.analysis.live import LiveConfig, detect_hang
from services.analysis.live_tail import tail_of
from services.collector.batch import parse_batch
from services.derive.cache import AnalysisCache
from services.derive.ledger import current_ledger
from services.derive.live import FLEET_LEDGER_BUDGET_S, live_for_row, live_for_running_runs, preemption_candidates
from services.simulate import SimConfig, simulate
from services.storage.clock_readings import RequestClock, readings_of
from services.storage.live import LIVE_TAIL, load_live_state
from services.storage.live_batch import load_live_states
from services.storage.run_products import store_product
from services.storage.runs import RunRef, RunRow, get_run, list_runs
from services.storage.write import write_batches
from tests.live_database import LiveDatabase

START = 1_700_000_000.0
STEPS = 300  # past two blocks of BLOCK_STEPS: the furthest rank's last steps partly from its block rows


def _config(i: int, **changes: object) -> SimConfig:
    base = SimConfig(run_id=f"batch-{i}", ranks=4, hours=STEPS / 3600, step_s=1.0, mtbf_s=STEPS * (0.5 + i % 3),
                     checkpoint_every=40, checkpoint_s=2.0, startup_s=10.0, queue_s=30.0, detect_s=10.0,
                     max_failures=2, seed=i, start_time=START, records_per_rank=20, ranks_per_host=2)
    return replace(base, **changes)  # type: ignore[arg-type]


FLEET = {
    "finished": _config(0, end="finished"),
    "failed": _config(1, end="failed", straggler_rank=1),
    "restarted, running": _config(2, end="running", heartbeat_s=5.0, mtbf_s=40.0),
    # steps of 6 s: its ranks heart-beat between steps (a rank that ends a step every 5 s or sooner sends none)
    "running, slow steps": _config(3, end="running", heartbeat_s=5.0, mtbf_s=10**9, step_s=6.0,
                                   hours=6 * STEPS / 3600),
    "running, a host 40 s ahead": _config(4, end="running", heartbeat_s=5.0, mtbf_s=10**9,
                                          clock_offsets={"node001": 40.0}),
    "running, a host 25 s behind": _config(5, end="running", heartbeat_s=5.0, clock_offsets={"node000": -25.0}),
    "running, pruned": _config(6, end="running", heartbeat_s=5.0, mtbf_s=10**9),
    "finished, pruned": _config(7, end="finished"),
    "never started": None,
}


def _store(db: LiveDatabase, project: str, name: str, config: SimConfig | None) -> RunRow:
    events: list[dict[str, Any]] = simulate(config).events if config is not None else [
        {"event_id": "only", "run_id": "batch-none", "kind": "run_submitted", "time": START}]
    records = parse_batch(json.dumps({"events": events}).encode(), max_events=10**6, max_rows=10**8)
    clocks = None
    if config is not None and config.clock_offsets:  # the collector's readings of the skewed senders
        latest = max(float(e["time"]) for e in events)
        received = latest - max(config.clock_offsets.values(), key=abs)
        clocks = [readings_of(records, RequestClock(received_at=received, sent_at=latest))]
    (result,) = write_batches(db.engine, [records], [project], clocks=clocks)
    assert result.conflict is None
    if "pruned" in name:  # as retention prunes it: its ledger stored first
        with db.engine.connect() as conn:
            current_ledger(AnalysisCache(db.engine), get_run(conn, RunRef(project, events[0]["run_id"])))
    with db.engine.begin() as conn:
        row = get_run(conn, RunRef(project, events[0]["run_id"]))
        if "pruned" in name:  # the live tail kept, the step rows gone
            tail = tail_of(load_live_state(conn, row, now=START + 2 * STEPS))
            store_product(conn, row.pk, LIVE_TAIL, version=row.version, product_json=tail.model_dump_json())
            for table in ("steps", "step_columns", "collectives"):
                conn.execute(text(f"DELETE FROM {table} WHERE run_pk = :pk"), {"pk": row.pk})
            conn.execute(text("UPDATE runs SET detail_pruned_at = :t WHERE id = :pk"), {"t": START, "pk": row.pk})
            row = get_run(conn, RunRef(project, events[0]["run_id"]))
    return row


@pytest.fixture(scope="module")
def fleet(live_db: LiveDatabase) -> list[RunRow]:
    return [_store(live_db, f"batch-{n}", name, config) for n, (name, config) in enumerate(FLEET.items())]


@pytest.mark.parametrize("after_s", [0.0, 20.0, 200.0, 5000.0])
def test_each_batched_state_is_the_state_read_of_the_run_alone(live_db: LiveDatabase, fleet: list[RunRow],
                                                                 after_s: float) -> None:
    """Judged `after_s` after each running run's last event: its heartbeats in the lookback, then out of it."""
    config = LiveConfig()
    for anchor in sorted({row.last_time for row in fleet if row.status == "running" and row.last_time}):
        now = anchor + after_s
        with live_db.engine.connect() as conn:
            batched = load_live_states(conn, fleet, now=now, lookback_s=config.heartbeat_lookback_s,
                                       recent_steps=config.recent_steps)
            alone = {row.pk: load_live_state(conn, row, now=now, lookback_s=config.heartbeat_lookback_s,
                                             recent_steps=config.recent_steps) for row in fleet}
        assert list(batched) == [row.pk for row in fleet]
        for row in fleet:
            assert batched[row.pk] == alone[row.pk], (row.run_id, now)
        verdicts = [detect_hang(replace(batched[row.pk], status="running"), now, config) for row in fleet]
        assert verdicts == [detect_hang(replace(alone[row.pk], status="running"), now, config) for row in fleet]


def test_the_fleet_holds_the_cases_it_is_meant_to(live_db: LiveDatabase, fleet: list[RunRow]) -> None:
    """The comparison above is only as good as its fleet: skewed clocks measured, restarts, ranks in heartbeats
    (between slow steps), the furthest rank's last steps partly in block rows, a pruned run with its tail, a run
    without an attempt."""
    with live_db.engine.connect() as conn:
        states = {row.pk: load_live_states(conn, [row], now=(row.last_time or START) + 20.0)[row.pk] for row in fleet}
        moved = conn.execute(text("SELECT count(*) FROM step_columns")).scalar_one()
    by_name = dict(zip(FLEET, (states[row.pk] for row in fleet), strict=True))
    assert by_name["running, a host 40 s ahead"].ranks[2].clock_offset_s == pytest.approx(40.0, abs=1.0)
    assert by_name["running, a host 25 s behind"].ranks[0].clock_offset_s == pytest.approx(-25.0, abs=1.0)
    assert (by_name["restarted, running"].attempt or 0) > 0
    assert any(r.heartbeat_time is not None for r in by_name["running, slow steps"].ranks)
    assert len(by_name["running, slow steps"].leader_step_ends) == LiveConfig().recent_steps + 1
    assert moved > 0
    assert by_name["running, pruned"].leader_step_ends
    assert sum(detect_hang(state, max(row.last_time or START for row in fleet) + 200.0, LiveConfig()).hung
               for row, state in zip(fleet, by_name.values(), strict=True)) >= 1
    assert by_name["never started"].attempt is None


@pytest.mark.parametrize("after_s", [0.0, 200.0])
def test_the_fleet_live_answers_are_each_runs_own(live_db: LiveDatabase, fleet: list[RunRow], after_s: float) -> None:
    """`/v1/live` and the preemption candidates read the states of all running runs at once: each run's entry is
    its per-run live answer without ranks, hung or not as that answer says."""
    config = LiveConfig()
    analyses = AnalysisCache(live_db.engine)
    now = max(row.last_time or START for row in fleet) + after_s
    with live_db.engine.connect() as conn:
        running = list_runs(conn, status="running")
    alone = [live_for_row(analyses, row, now, config, with_ranks=False, ledger_budget_s=FLEET_LEDGER_BUDGET_S)
             for row in running]
    listed = live_for_running_runs(analyses, now, config)
    assert len(listed) == 6 and sum(r.hung for r in listed) == (6 if after_s else 5)  # "slow steps" not yet
    assert sorted(listed, key=lambda r: (r.project, r.run_id)) == sorted(
        (r for r in alone if r.status == "running"), key=lambda r: (r.project, r.run_id))
    candidates = preemption_candidates(analyses, now, config)
    by_run = {(r.project, r.run_id): r.hung for r in alone}
    assert {(c.project, c.run_id): c.hung for c in candidates} == by_run
