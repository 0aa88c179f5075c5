"""A run whose raw rows retention deleted keeps its page, report, advice, stragglers, resume check and metrics: they
are served from what was stored before the rows went (or built from its kept step blocks, as before), never from
what is left of its raw rows, and say it was pruned."""

from __future__ import annotations

import time
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import text

from dashboards.components import run_parts
from services.collector.app import create_app
from services.derive.cache import AnalysisCache
from services.derive.retention import prune
from services.schemas.run_view import RunView
from services.simulate import SimConfig, simulate
from services.storage.retention import ensure_partitions

PAGES = ("/v1/runs/old/waste", "/v1/runs/old/stragglers", "/v1/runs/old/resume-check", "/v1/runs/old/advice",
         "/v1/runs/old/timeline", "/v1/runs/old/ranks", "/v1/runs/old/checkpoints", "/v1/runs/old/restarts")
LATER = time.time() + 40 * 86_400  # the run has been quiet for 40 days


def count(engine: Any, *tables: str) -> int:
    with engine.connect() as conn:
        return sum(int(conn.execute(text(f"SELECT count(*) FROM {t}")).scalar() or 0) for t in tables)


def test_a_pruned_run_still_has_its_page_report_and_advice_from_stored_analyses(settings: Any, engine: Any) -> None:
    events = simulate(SimConfig(run_id="old", ranks=4, hours=0.05, mtbf_s=400, seed=5, straggler_rank=2)).events
    with TestClient(create_app(settings, engine=engine)) as client:
        assert client.post("/v1/events", json={"events": events}).status_code == 200
        before = {path: client.get(path).json() for path in PAGES}
        report_before = client.get("/v1/runs/old/report").json()

    result = prune(AnalysisCache(engine), retention_days=30, now=LATER)
    assert result.frozen == ["old"] and count(engine, "steps", "collectives") == 0
    assert count(engine, "step_blocks") > 0  # what its ledger and views are built from

    with TestClient(create_app(settings, engine=engine)) as client:  # a new process: nothing kept in memory
        after = {path: client.get(path) for path in PAGES}
        assert {p: r.status_code for p, r in after.items()} == dict.fromkeys(PAGES, 200)
        assert {p: r.json() for p, r in after.items()} == before
        report = client.get("/v1/runs/old/report").json()
        assert report["detail_pruned_at"] == LATER
        assert {k: v for k, v in report.items() if k not in ("generated_at", "detail_pruned_at")} == {
            k: v for k, v in report_before.items() if k not in ("generated_at", "detail_pruned_at")}
        html = client.get("/v1/runs/old/report?format=html").text
        assert "Raw detail pruned" in html
        view = RunView.model_validate(client.get("/v1/runs/old/view?stale_ok=true").json())
        assert view.detail_pruned_at == LATER and not view.stale
        assert view.ledger.model_dump(mode="json") == before["/v1/runs/old/waste"]
        note = run_parts.freshness_note(view)  # what the run page shows above its figures
        assert note is not None and "Raw detail pruned" in str(note.children)
        assert "not analysed" not in str(note.children)
        # what needs the raw rows says so (410), instead of answering from the part that is left
        gone = client.get("/v1/runs/old/resume-check?loss_rtol=0.5")
        assert gone.status_code == 410 and gone.json()["error"]["code"] == "run_detail_pruned"
        assert client.get("/v1/runs").status_code == 200 and client.get("/metrics").status_code == 200

        # events arriving after the prune are analysed on top of what was kept (tests/test_prune_cli.py checks the
        # figures); the page then says which of them are as of the prune
        late = [{**e, "event_id": f"late-{e['event_id']}"} for e in simulate(SimConfig(
            run_id="old", ranks=4, hours=0.01, mtbf_s=None, seed=6, start_time=time.time() - 3600)).events]
        assert client.post("/v1/events", json={"events": late}).status_code == 200
        assert client.get("/v1/runs/old/waste").json() != before["/v1/runs/old/waste"]
        view = RunView.model_validate(client.get("/v1/runs/old/view").json())
        assert view.run_version == view.version and not view.stale
        note = run_parts.freshness_note(view)
        assert note is not None and "events received since included" in str(note.children)
        assert "not analysed" not in str(note.children)
        # what reads raw rows stays as stored at the prune
        assert client.get("/v1/runs/old/stragglers").json() == before["/v1/runs/old/stragglers"]
        assert client.get("/v1/runs/old/resume-check").json() == before["/v1/runs/old/resume-check"]


def test_a_run_pruned_before_its_step_blocks_were_kept_stays_final(settings: Any, engine: Any) -> None:
    """Revision 0009 keeps a pruned run's step blocks; a run pruned before lost them with its rows: its stored
    analyses stay final, and events it receives are stored, not analysed (the page says so)."""
    events = simulate(SimConfig(run_id="old", ranks=4, hours=0.05, mtbf_s=400, seed=5)).events
    with TestClient(create_app(settings, engine=engine)) as client:
        assert client.post("/v1/events", json={"events": events}).status_code == 200
        waste = client.get("/v1/runs/old/waste").json()
    prune(AnalysisCache(engine), retention_days=30, now=LATER)
    pruned_at = time.time() - 60
    with engine.begin() as conn:  # what a prune before revision 0009 left (a minute ago)
        conn.execute(text("UPDATE runs SET detail_pruned_version = NULL, detail_pruned_at = :t"), {"t": pruned_at})
        conn.execute(text("DELETE FROM step_blocks"))
        conn.execute(text("DELETE FROM step_marks"))
        # today's partitions (dropped by the prune 40 days ahead) exist again before anything is written
        ensure_partitions(conn, now=time.time())
    with TestClient(create_app(settings, engine=engine)) as client:
        late = [{**e, "event_id": f"late-{e['event_id']}"} for e in simulate(SimConfig(
            run_id="old", ranks=4, hours=0.01, mtbf_s=None, seed=6, start_time=time.time() - 3600)).events]
        assert client.post("/v1/events", json={"events": late}).status_code == 200
        assert client.get("/v1/runs/old/waste").json() == waste
        view = RunView.model_validate(client.get("/v1/runs/old/view").json())
        assert view.run_version > view.version
        note = run_parts.freshness_note(view)
        assert note is not None and "not analysed" in str(note.children)
    # its new raw rows go at the next prune, with no analysis
    result = prune(AnalysisCache(engine), retention_days=30, now=LATER + 40 * 86_400)
    assert result.frozen == [] and count(engine, "steps", "collectives", "step_blocks", "step_marks") == 0
