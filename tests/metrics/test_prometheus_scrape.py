"""A real Prometheus server scrapes a real `goodput serve` (PostgreSQL, 2 workers) seeded with `goodput simulate`;
its query API returns the ledger's goodput for the run."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import create_postgres_database, drop_postgres_database
from tests.test_cli import GOODPUT, env_with, free_port, wait_healthy

pytestmark = pytest.mark.prometheus

PROMETHEUS_CONFIG = """
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: goodput-collector
    metrics_path: /metrics
    static_configs:
      - targets: ["127.0.0.1:{port}"]
"""


@pytest.fixture
def postgres_url(postgres_admin_url: str) -> Iterator[str]:
    url = create_postgres_database(postgres_admin_url)
    yield url
    drop_postgres_database(postgres_admin_url, url)


def stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def query(prom_url: str, expr: str, timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """The first non-empty result of an instant query, polled until Prometheus has scraped it."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            response = httpx.get(f"{prom_url}/api/v1/query", params={"query": expr}, timeout=5)
            last = response.text[:500]
            if response.status_code == 200:  # 503 in plain text while Prometheus is still starting
                last = response.json()
                if last.get("status") == "success" and last["data"]["result"]:
                    return last["data"]["result"]
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.5)
    raise AssertionError(f"Prometheus never answered {expr!r} with data; last answer: {last}")


def test_prometheus_scrapes_the_ledgers_goodput(postgres_url: str, tmp_path: Path) -> None:
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.fail("prometheus not found: apt-get install prometheus (scripts/system-deps.sh does it)")
    port, prom_port = free_port(), free_port()
    url, prom_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{prom_port}"
    collector = subprocess.Popen(
        [*GOODPUT, "serve", "--port", str(port), "--workers", "2", "--no-dashboard"], cwd=tmp_path,
        env=env_with(GOODPUT_DATABASE_URL=postgres_url, GOODPUT_METRICS_CACHE_TTL_S="1"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    prom: subprocess.Popen[bytes] | None = None
    try:
        wait_healthy(url, collector)
        accepted = 0
        for run_id, extra in (("prom-sim", ["--straggler-rank", "2"]), ("prom-live", ["--end", "running"])):
            out = subprocess.run([*GOODPUT, "simulate", "--url", url, "--run-id", run_id, "--ranks", "4",
                                  "--hours", "0.05", "--mtbf", "120", *extra], env=env_with(),
                                 capture_output=True, text=True, timeout=120)
            assert out.returncode == 0, out.stderr
            accepted += int(out.stdout.split("(")[1].split(" accepted")[0])
        ledger = httpx.get(f"{url}/v1/runs/prom-sim/waste", timeout=30).json()

        config = tmp_path / "prometheus.yml"
        config.write_text(PROMETHEUS_CONFIG.format(port=port))
        prom = subprocess.Popen(
            [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

        result = query(prom_url, 'goodput_run_goodput_ratio{run_id="prom-sim"}')
        assert float(result[0]["value"][1]) == pytest.approx(ledger["goodput"], rel=1e-12)
        assert result[0]["metric"]["job"] == "goodput-collector"
        waste = query(prom_url, 'goodput_run_waste_gpu_seconds{run_id="prom-sim", category="straggler"}')
        assert float(waste[0]["value"][1]) == pytest.approx(ledger["waste_gpu_seconds"]["straggler"], rel=1e-12)
        assert query(prom_url, 'up{job="goodput-collector"}')[0]["value"][1] == "1"
        # whichever of the two workers answered the scrape, the counter holds both workers' batches
        total = query(prom_url, 'goodput_collector_events_total{outcome="accepted"}')
        assert float(total[0]["value"][1]) == accepted
        live = query(prom_url, 'goodput_run_seconds_since_progress{run_id="prom-live"}')
        assert float(live[0]["value"][1]) >= 0
        targets = httpx.get(f"{prom_url}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
        assert [t["health"] for t in targets] == ["up"], json.dumps(targets)[:1000]
    finally:
        if prom is not None:
            stop(prom)
        stop(collector)
