"""Beside an analyst that keeps the stored analyses (GOODPUT_ANALYST=elsewhere, what `goodput serve` gives its workers
beside its analyst process), what is polled (`/v1/runs/{id}/live`, `/v1/live`, `/v1/preemption-candidates`) serves a
run's stored ledger as it is and builds none in the collector; a run page still rebuilds the run it shows. Without
one, the same poll starts the rebuild in the collector (paced), as before."""

from __future__ import annotations

import time
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from services.collector.app import create_app
from services.derive.cache import AnalysisCache
from services.derive.ledger import current_ledger, parse_stored_ledger
from services.schemas.ledger import Ledger
from services.settings import ServerSettings, ServiceSettings
from services.simulate import SimConfig, simulate
from services.storage.runs import get_run


def halves() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A running run's events: what it sent until 10 s ago, and what it sent since (the last step 6 s ago)."""
    now = time.time()
    events = simulate(SimConfig(run_id="polled", ranks=2, hours=0.02, mtbf_s=None, seed=3, end="running",
                                queue_s=0.0, startup_s=5.0, records_per_rank=10, start_time=now - 50)).events
    cut = now - 10
    return [e for e in events if e["time"] < cut], [e for e in events if e["time"] >= cut]


def stored(engine: Engine) -> tuple[int, int, Ledger | None]:
    """(the run's version, its stored ledger's version, the stored ledger)."""
    with engine.connect() as conn:
        run = get_run(conn, "polled")
    return run.version, run.ledger_version, parse_stored_ledger(run)


def collector(settings: ServiceSettings, engine: Engine, analyst: str) -> TestClient:
    server = settings.server.model_copy(update={"analyst": analyst})
    return TestClient(create_app(settings.model_copy(update={"server": server}), engine=engine))


def post(client: TestClient, events: list[dict[str, Any]]) -> None:
    assert client.post("/v1/events", json={"events": events}).status_code == 200


def test_beside_an_analyst_polls_serve_the_stored_ledger_and_a_page_rebuilds_it(settings: ServiceSettings,
                                                                                 engine: Engine) -> None:
    before, since = halves()
    with collector(settings, engine, "elsewhere") as client:
        assert client.app.state.analyses.kept_elsewhere  # type: ignore[attr-defined]
        post(client, before)
        with engine.connect() as conn:
            old = current_ledger(AnalysisCache(engine), get_run(conn, "polled"))  # what the analyst stored
        post(client, since)
        version, ledger_version, kept = stored(engine)
        assert ledger_version < version and kept == old

        live = client.get("/v1/runs/polled/live").json()
        fleet = client.get("/v1/live").json()["runs"]
        candidates = client.get("/v1/preemption-candidates").json()["candidates"]
        assert live["at_risk_gpu_seconds"] == old.at_risk_gpu_seconds > 0
        assert [r["at_risk_gpu_seconds"] for r in fleet] == [old.at_risk_gpu_seconds]
        assert [c["at_risk_gpu_seconds"] for c in candidates] == [old.at_risk_gpu_seconds]
        time.sleep(1.0)  # a build started by the polls would have stored its ledger by now (it takes ~0.1 s)
        assert stored(engine)[1:] == (ledger_version, old)

        page = client.get("/v1/runs/polled/view").json()  # someone opened the run: it is built for them
        version, ledger_version, fresh = stored(engine)
        assert ledger_version == version and fresh is not None
        assert page["ledger"]["at_risk_gpu_seconds"] == fresh.at_risk_gpu_seconds > old.at_risk_gpu_seconds
        assert client.get("/v1/runs/polled/live").json()["at_risk_gpu_seconds"] == fresh.at_risk_gpu_seconds


def test_without_an_analyst_a_poll_starts_the_rebuild(settings: ServiceSettings, engine: Engine) -> None:
    before, since = halves()
    with collector(settings, engine, "auto") as client:
        assert not client.app.state.analyses.kept_elsewhere  # type: ignore[attr-defined]
        post(client, before)
        with engine.connect() as conn:
            old = current_ledger(AnalysisCache(engine), get_run(conn, "polled"))
        post(client, since)
        client.get("/v1/live")  # serves the stored one at once (no budget), and starts the build
        deadline = time.monotonic() + 30
        while (state := stored(engine))[1] < state[0]:
            assert time.monotonic() < deadline, "the poll started no build"
            time.sleep(0.05)
        assert state[2] is not None and state[2].at_risk_gpu_seconds > old.at_risk_gpu_seconds


@pytest.mark.parametrize("analyst", ["elsewhere", "process"])
def test_a_collector_beside_an_analyst_runs_no_background_job(analyst: str, database_url: str, engine: Engine,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """GOODPUT_ANALYST=elsewhere alone: no round or retention here whatever the intervals, and a scrape rebuilds
    no ledger unless GOODPUT_METRICS_REFRESH_BUDGET_S is set."""
    monkeypatch.delenv("GOODPUT_METRICS_REFRESH_BUDGET_S", raising=False)
    server = ServerSettings.model_validate({"database_url": database_url, "analyst": analyst})
    app = create_app(ServiceSettings(server=server), engine=engine)
    settings = app.state.settings
    elsewhere = analyst == "elsewhere"
    assert (settings.server.warm_analyses_s == 0, settings.server.prune_interval_s == 0) == (elsewhere, elsewhere)
    assert (settings.metrics.refresh_budget_s == 0) == elsewhere
    assert app.state.analyses.kept_elsewhere == elsewhere
    monkeypatch.setenv("GOODPUT_METRICS_REFRESH_BUDGET_S", "2")
    app = create_app(ServiceSettings(server=server), engine=engine)
    assert app.state.settings.metrics.refresh_budget_s == 2
