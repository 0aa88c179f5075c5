"""A standalone dashboard (`python -m dashboards`, as docker-compose runs it) asks every browser to sign in.

Real processes: `goodput serve` and `python -m dashboards --host 0.0.0.0`; the "remote" browser is this machine's
own non-loopback address, so the dashboard sees a non-loopback peer.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.auth.test_serve_with_tokens import _non_loopback_address
from tests.test_cli import GOODPUT, REPO, env_with, free_port, wait_healthy

T = 1_700_000_000.0
# What a browser's page sends to fetch the fleet table: the data every project's runs are in.
FLEET_CALLBACK = {  # the fleet page's fetch (dashboards/pages/fleet.py, _fetch), as a browser posts it
    "output": "fleet-store.data",
    "outputs": {"id": "fleet-store", "property": "data"},
    "inputs": [{"id": "app-interval", "property": "n_intervals", "value": 0},
               {"id": "fleet-status-filter", "property": "value", "value": None},
               {"id": "fleet-range-filter", "property": "value", "value": "all"},
               {"id": "fleet-range-from", "property": "value", "value": None},
               {"id": "fleet-range-to", "property": "value", "value": None},
               {"id": "fleet-run-filter", "property": "value", "value": None}],
    "changedPropIds": ["app-interval.n_intervals"]}


def _basic(token: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"me:{token}".encode()).decode()}


@contextmanager
def _serve(tmp_path: Path, *tokens: tuple[str, str]) -> Iterator[tuple[str, dict[str, str]]]:
    db = f"sqlite:///{tmp_path / 'goodput.db'}"
    made = {}
    for project, kind in tokens:
        out = subprocess.run([*GOODPUT, "token", "create", "--project", project, "--kind", kind, "--db", db],
                             cwd=tmp_path, env=env_with(), capture_output=True, text=True, timeout=120, check=True)
        made[f"{project}:{kind}"] = out.stdout.strip()
    port = free_port()
    proc = subprocess.Popen([*GOODPUT, "serve", "--port", str(port), "--db", db, "--no-dashboard"], cwd=tmp_path,
                            env=env_with(GOODPUT_WARM_ANALYSES_S="0", GOODPUT_AUTH_CACHE_TTL_S="0"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
        yield f"http://127.0.0.1:{port}", made
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@contextmanager
def _dashboard(api: str, **env: str) -> Iterator[int]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "dashboards", "--api", api, "--host", "0.0.0.0", "--port",
                             str(port)], cwd=REPO, env=env_with(**env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.stdout is not None and proc.poll() is None, proc.stdout and proc.stdout.read().decode()
            assert time.monotonic() < deadline, "the standalone dashboard did not start"
            time.sleep(0.3)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def remote() -> str:
    address = _non_loopback_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address to act as a remote browser")
    return address


def test_with_tokens_every_remote_browser_signs_in_and_sees_only_its_project(tmp_path: Path, remote: str) -> None:
    with _serve(tmp_path, ("*", "read"), ("alpha", "read"), ("alpha", "write"), ("beta", "write")) as (api, tok):
        for project in ("alpha", "beta"):
            ok = httpx.post(f"{api}/v1/events", headers={"Authorization": f"Bearer {tok[f'{project}:write']}"},
                            json={"events": [{"event_id": "s1", "run_id": f"{project}-run", "kind": "step",
                                              "time": T, "attempt": 0, "rank": 0, "step": 1, "start": T - 1,
                                              "end": T}]}, timeout=30)
            assert ok.status_code == 200, ok.text
        # as docker-compose ran it: the operator's '*' token configured on the dashboard
        with _dashboard(api, GOODPUT_DASHBOARD_TOKEN=tok["*:read"]) as port:
            far = f"http://{remote}:{port}"
            page = httpx.get(f"{far}/", timeout=30)
            assert page.status_code == 401 and page.headers["WWW-Authenticate"].startswith("Basic")
            attack = httpx.post(f"{far}/_dash-update-component", json=FLEET_CALLBACK, timeout=30)
            assert attack.status_code == 401 and "beta-run" not in attack.text and "alpha-run" not in attack.text
            for bad in (tok["alpha:write"], "gpr_000000000000_" + "0" * 48, "not-a-token"):
                refused = httpx.get(f"{far}/", headers=_basic(bad), timeout=30)
                assert refused.status_code == 401, (bad[:4], refused.text)
            assert "write token" in httpx.get(f"{far}/", headers=_basic(tok["alpha:write"]), timeout=30).text
            assert httpx.get(f"{far}/healthz", timeout=30).status_code == 200

            signed_in = httpx.post(f"{far}/_dash-update-component", json=FLEET_CALLBACK,
                                   headers=_basic(tok["alpha:read"]), timeout=60)
            assert signed_in.status_code == 200, signed_in.text[:300]
            shown = json.dumps(json.loads(signed_in.text))
            assert "alpha-run" in shown and "beta-run" not in shown  # scoped by the browser's own token

            # a browser on the dashboard's own host may use the configured token
            local = httpx.get(f"http://127.0.0.1:{port}/", timeout=30)
            assert local.status_code == 200


def test_without_tokens_the_dashboard_serves_only_its_own_host(tmp_path: Path, remote: str) -> None:
    with _serve(tmp_path) as (api, _), _dashboard(api) as port:
        assert httpx.get(f"http://127.0.0.1:{port}/", timeout=30).status_code == 200
        far = f"http://{remote}:{port}"
        assert httpx.get(f"{far}/", timeout=30).status_code == 401
        typed = httpx.post(f"{far}/_dash-update-component", json=FLEET_CALLBACK, headers=_basic("anything"),
                           timeout=30)
        assert typed.status_code == 403 and "no access tokens" in typed.json()["error"]["message"]
