"""The dashboard's read endpoints on the collector, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from services.simulate import SimConfig, simulate


def send(client, config: SimConfig) -> None:
    events = simulate(config).events
    for i in range(0, len(events), 500):
        assert client.post("/v1/events", json={"events": events[i:i + 500]}).status_code == 200


def test_view_endpoints_serve_one_version_of_the_run(client) -> None:
    send(client, SimConfig(run_id="team/run-1", ranks=4, hours=0.1, mtbf_s=200, straggler_rank=2, seed=3))
    view = client.get("/v1/runs/team/run-1/view").json()
    assert view["run_id"] == "team/run-1" and view["version"] >= 1
    for path, keys in {"timeline": ("timeline", "progress"), "ranks": ("ranks",),
                       "checkpoints": ("checkpoints", "checkpoints_total"), "restarts": ("restarts",)}.items():
        body = client.get(f"/v1/runs/team/run-1/{path}").json()
        assert body["version"] == view["version"]
        for key in keys:
            assert body[key] == view[key]
    ledger = client.get("/v1/runs/team/run-1/waste").json()
    assert len(view["restarts"]) == ledger["restarts"]
    assert client.get("/v1/runs/team/run-1").json()["run_id"] == "team/run-1"  # the detail route still answers


def test_live_uses_the_servers_clock_and_lists_running_runs(client) -> None:
    send(client, SimConfig(run_id="live", ranks=2, hours=0.05, mtbf_s=None, end="running"))
    send(client, SimConfig(run_id="done", ranks=2, hours=0.02, mtbf_s=None))
    live = client.get("/v1/runs/live/live").json()
    assert live["status"] == "running"
    assert live["seconds_since_progress"] == pytest.approx(live["server_time"] - live["last_progress_time"])
    assert live["possibly_hung"] is True  # the simulated run stopped in 2026-01-01
    fleet = client.get("/v1/live").json()
    assert [r["run_id"] for r in fleet["runs"]] == ["live"]


def test_new_events_make_the_views_stale(client) -> None:
    config = SimConfig(run_id="grow", ranks=2, hours=0.05, mtbf_s=None)
    events = simulate(config).events
    half = len(events) // 2
    assert client.post("/v1/events", json={"events": events[:half]}).status_code == 200
    first = client.get("/v1/runs/grow/view").json()
    assert client.post("/v1/events", json={"events": events[half:]}).status_code == 200
    second = client.get("/v1/runs/grow/view").json()
    assert second["version"] > first["version"]
    assert second["status"] == "finished"


def test_unknown_run_is_a_404_with_the_usual_error_body(client) -> None:
    response = client.get("/v1/runs/nope/view")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "run_not_found"
