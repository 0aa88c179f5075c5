"""A real Prometheus server scrapes a real `goodput serve` (PostgreSQL, 2 workers) seeded with `goodput simulate`;
its query API returns the ledger's goodput for the run."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.metrics.servers import collector_then_prometheus, query
from tests.test_cli import GOODPUT, env_with

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


def test_prometheus_scrapes_the_ledgers_goodput(postgres_url: str, tmp_path: Path) -> None:
    with collector_then_prometheus(postgres_url, tmp_path) as servers:
        url, port, prom_url = servers.url, servers.port, servers.prom_url
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
        servers.start_prometheus(config)

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
