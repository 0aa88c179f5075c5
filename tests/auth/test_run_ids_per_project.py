"""A run is identified by (project, run id): project A squatting B's run id changes nothing for B.

The attack (issue 11): A's write token posts one `run_submitted` for `llm-exp-42` before B's job starts. With run
ids global, every later batch of B for that run was refused (403, and B's client dropped it) and the 403 told A
that B's run existed. Now each project has its own run of that id; neither sees nor affects the other's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from services.collector.app import create_app
from services.settings import ServerSettings, ServiceSettings
from services.storage.tokens import create_token

T = 1_700_000_000.0
REMOTE = ("192.0.2.77", 40000)
RUN = "llm-exp-42"
ONE_RUN_ROUTES = ("", "/waste", "/timeline", "/ranks", "/checkpoints", "/restarts", "/view", "/live", "/advice",
                  "/report", "/signals", "/checkpoint-request", "/stragglers", "/resume-check")


def b_job(n_steps: int) -> list[dict[str, Any]]:
    """Project B's real job: 2 GPUs, 2 ranks, n steps each, finished."""
    events: list[dict[str, Any]] = [
        {"event_id": "b-alloc", "run_id": RUN, "kind": "allocation_start", "time": T, "gpus": 2},
    ]
    for rank in (0, 1):
        events.append({"event_id": f"b-start-{rank}", "run_id": RUN, "kind": "attempt_start", "time": T + 1,
                       "attempt": 0, "rank": rank, "world_size": 2, "host": "b-host"})
        events.append({"event_id": f"b-steps-{rank}", "run_id": RUN, "kind": "steps", "time": T + 2 + n_steps,
                       "attempt": 0, "rank": rank, "step": list(range(1, n_steps + 1)),
                       "start": [T + 1 + s for s in range(1, n_steps + 1)],
                       "end": [T + 2 + s for s in range(1, n_steps + 1)]})
    return events


def b_end(n_steps: int) -> list[dict[str, Any]]:
    end = T + 3 + n_steps
    return [*({"event_id": f"b-end-{rank}", "run_id": RUN, "kind": "attempt_end", "time": end, "attempt": 0,
               "rank": rank, "reason": "completed"} for rank in (0, 1)),
            {"event_id": "b-run-end", "run_id": RUN, "kind": "run_end", "time": end, "status": "finished"}]


def squat() -> list[dict[str, Any]]:
    """A's one event: it claims the run id before B's job starts (the same event id B's launcher might use)."""
    return [{"event_id": "launch-run_submitted", "run_id": RUN, "kind": "run_submitted", "time": T - 3600.0,
             "job_id": "squatter"}]


@pytest.fixture
def app(database_url: str, engine):
    server = ServerSettings(database_url=database_url, serve_dashboard=False, auth_cache_ttl_s=0)
    return create_app(ServiceSettings(server=server), engine=engine)


@pytest.fixture
def remote(app) -> Iterator[TestClient]:
    with TestClient(app, client=REMOTE) as c:
        yield c


@pytest.fixture
def tokens(engine) -> dict[str, dict[str, str]]:
    out = {}
    with engine.begin() as conn:
        for key, kind, project in (("wa", "write", "alpha"), ("ra", "read", "alpha"), ("wb", "write", "beta"),
                                   ("rb", "read", "beta"), ("rall", "read", "*")):
            token, _ = create_token(conn, kind=kind, project=project, name=key)
            out[key] = {"Authorization": f"Bearer {token}"}
    return out


