"""Heartbeats are read back as each (attempt, rank)'s earliest and latest only (services/storage/load.py): the
ledger, the views and live hang detection of runs that heart-beat are the same as from every event sent.

A 256-rank run heart-beating every 5 s sends 51 heartbeats a second for its whole life; reading them all made
every analysis of a long live run cost (and keep in memory) more the longer it ran (issue 12, the fleet load)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from services.analysis.ledger import build_ledger
from services.analysis.live import LiveConfig
from services.analysis.run_data import run_data_from_events
from services.analysis.views import build_run_views
from services.collector.batch import parse_batch
from services.simulate import SimConfig, simulate
from services.storage.load import load_run_data
from services.storage.runs import get_run
from services.storage.step_blocks import load_summarised_run_data
from services.storage.summary_cache import SummaryCache
from services.storage.write import write_batches
from tests.live_database import StoredRun
from tests.storage.test_incremental_analysis import assert_same

CASES: list[dict[str, Any]] = [
    dict(ranks=4, hours=0.05, mtbf_s=60, straggler_rank=1, end="failed", killed=True),
    dict(ranks=3, hours=0.04, hang_at_step=40, hang_s=90, end="running"),
    dict(ranks=5, hours=0.04, mtbf_s=45, comm_inline=False, end="finished", checkpoint_every=30),
]


def _store(engine: Any, events: list[dict[str, Any]], rng: random.Random) -> None:
    shuffled = list(events)
    rng.shuffle(shuffled)  # heartbeats of one rank arrive out of order, as from several spools
    for at in range(0, len(shuffled), 200):
        records = parse_batch(json.dumps({"events": shuffled[at:at + 200]}).encode(), max_events=10**6,
                              max_rows=10**8)
        (result,) = write_batches(engine, [records])
        assert result.conflict is None


@pytest.mark.parametrize("case", range(len(CASES)))
def test_a_heart_beating_runs_analysis_equals_the_analysis_of_every_event_sent(engine, case: int) -> None:
    run_id = f"beats-{case}"
    sent = simulate(SimConfig(run_id=run_id, seed=case, heartbeat_s=2.0, **CASES[case])).events
    beats = sum(1 for e in sent if e["kind"] == "heartbeat")
    _store(engine, sent, random.Random(case))
    truth = run_data_from_events(run_id, sent)
    truth_ledger = build_ledger(truth)
    with engine.connect() as conn:
        run = get_run(conn, run_id)
        loaded = load_run_data(conn, run)
    cache = SummaryCache()
    for data in (loaded, load_summarised_run_data(engine, run), load_summarised_run_data(engine, run, cache),
                 load_summarised_run_data(engine, run, cache)):
        read = int((data.events["kind"] == "heartbeat").sum())
        assert read <= 2 * truth.events.dropna(subset=["rank"]).groupby(["attempt", "rank"]).ngroups < beats
        ledger = build_ledger(data)
        assert_same(truth_ledger.model_dump(mode="json"), ledger.model_dump(mode="json"), "ledger")
        assert_same(build_run_views(truth, truth_ledger, version=1).model_dump(mode="json"),
                    build_run_views(data, ledger, version=1).model_dump(mode="json"), "views")
    # live hang detection (services.storage.live) reads each rank's latest heartbeat of the current attempt within
    # its lookback, however they arrived
    attempt = max(e["attempt"] for e in sent if e["kind"] == "attempt_start")
    end = float(truth.events["time"].max())
    # ranks heart-beat only while they end no step (ingest_client): read just after the attempt's latest heartbeat,
    # then long after the end
    last_beat = max(e["time"] for e in sent if e["kind"] == "heartbeat" and e["attempt"] == attempt)
    config = LiveConfig()
    for now in (last_beat + 1.0, end + 200.0):
        newest: dict[int, float] = {}
        for e in sent:
            if e["kind"] == "heartbeat" and e["attempt"] == attempt and e["time"] >= now - config.heartbeat_lookback_s:
                newest[e["rank"]] = max(newest.get(e["rank"], e["time"]), e["time"])
        state = StoredRun(engine, run.ref).state(now, config)
        assert {r.rank: r.heartbeat_time for r in state.ranks if r.heartbeat_time is not None} == newest
        assert newest or now > last_beat + config.heartbeat_lookback_s  # the first reading sees heartbeats
