"""The README snippet under plain torchrun (no `goodput launch`) ends with a finished run, never a hung one."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest

from tests.test_cli import env_with
from tests.torchrun.conftest import TORCHRUN, Collector

pytestmark = pytest.mark.torchrun

SNIPPET = Path(__file__).with_name("readme_snippet.py")


def test_the_readme_snippet_without_the_launcher_ends_with_a_finished_run(tmp_path: Path,
                                                                            collector: Collector) -> None:
    (tmp_path / "ckpt").mkdir()
    env = env_with(GOODPUT_URL=collector.url, GOODPUT_RUN_ID="readme-snippet",
                   GOODPUT_SPOOL_DIR=str(tmp_path / "spool"), SNIPPET_CKPT_DIR=str(tmp_path / "ckpt"),
                   OMP_NUM_THREADS="1")
    done = subprocess.run([*TORCHRUN, "--standalone", "--nproc-per-node", "2", str(SNIPPET)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = httpx.get(f"{collector.url}/v1/runs/readme-snippet", timeout=30).json()
    assert run["status"] == "finished", run
    live = httpx.get(f"{collector.url}/v1/runs/readme-snippet/live", timeout=30).json()
    assert live["status"] == "finished" and not live["hung"], live
    ledger = httpx.get(f"{collector.url}/v1/runs/readme-snippet/waste", timeout=30).json()
    assert ledger["steps"]["kept"] == 12 and ledger["checkpoints"]["ok"] == 2, ledger