def test_project_a_squatting_bs_run_id_changes_nothing_for_b(remote, tokens) -> None:
    wa, ra, wb, rb = tokens["wa"], tokens["ra"], tokens["wb"], tokens["rb"]
    assert remote.post("/v1/events", json={"events": squat()}, headers=wa).status_code == 200

    # B's batches are all stored: none is refused for the squatted id
    for batch in (b_job(5), b_end(5)):
        response = remote.post("/v1/events", json={"events": batch}, headers=wb)
        assert response.status_code == 200, response.text
        assert response.json()["duplicates"] == 0
    # B's checkpoint request and its client's poll (write token) reach B's run
    assert remote.post(f"/v1/runs/{RUN}/checkpoint-request", json={"reason": "b's scheduler"},
                       headers=wb).status_code == 201
    assert remote.get(f"/v1/runs/{RUN}/signals", headers=wb).json()["checkpoint_request"]["reason"] == "b's scheduler"

    # B reads exactly its own job: 2 GPUs x 8 s allocated (T .. T+8), 5 steps, finished; A's submission is not in it
    detail = remote.get(f"/v1/runs/{RUN}", headers=rb).json()
    assert (detail["status"], detail["last_step"], detail["world_sizes"]) == ("finished", 5, [2])
    assert detail["project"] == "beta"
    waste = remote.get(f"/v1/runs/{RUN}/waste", headers=rb).json()
    assert waste["allocated_gpu_seconds"] == pytest.approx(2 * 8.0, rel=1e-9)
    assert waste["productive_gpu_seconds"] + sum(waste["waste_gpu_seconds"].values()) == pytest.approx(
        waste["allocated_gpu_seconds"], rel=1e-9)
    assert waste["queue_seconds"] == 0.0  # A's run_submitted (an hour earlier) would have made it 3600
    listed = remote.get("/v1/runs", headers=rb).json()["runs"]
    assert [(r["run_id"], r["project"]) for r in listed] == [(RUN, "beta")]

    # A sees only its own run of that id: one run_submitted, nothing allocated, no steps, no request
    a_responses = {suffix: remote.get(f"/v1/runs/{RUN}{suffix}", headers=ra) for suffix in ONE_RUN_ROUTES}
    a_responses["list"] = remote.get("/v1/runs", headers=ra)
    a_responses["live"] = remote.get("/v1/live", headers=ra)
    a_responses["fleet"] = remote.get("/v1/reports/fleet.csv", headers=ra)
    a_responses["candidates"] = remote.get("/v1/preemption-candidates", headers=ra)
    a_responses["poll"] = remote.get(f"/v1/runs/{RUN}/signals", headers=wa)
    a_responses["asks for beta"] = remote.get(f"/v1/runs/{RUN}?project=beta", headers=ra)
    a_responses["lists beta"] = remote.get("/v1/runs?project=beta", headers=ra)
    for name, response in a_responses.items():
        text = response.text
        assert "beta" not in text and "b-host" not in text and "b's scheduler" not in text, (name, text[:300])
        if name != "asks for beta":
            assert response.status_code in (200, 202), (name, response.status_code, text[:300])
    a_detail = a_responses[""].json()
    assert (a_detail["project"], a_detail["status"], a_detail["last_step"], a_detail["attempts"]) == (
        "alpha", "running", None, [])
    assert a_responses["/waste"].json()["allocated_gpu_seconds"] == 0.0
    assert a_responses["poll"].json()["checkpoint_request"] is None
    assert a_responses["/checkpoint-request"].json()["requests"] == []
    # asking for B's project by name looks exactly like asking for a run that does not exist
    missing = remote.get("/v1/runs/no-such-run", headers=ra)
    assert a_responses["asks for beta"].status_code == missing.status_code == 404
    assert a_responses["asks for beta"].json()["error"]["code"] == missing.json()["error"]["code"]
    assert a_responses["lists beta"].json() == {"runs": [], "count": 0}

    # A writing to the id again changes nothing for B either
    assert remote.post("/v1/events", json={"events": [{**squat()[0], "event_id": "a-2", "time": T + 4}]},
                       headers=wa).status_code == 200
    assert remote.get(f"/v1/runs/{RUN}/waste", headers=rb).json() == waste


