"""A stored ledger or views document that no longer matches the models (written by another version of goodput,
before an upgrade) is built again from the events: every page answers, with the same figures, and none is a 500."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from services.collector.app import create_app
from services.simulate import SimConfig, simulate
from services.storage.tables import Run, RunViews

OLD_SHAPE = '{"run_id": "upgraded", "status": "finished", "allocated_gpu_seconds": 1.0}'


def test_an_old_stored_analysis_is_built_again(settings: Any, engine: Any, caplog: pytest.LogCaptureFixture) -> None:
    events = simulate(SimConfig(run_id="upgraded", ranks=2, hours=0.02, mtbf_s=None, seed=3)).events
    with TestClient(create_app(settings, engine=engine)) as client:
        assert client.post("/v1/events", json={"events": events}).status_code == 200
        before = {path: client.get(path).json() for path in ("/v1/runs/upgraded/waste", "/v1/runs/upgraded/timeline")}
    with engine.begin() as conn:
        assert conn.execute(update(Run).values(ledger_json=OLD_SHAPE)).rowcount == 1
        assert conn.execute(update(RunViews).values(views_json=OLD_SHAPE)).rowcount == 1

    caplog.set_level(logging.WARNING, logger="services.derive.ledger")
    with TestClient(create_app(settings, engine=engine)) as client:  # a new process: nothing cached in memory
        answers = {path: client.get(path) for path in (
            "/v1/runs", "/metrics", "/v1/runs/upgraded/view?stale_ok=true", "/v1/runs/upgraded/waste",
            "/v1/runs/upgraded/timeline", "/v1/runs/upgraded/advice")}
        assert {path: r.status_code for path, r in answers.items()} == dict.fromkeys(answers, 200)
        assert answers["/v1/runs/upgraded/waste"].json() == before["/v1/runs/upgraded/waste"]
        assert answers["/v1/runs/upgraded/timeline"].json() == before["/v1/runs/upgraded/timeline"]
        assert answers["/v1/runs/upgraded/view?stale_ok=true"].json()["ledger"] == before["/v1/runs/upgraded/waste"]
    said = [r.getMessage() for r in caplog.records]
    assert any("stored ledger of run upgraded does not match this version of goodput" in m for m in said), said
