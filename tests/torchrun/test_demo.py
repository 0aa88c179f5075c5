"""`scripts/demo.py --exit-after-seed` (what `make demo` runs, minus waiting for Ctrl-C)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.test_cli import REPO, env_with, free_port
from tests.torchrun.conftest import start_collector

pytestmark = pytest.mark.torchrun


def test_demo_seeds_real_and_simulated_runs(tmp_path: Path) -> None:
    port = free_port()
    demo_dir = tmp_path / "demo"
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "demo.py"), "--exit-after-seed", "--port",
                          str(port), "--dir", str(demo_dir)], check=False, env=env_with(), capture_output=True,
                         text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"http://127.0.0.1:{port}/dashboard/" in out.stdout
    assert "goodput runs" in out.stdout and "ddp-restart-" in out.stdout

    collector = start_collector(demo_dir)  # the demo's database, served again
    try:
        runs = {r["run_id"]: r for r in httpx.get(f"{collector.url}/v1/runs", timeout=60).json()["runs"]}
        by_prefix = {prefix: [r for rid, r in runs.items() if rid.startswith(prefix)] for prefix in (
            "ddp-restart-", "ddp-straggler-hang-", "sim-llm-64gpu-", "sim-straggler-16gpu-", "sim-hang-32gpu-")}
        assert all(len(found) == 1 for found in by_prefix.values()), sorted(runs)
        (restart,) = by_prefix["ddp-restart-"]
        assert restart["status"] == "finished" and restart["restarts"] == 1
        assert restart["waste_gpu_seconds"]["rework"] > 0
        (hang,) = by_prefix["ddp-straggler-hang-"]
        assert hang["restarts"] == 1 and hang["waste_gpu_seconds"]["hang"] > 0
        assert hang["waste_gpu_seconds"]["straggler"] > 0
        for run_id in runs:  # every demo run gets its top actions, the 64-GPU one with 15% waste included
            advice = httpx.get(f"{collector.url}/v1/runs/{run_id}/advice", timeout=60).json()
            assert advice["recommendations"], run_id
            assert advice["recommendations"][0]["at_stake_gpu_seconds"] > 0, run_id
    finally:
        collector.stop()