def test_a_reader_of_every_project_names_the_project_when_several_use_the_run_id(remote, tokens) -> None:
    rall = tokens["rall"]
    assert remote.post("/v1/events", json={"events": squat()}, headers=tokens["wa"]).status_code == 200
    assert remote.get(f"/v1/runs/{RUN}", headers=rall).json()["project"] == "alpha"  # one project has it
    assert remote.post("/v1/events", json={"events": b_job(3)}, headers=tokens["wb"]).status_code == 200

    for suffix in ONE_RUN_ROUTES:
        ambiguous = remote.get(f"/v1/runs/{RUN}{suffix}", headers=rall)
        assert ambiguous.status_code == 409, (suffix, ambiguous.text)
        error = ambiguous.json()["error"]
        assert error["code"] == "run_in_several_projects" and error["projects"] == ["alpha", "beta"]
        assert "?project=" in error["message"]
    assert remote.get(f"/v1/runs/{RUN}?project=beta", headers=rall).json()["last_step"] == 3
    assert remote.get(f"/v1/runs/{RUN}?project=alpha", headers=rall).json()["last_step"] is None
    assert remote.get(f"/v1/runs/{RUN}?project=gamma", headers=rall).status_code == 404

    runs = remote.get("/v1/runs", headers=rall).json()["runs"]
    assert sorted((r["run_id"], r["project"]) for r in runs) == [(RUN, "alpha"), (RUN, "beta")]
    assert [r["project"] for r in remote.get("/v1/runs?project=beta", headers=rall).json()["runs"]] == ["beta"]
    fleet = remote.get("/v1/reports/fleet.csv", headers=rall).text.splitlines()
    assert fleet[0].startswith("run_id,project,") and sorted(line.split(",")[1] for line in fleet[1:]) == [
        "alpha", "beta"]
    live = remote.get("/v1/live", headers=rall).json()["runs"]
    assert sorted(r["project"] for r in live) == ["alpha", "beta"]
    assert [r["project"] for r in remote.get("/v1/live?project=alpha", headers=rall).json()["runs"]] == ["alpha"]
    candidates = remote.get("/v1/preemption-candidates", headers=rall).json()["candidates"]
    assert sorted((c["run_id"], c["project"]) for c in candidates) == [(RUN, "alpha"), (RUN, "beta")]

    metrics = remote.get("/metrics", headers=rall).text
    series = [line for line in metrics.splitlines() if line.startswith("goodput_run_allocated_gpu_seconds{")]
    assert sorted('project="alpha"' in s or 'project="beta"' in s for s in series) == [True, True]
    assert len(series) == 2  # one series per (project, run id): equal run ids do not collide


def test_local_clients_without_tokens_write_to_project_default_and_read_every_project(database_url, engine) -> None:
    server = ServerSettings(database_url=database_url, serve_dashboard=False, auth_cache_ttl_s=0)
    app = create_app(ServiceSettings(server=server), engine=engine)
    with TestClient(app) as local:
        assert local.post("/v1/events", json={"events": b_job(2)}).status_code == 200
        assert local.get(f"/v1/runs/{RUN}").json()["project"] == "default"
        with engine.begin() as conn:  # a token of another project (the first token turns authentication on)
            token, _ = create_token(conn, kind="write", project="alpha")
        assert local.post("/v1/events", json={"events": squat()},
                          headers={"Authorization": f"Bearer {token}"}).status_code == 200
        with engine.begin() as conn:
            read_all, _ = create_token(conn, kind="read", project="*")
        response = local.get(f"/v1/runs/{RUN}", headers={"Authorization": f"Bearer {read_all}"})
        assert response.status_code == 409 and response.json()["error"]["projects"] == ["alpha", "default"]


def test_a_malformed_project_or_run_id_is_refused_cleanly_never_a_server_error(remote, tokens) -> None:
    assert remote.post("/v1/events", json={"events": squat()}, headers=tokens["wa"]).status_code == 200
    for headers in (tokens["rall"], tokens["ra"]):
        for path in (f"/v1/runs/{RUN}/waste?project=%00", "/v1/runs?project=a%20b", "/v1/live?project=%00"):
            response = remote.get(path, headers=headers)
            assert response.status_code == 422 and response.json()["error"]["field"] == "query.project", path
        response = remote.get("/v1/runs/a%00b/waste", headers=headers)  # no run id holds a control character
        assert response.status_code == 404 and response.json()["error"]["code"] == "run_not_found"
