"""`python -m dashboards --api URL --port P`: the dashboard as its own process, reading a collector over HTTP."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx

from tests.dashboards.conftest import REPO, Server, _env, free_port


def test_standalone_dashboard_serves_pages_and_reads_the_collector(seeded_server: Server) -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "dashboards", "--api", seeded_server.url, "--port", str(port)],
                            cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                page = httpx.get(f"{base}/", timeout=2)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "the standalone dashboard did not start"
                assert proc.poll() is None, proc.stdout.read().decode()  # type: ignore[union-attr]
                time.sleep(0.3)
        assert page.status_code == 200 and "goodput" in page.text
        assert httpx.get(f"{base}/runs/gpt-small-hang", timeout=10).status_code == 200
        layout = httpx.get(f"{base}/_dash-layout", timeout=10)
        assert layout.status_code == 200 and "app-interval" in layout.text
        # the run page's data callback, as the browser calls it: it reads the collector's API
        body = {"output": "..run-live-store.data...run-store.data...run-version-store.data...run-freshness.children..",
                "outputs": [{"id": "run-live-store", "property": "data"}, {"id": "run-store", "property": "data"},
                            {"id": "run-version-store", "property": "data"},
                            {"id": "run-freshness", "property": "children"}],
                "inputs": [{"id": "app-interval", "property": "n_intervals", "value": 0},
                           {"id": "run-id-store", "property": "data", "value": "gpt-small-hang"}],
                "state": [{"id": "run-version-store", "property": "data", "value": None}],
                "changedPropIds": ["run-id-store.data"]}
        answer = httpx.post(f"{base}/_dash-update-component", json=body, timeout=60)
        assert answer.status_code == 200, answer.text[:500]
        store = json.loads(answer.text)["response"]["run-store"]["data"]
        ledger = seeded_server.get("/v1/runs/gpt-small-hang/waste")
        assert store["ledger"]["goodput"] == ledger["goodput"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
