"""The run lists (`/v1/runs`, `/v1/fleet/window`) read the figures stored with each run's ledger instead of parsing
the whole ledger: for every run of a simulated fleet they are the full ledger's, to the bit (its usage pieces
too); events that arrive after they were stored, and retention, leave them right; and revision 0012 copies them out
of ledgers stored before it."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from services.analysis.live import LiveConfig
from services.analysis.run_figures import ListedFigures, listed_figures
from services.collector.app import create_app
from services.derive.cache import AnalysisCache
from services.derive.retention import prune
from services.derive.runs import RunScope, listed_runs
from services.derive.served import served_ledger
from services.simulate import SimConfig, simulate
from services.storage.runs import get_run, list_runs

CONFIG = LiveConfig()
EVERYONE = RunScope(project=None)


def fleet() -> list[dict[str, Any]]:
    """Runs of every shape the list shows: finished, failed after restarts, a straggler, and two running ones: one
    hung (its last step 70 s ago), one not (its last step is now)."""
    now = time.time()
    configs = [SimConfig(run_id="done", ranks=4, hours=0.05, mtbf_s=None, seed=1),
               SimConfig(run_id="restarts", ranks=4, hours=0.05, mtbf_s=60, seed=2, max_failures=3),
               SimConfig(run_id="failed", ranks=2, hours=0.05, mtbf_s=100, seed=3, end="failed", max_failures=2),
               SimConfig(run_id="straggler", ranks=8, hours=0.05, mtbf_s=None, seed=4, straggler_rank=3),
               SimConfig(run_id="live", ranks=4, hours=0.05, mtbf_s=None, seed=5, end="running", heartbeat_s=5.0,
                         queue_s=0.0, startup_s=5.0, start_time=now - 101.0),
               SimConfig(run_id="stalled", ranks=4, hours=0.05, mtbf_s=None, seed=6, end="running", queue_s=0.0,
                         startup_s=5.0, start_time=now - 170.0)]
    return [e for config in configs for e in simulate(config).events]


def post(client: TestClient, events: list[dict[str, Any]]) -> None:
    assert client.post("/v1/events", json={"events": events}).status_code == 200


def full_derivation(analyses: AnalysisCache, run_id: str, now: float) -> ListedFigures:
    """What the lists showed before the figures were stored: the run's whole ledger, a live hang booked."""
    with analyses.engine.connect() as conn:
        row = get_run(conn, run_id)
    return listed_figures(served_ledger(analyses, row, now, CONFIG))


def assert_same(listed: ListedFigures, expected: ListedFigures) -> None:
    assert listed.figures == expected.figures
    assert (listed.usage is None) == (expected.usage is None)
    if expected.usage is not None and listed.usage is not None:
        for name in ("start", "end", "values"):  # the same doubles, not merely close
            assert np.array_equal(getattr(listed.usage, name), getattr(expected.usage, name))
            assert getattr(listed.usage, name).tobytes() == getattr(expected.usage, name).tobytes()


def stored_figures(engine: Engine) -> dict[str, tuple[str, bytes | None]]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT run_id, figures_json, usage_bytes FROM runs WHERE figures_json IS NOT NULL"))
        return {r[0]: (r[1], None if r[2] is None else bytes(r[2])) for r in rows}


def test_every_runs_listed_figures_are_its_full_ledgers_to_the_bit(settings: Any, engine: Engine) -> None:
    with TestClient(create_app(settings, engine=engine)) as client:
        post(client, fleet())
        analyses = AnalysisCache(engine)
        now = time.time()
        with engine.connect() as conn:
            run_ids = [row.run_id for row in list_runs(conn)]
        expected = {run_id: full_derivation(analyses, run_id, now) for run_id in run_ids}
        assert set(stored_figures(engine)) == set(expected)  # stored with each ledger
        listed = listed_runs(AnalysisCache(engine), EVERYONE, budget_s=0.0, now=now, config=CONFIG,
                             with_usage=True)
        assert {r.row.run_id for r in listed} == set(expected) and not any(r.stale for r in listed)
        for run in listed:
            assert_same(run.listed, expected[run.row.run_id])
        assert expected["straggler"].figures.waste_gpu_seconds.straggler > 0  # the fleet has the shapes it claims
        assert expected["restarts"].figures.restarts > 0 and expected["live"].figures.status == "running"
        assert expected["live"].figures.provisional is None and expected["stalled"].figures.provisional is not None

        answer = client.get("/v1/runs").json()["runs"]
        for item in answer:
            figures = expected[item["run_id"]].figures
            if figures.provisional is not None:
                continue  # its hang so far grows with the clock
            assert item["allocated_gpu_seconds"] == figures.allocated_gpu_seconds
            assert item["waste_gpu_seconds"] == figures.waste_gpu_seconds.model_dump()
            assert item["goodput"] == figures.goodput and item["status"] == figures.status


def test_events_after_the_figures_were_stored_are_listed_once_the_ledger_catches_up(settings: Any,
                                                                                      engine: Engine) -> None:
    with TestClient(create_app(settings, engine=engine)) as client:
        post(client, fleet())
        analyses = AnalysisCache(engine)
        before = full_derivation(analyses, "live", time.time())
        post(client, [{"event_id": "live:end", "run_id": "live", "kind": "run_end", "time": time.time(),
                       "status": "finished"}])
        stale_figures = stored_figures(engine)["live"]
        # a new process, a budget long enough for the build: the new ledger's figures, not the stored ones
        listed = {r.row.run_id: r for r in listed_runs(AnalysisCache(engine), EVERYONE, budget_s=30.0,
                                                       now=time.time(), config=CONFIG, with_usage=True)}
        after = full_derivation(analyses, "live", time.time())
        assert after.figures.status == "finished" != before.figures.status
        assert not listed["live"].stale
        assert_same(listed["live"].listed, after)
        assert stored_figures(engine)["live"] != stale_figures  # stored with the new ledger
        # no budget: the last ledger's figures, flagged stale, while the new one is built
        post(client, [{"event_id": "live:late", "run_id": "live", "kind": "heartbeat", "time": time.time(),
                       "attempt": 0, "rank": 0}])
        listed = {r.row.run_id: r for r in listed_runs(AnalysisCache(engine), EVERYONE, budget_s=0.0,
                                                       now=time.time(), config=CONFIG)}
        assert listed["live"].stale and listed["live"].listed.figures == after.figures


def test_a_pruned_runs_listed_figures_stay_its_ledgers(settings: Any, engine: Engine) -> None:
    with TestClient(create_app(settings, engine=engine)) as client:
        post(client, [e for e in fleet() if e["run_id"] not in ("live", "stalled")])
    later = time.time() + 40 * 86_400
    result = prune(AnalysisCache(engine), retention_days=30, now=later)
    assert sorted(result.frozen) == ["done", "failed", "restarts", "straggler"]
    analyses = AnalysisCache(engine)
    listed = listed_runs(analyses, EVERYONE, budget_s=0.0, now=later, config=CONFIG, with_usage=True)
    assert len(listed) == 4 and not any(r.stale for r in listed)
    for run in listed:
        assert_same(run.listed, full_derivation(analyses, run.row.run_id, later))
