"""The background analyst keeps changed runs analysed, watched runs first, within its share of time."""

from __future__ import annotations

import time
from typing import Any

from services.derive.analyst import WarmAnalyses
from services.derive.ledger import LEDGER
from services.derive.views import VIEWS, current_views
from services.simulate import SimConfig, simulate
from services.storage.run_views import load_views
from services.storage.runs import get_run


def post(client: Any, run_id: str, seed: int) -> None:
    events = simulate(SimConfig(run_id=run_id, ranks=2, hours=0.02, mtbf_s=None, seed=seed)).events
    assert client.post("/v1/events", json={"events": events}).status_code == 200


def stored_version(engine: Any, run_id: str) -> int | None:
    with engine.connect() as conn:
        stored = load_views(conn, get_run(conn, run_id).pk)
    return stored.version if stored is not None else None


def test_changed_runs_are_analysed_in_the_background_watched_ones_first(client: Any, engine: Any) -> None:
    for i, run_id in enumerate(("quiet", "watched", "other")):
        post(client, run_id, seed=i)
    analyses = client.app.state.analyses
    warm = WarmAnalyses(analyses, interval_s=60.0)
    with engine.connect() as conn:
        pks = {run_id: get_run(conn, run_id).pk for run_id in ("quiet", "watched", "other")}
    analyses.note_watched(pks["watched"])
    order = warm.candidates()
    assert order[0] == pks["watched"] and set(order) == set(pks.values())

    assert warm.run_once() == 3
    assert warm.candidates() == []  # nothing changed since
    for run_id in pks:
        with engine.connect() as conn:
            assert stored_version(engine, run_id) == get_run(conn, run_id).version
        fresh = client.get(f"/v1/runs/{run_id}/view", params={"stale_ok": "true"}).json()
        assert fresh["stale"] is False and fresh["ledger"] == client.get(f"/v1/runs/{run_id}/waste").json()


def test_a_round_stops_when_its_share_of_time_is_spent(client: Any, engine: Any) -> None:
    for i in range(3):
        post(client, f"run-{i}", seed=i)
    # zero share: the deadline has passed before the first build
    analyses = client.app.state.analyses
    assert WarmAnalyses(analyses, interval_s=60.0, share=0.0).run_once() == 0
    assert len(WarmAnalyses(analyses, interval_s=60.0).candidates()) == 3


def test_serve_analyses_in_the_background_by_default(database_url: str) -> None:
    from fastapi.testclient import TestClient

    from services.collector.app import create_app
    from services.settings import ServerSettings, ServiceSettings
    from services.storage.db import make_engine
    from services.storage.migrate import upgrade

    assert ServiceSettings().server.warm_analyses_s == 15.0
    engine = make_engine(database_url)
    upgrade(engine)
    settings = ServiceSettings(server=ServerSettings(database_url=database_url, serve_dashboard=False,
                                                     warm_analyses_s=0.2))
    with TestClient(create_app(settings, engine=engine)) as client:
        post(client, "bg", seed=5)
        deadline = time.monotonic() + 30
        while stored_version(engine, "bg") is None:
            assert time.monotonic() < deadline, "the run was never analysed in the background"
            time.sleep(0.1)
    engine.dispose()


def test_one_collector_process_at_a_time_runs_a_round(client: Any, engine: Any) -> None:
    from sqlalchemy import text

    from services.derive.analyst import ROUND_LOCK

    post(client, "locked", seed=7)
    warm = WarmAnalyses(client.app.state.analyses, interval_s=60.0)
    if engine.dialect.name != "postgresql":
        assert warm.run_once() == 1  # SQLite: one process, no lock
        return
    with engine.connect() as other:  # another collector process's analyst is mid-round
        assert other.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": ROUND_LOCK}).scalar()
        assert warm.run_once() == 0 and stored_version(engine, "locked") is None
        other.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": ROUND_LOCK})
    assert warm.run_once() == 1 and stored_version(engine, "locked") is not None


def test_a_stale_stored_build_is_left_unread_where_only_a_current_one_will_do(client: Any, engine: Any) -> None:
    post(client, "stale", seed=5)
    analyses = client.app.state.analyses
    with engine.connect() as conn:
        run = get_run(conn, "stale")
    analysed = current_views(analyses, run)
    assert analysed.version == run.version
    with engine.connect() as conn:
        current, newer = load_views(conn, run.pk, run.version), load_views(conn, run.pk, run.version + 1)
    assert current is not None and current.views_json is not None and current.ledger_json is not None
    assert newer is not None and (newer.version, newer.views_json, newer.ledger_json) == (run.version, None, None)
    assert VIEWS.stored is not None and LEDGER.stored is not None
    assert VIEWS.stored(analyses, run, run.version + 1) is None  # what `current` asks when the run moved on
    kept = VIEWS.stored(analyses, run, -1)  # what a stale answer (`recent`) reads
    assert kept is not None and kept.value == analysed
    with engine.connect() as conn:
        run = get_run(conn, "stale")  # with the ledger the build stored
    assert LEDGER.stored(analyses, run, run.version + 1) is None
    ledger = LEDGER.stored(analyses, run, run.version)
    assert ledger is not None and ledger.value == analysed.ledger
