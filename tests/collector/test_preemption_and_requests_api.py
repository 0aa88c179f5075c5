"""GET /v1/preemption-candidates and checkpoint requests (POST/GET .../checkpoint-request, GET .../signals)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from services.analysis.preemption import preemption_cost
from services.schemas.ledger import Ledger
from tests.collector.test_live_api import post, running_sim


def test_running_runs_are_ordered_by_what_a_preemption_would_destroy(client) -> None:
    # All stopped 3 steps after a checkpoint: at risk = 3 steps x ranks; restart = startup (60 s; 300 s for mid)
    # x GPUs. mid (8 GPUs, slow start: ~2,500 GPU-s) costs more than wide (16 GPUs: ~1,150 GPU-s).
    post(client, running_sim("small", stopped_ago_s=5.0, ranks=2))
    post(client, running_sim("wide", stopped_ago_s=5.0, ranks=16))
    post(client, running_sim("mid", stopped_ago_s=5.0, ranks=8, startup_s=300.0))
    answer = client.get("/v1/preemption-candidates").json()
    candidates = answer["candidates"]
    assert [c["run_id"] for c in candidates] == ["small", "wide", "mid"]
    costs = [c["cost_gpu_seconds"] for c in candidates]
    assert costs == sorted(costs)
    for c in candidates:
        ledger = Ledger.model_validate(client.get(f"/v1/runs/{c['run_id']}/waste").json())
        assert c == {**preemption_cost(ledger).model_dump(), "project": "default", "hung": False,
                     "pending_checkpoint_request": None}
        assert c["cost_gpu_seconds"] == pytest.approx(c["at_risk_gpu_seconds"] + c["restart_gpu_seconds"])
        assert c["at_risk_gpu_seconds"] > 0 and c["restart_basis"] == "first_startup"
    mid = next(c for c in candidates if c["run_id"] == "mid")
    assert mid["restart_seconds"] == pytest.approx(300.0) and mid["gpus"] == 8


def test_a_finished_run_is_no_candidate(client) -> None:
    from services.simulate import SimConfig, simulate

    post(client, simulate(SimConfig(run_id="done", ranks=2, hours=0.01, mtbf_s=None, seed=2)).events)
    assert client.get("/v1/preemption-candidates").json()["candidates"] == []


def checkpoint_end(run_id: str, n: int, step: int, request_id: int | None, ok: bool = True) -> dict[str, Any]:
    event = {"event_id": f"ck-{n}", "run_id": run_id, "kind": "checkpoint_end", "time": time.time(), "attempt": 0,
             "rank": 0, "step": step, "ok": ok}
    if request_id is not None:
        event["request_id"] = request_id
    return event


def test_a_checkpoint_request_is_signalled_until_a_checkpoint_carrying_its_id_ends(client) -> None:
    post(client, running_sim("job", stopped_ago_s=1.0))
    assert client.get("/v1/runs/job/signals").json()["checkpoint_request"] is None
    made = client.post("/v1/runs/job/checkpoint-request", json={"reason": "preempt", "requested_by": "slurm"})
    assert made.status_code == 201
    request = made.json()
    assert request["pending"] and request["reason"] == "preempt" and request["fulfilled_step"] is None
    signal = client.get("/v1/runs/job/signals").json()["checkpoint_request"]
    assert signal["id"] == request["id"]
    candidates = client.get("/v1/preemption-candidates").json()["candidates"]
    assert candidates[0]["pending_checkpoint_request"] == request["id"]

    post(client, [checkpoint_end("job", 1, 30, None), checkpoint_end("job", 2, 31, request["id"], ok=False)])
    assert client.get("/v1/runs/job/signals").json()["checkpoint_request"]["id"] == request["id"]
    post(client, [checkpoint_end("job", 3, 32, request["id"])])
    assert client.get("/v1/runs/job/signals").json()["checkpoint_request"] is None
    (done,) = client.get("/v1/runs/job/checkpoint-request").json()["requests"]
    assert done["pending"] is False and done["fulfilled_step"] == 32 and done["fulfilled_at"] is not None


def test_checkpoint_requests_for_unknown_runs_are_404(client) -> None:
    assert client.post("/v1/runs/nope/checkpoint-request", json={}).status_code == 404
    assert client.get("/v1/runs/nope/signals").status_code == 404
    post(client, running_sim("job", stopped_ago_s=1.0))
    assert client.post("/v1/runs/job/checkpoint-request").status_code == 201  # no body at all
    assert client.post("/v1/runs/job/checkpoint-request", json={"bogus": 1}).status_code == 422
