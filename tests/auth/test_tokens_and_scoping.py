"""Access tokens: stored hashed, checked on every endpoint, scoped to a project; localhost only without tokens."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from services.collector.app import create_app
from services.settings import ServerSettings, ServiceSettings
from services.storage.tables import ApiToken
from services.storage.tokens import create_token, parse_token, revoke_token

T = 1_700_000_000.0
REMOTE = ("192.0.2.77", 40000)


def step(run_id: str, i: int = 1) -> dict[str, Any]:
    return {"event_id": f"{run_id}-s{i}", "run_id": run_id, "kind": "step", "time": T + i, "attempt": 0,
            "rank": 0, "step": i, "start": T + i - 1, "end": T + i}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def app(database_url: str, engine):
    server = ServerSettings(database_url=database_url, serve_dashboard=False, auth_cache_ttl_s=0)
    settings = ServiceSettings(server=server)
    return create_app(settings, engine=engine)


@pytest.fixture
def local(app) -> Iterator[TestClient]:
    with TestClient(app) as c:
        yield c


@pytest.fixture
def remote(app) -> Iterator[TestClient]:
    with TestClient(app, client=REMOTE) as c:
        yield c


@pytest.fixture
def tokens(engine) -> dict[str, str]:
    out = {}
    with engine.begin() as conn:
        for key, kind, project in (("wa", "write", "alpha"), ("ra", "read", "alpha"), ("wb", "write", "beta"),
                                   ("rb", "read", "beta"), ("rall", "read", "*")):
            out[key], _ = create_token(conn, kind=kind, project=project, name=key)
    return out


# -- the token itself -------------------------------------------------------------------------------------------


def test_token_has_a_recognisable_prefix_and_only_a_salted_hash_is_stored(engine) -> None:
    with engine.begin() as conn:
        write, info = create_token(conn, kind="write", project="alpha")
        read, _ = create_token(conn, kind="read", project="alpha")
    assert write.startswith(f"gpw_{info.token_id}_") and read.startswith("gpr_")
    parsed = parse_token(write)
    assert parsed is not None
    kind, token_id, secret = parsed
    assert (kind, token_id) == ("write", info.token_id)
    with engine.connect() as conn:
        rows = conn.execute(select(ApiToken)).all()
    stored = " ".join(str(v) for row in rows for v in row._mapping.values())
    assert secret not in stored and write not in stored
    salts = {row._mapping["salt"] for row in rows}
    assert len(salts) == 2  # one salt per token


def test_project_names_and_kinds_are_checked(engine) -> None:
    with engine.begin() as conn:
        for kind, project, words in (("write", "*", "read tokens only"), ("read", "a b", "project must be"),
                                     ("admin", "alpha", "kind must be"), ("read", "", "project must be")):
            with pytest.raises(ValueError, match=words):
                create_token(conn, kind=kind, project=project)


# -- no tokens: localhost only ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path"), [("POST", "/v1/events"), ("GET", "/v1/runs"), ("GET", "/healthz"),
                                              ("GET", "/metrics"), ("GET", "/v1/runs/x/waste"),
                                              ("GET", "/v1/live"), ("GET", "/v1/reports/fleet.csv")])
def test_without_tokens_a_remote_client_is_refused_with_a_clear_message(remote, method, path) -> None:
    response = remote.request(method, path, json={"events": [step("r")]} if method == "POST" else None)
    assert response.status_code == 403, response.text
    error = response.json()["error"]
    assert error["code"] == "auth_not_configured"
    assert "192.0.2.77" in error["message"] and "goodput token create" in error["message"]


def test_without_tokens_localhost_may_write_and_read(local) -> None:
    assert local.post("/v1/events", json={"events": [step("r")]}).status_code == 200
    assert local.get("/v1/runs").json()["count"] == 1
    assert local.get("/metrics").status_code == 200
    assert local.get("/healthz").status_code == 200


# -- tokens: authentication -------------------------------------------------------------------------------------


@pytest.mark.parametrize("client_name", ["local", "remote"])
def test_once_a_token_exists_every_client_needs_one(request, tokens, client_name) -> None:
    c = request.getfixturevalue(client_name)
    for method, path in (("POST", "/v1/events"), ("GET", "/v1/runs"), ("GET", "/v1/runs/r/waste"),
                         ("GET", "/metrics"), ("GET", "/v1/live")):
        response = c.request(method, path, json={"events": [step("r")]} if method == "POST" else None)
        assert response.status_code == 401, (path, response.text)
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
        assert "goodput token create" in response.json()["error"]["message"]
    assert c.get("/healthz").status_code == 200  # probes need no token once tokens exist


@pytest.mark.parametrize("bad", ["nonsense", "gpw_000000000000_" + "A" * 43, "Bearer", "gpr_zz_short"])
def test_malformed_and_unknown_tokens_get_401(remote, tokens, bad) -> None:
    response = remote.post("/v1/events", json={"events": [step("r")]}, headers=bearer(bad))
    assert response.status_code == 401, response.text


def test_a_wrong_secret_or_a_swapped_prefix_gets_401(remote, tokens) -> None:
    wa = tokens["wa"]
    wrong_secret = wa[:-4] + ("AAAA" if not wa.endswith("AAAA") else "BBBB")
    swapped = "gpr" + wa[3:]  # a write token presented as a read token
    assert remote.post("/v1/events", json={"events": [step("r")]}, headers=bearer(wrong_secret)).status_code == 401
    assert remote.get("/v1/runs", headers=bearer(swapped)).status_code == 401
    assert remote.post("/v1/events", json={"events": [step("r")]}, headers=bearer(wa)).status_code == 200


def test_a_revoked_token_stops_working(remote, tokens, engine) -> None:
    assert remote.post("/v1/events", json={"events": [step("r")]}, headers=bearer(tokens["wa"])).status_code == 200
    parsed = parse_token(tokens["wa"])
    assert parsed is not None
    with engine.begin() as conn:
        assert revoke_token(conn, parsed[1])
        assert not revoke_token(conn, parsed[1])
    response = remote.post("/v1/events", json={"events": [step("r", 2)]}, headers=bearer(tokens["wa"]))
    assert response.status_code == 401 and "revoked" in response.json()["error"]["message"]


def test_http_basic_with_the_token_as_password_is_accepted(remote, tokens) -> None:
    basic = base64.b64encode(f"anyone:{tokens['rall']}".encode()).decode()
    assert remote.get("/v1/runs", headers={"Authorization": f"Basic {basic}"}).status_code == 200


def test_each_kind_does_only_its_job(remote, tokens) -> None:
    response = remote.post("/v1/events", json={"events": [step("r")]}, headers=bearer(tokens["ra"]))
    assert response.status_code == 403 and "write token" in response.json()["error"]["message"]
    assert remote.post("/v1/events", json={"events": [step("r")]}, headers=bearer(tokens["wa"])).status_code == 200
    response = remote.get("/v1/runs", headers=bearer(tokens["wa"]))
    assert response.status_code == 403 and "read token" in response.json()["error"]["message"]
    assert remote.get("/v1/runs/r/waste", headers=bearer(tokens["wa"])).status_code == 403


# -- project scoping --------------------------------------------------------------------------------------------


def test_write_tokens_stamp_their_project_and_write_only_into_their_projects_runs(remote, tokens, engine) -> None:
    from services.storage.tables import Run

    assert remote.post("/v1/events", json={"events": [step("a-run")]}, headers=bearer(tokens["wa"])).status_code == 200
    assert remote.post("/v1/events", json={"events": [step("b-run")]}, headers=bearer(tokens["wb"])).status_code == 200
    with engine.connect() as conn:
        assert dict(conn.execute(select(Run.run_id, Run.project)).all()) == {"a-run": "alpha", "b-run": "beta"}
    # beta's token names alpha's run id: that is beta's own run of that id, alpha's is untouched
    response = remote.post("/v1/events", json={"events": [step("b-run", 2), step("a-run", 2)]},
                           headers=bearer(tokens["wb"]))
    assert response.status_code == 200, response.text
    with engine.connect() as conn:
        assert sorted(conn.execute(select(Run.project, Run.run_id)).all()) == [
            ("alpha", "a-run"), ("beta", "a-run"), ("beta", "b-run")]
    ra, rb = bearer(tokens["ra"]), bearer(tokens["rb"])
    assert remote.get("/v1/runs/b-run", headers=rb).json()["last_step"] == 2
    assert remote.get("/v1/runs/a-run", headers=rb).json()["last_step"] == 2  # beta's a-run: only its step 2
    assert remote.get("/v1/runs/a-run", headers=ra).json()["last_step"] == 1  # alpha's a-run: only its step 1


def test_read_tokens_see_only_their_project_and_other_runs_look_absent(remote, tokens) -> None:
    remote.post("/v1/events", json={"events": [step("a-run")]}, headers=bearer(tokens["wa"]))
    remote.post("/v1/events", json={"events": [step("b-run")]}, headers=bearer(tokens["wb"]))
    ra, rall = bearer(tokens["ra"]), bearer(tokens["rall"])
    assert [r["run_id"] for r in remote.get("/v1/runs", headers=ra).json()["runs"]] == ["a-run"]
    assert {r["run_id"] for r in remote.get("/v1/runs", headers=rall).json()["runs"]} == {"a-run", "b-run"}
    missing = remote.get("/v1/runs/no-such-run/waste", headers=ra)
    for suffix in ("", "/waste", "/timeline", "/ranks", "/checkpoints", "/restarts", "/view", "/live", "/advice",
                   "/report", "/signals", "/checkpoint-request", "/stragglers"):
        response = remote.get(f"/v1/runs/b-run{suffix}", headers=ra)
        assert response.status_code == 404, (suffix, response.text)
        assert response.json()["error"]["code"] == missing.json()["error"]["code"] == "run_not_found"
        assert remote.get(f"/v1/runs/a-run{suffix}", headers=ra).status_code == 200, suffix
    fleet = remote.get("/v1/reports/fleet.csv", headers=ra).text
    assert "a-run" in fleet and "b-run" not in fleet
    assert all(r["run_id"] == "a-run" for r in remote.get("/v1/live", headers=ra).json()["runs"])


def test_a_write_token_polls_its_own_runs_signals_only(remote, tokens) -> None:
    remote.post("/v1/events", json={"events": [step("a-run")]}, headers=bearer(tokens["wa"]))
    assert remote.get("/v1/runs/a-run/signals", headers=bearer(tokens["wa"])).status_code == 200
    assert remote.get("/v1/runs/a-run/signals", headers=bearer(tokens["wb"])).status_code == 404
    assert remote.post("/v1/runs/a-run/checkpoint-request", json={}, headers=bearer(tokens["wb"])).status_code == 404
    assert remote.post("/v1/runs/a-run/checkpoint-request", json={}, headers=bearer(tokens["wa"])).status_code == 201


def test_metrics_span_the_fleet_and_need_a_read_token_of_every_project(remote, tokens) -> None:
    response = remote.get("/metrics", headers=bearer(tokens["ra"]))
    assert response.status_code == 403 and "'*'" in response.json()["error"]["message"]
    assert remote.get("/metrics", headers=bearer(tokens["wa"])).status_code == 403
    assert remote.get("/metrics", headers=bearer(tokens["rall"])).status_code == 200
