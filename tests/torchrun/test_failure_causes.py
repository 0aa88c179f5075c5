"""Why an attempt failed, told by real processes under `goodput launch -- torchrun`: the launcher reads torchrun's
report of the failed worker ("failed (exitcode: -9) local_rank: 0 (pid: ...)") and the run's view names the rank
the test made fail, its host, the signal or exit code, and the error text the worker raised."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.test_cli import GOODPUT
from tests.torchrun.attempts import Agent, job_lines, run_standalone
from tests.torchrun.conftest import Collector

pytestmark = pytest.mark.torchrun

NPROC, STEPS = 2, 8


def run_job(tmp_path: Path, collector: Collector, run_id: str, job_args: list[str],
            extra_env: dict[str, str] | None = None) -> Agent:
    return run_standalone(tmp_path, collector.url, run_id=run_id, nproc=NPROC, steps=STEPS, max_restarts=1,
                          job_args=job_args, extra_env=extra_env)


def first_failure(url: str, run_id: str, timeout_s: float = 30.0) -> dict[str, Any]:
    """The view's first failed attempt, once its cause carries the launcher's exit status."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        response = httpx.get(f"{url}/v1/runs/{run_id}/view", timeout=30)
        if response.status_code == 200:
            last = response.json()
            failures = last["timeline"]["failures"]
            if failures and (failures[0]["cause"] or {}).get("exit_code") is not None:
                assert last["restarts"][0]["cause"] == failures[0]["cause"]
                return dict(failures[0])
        time.sleep(0.5)
    raise AssertionError(f"no failure with an exit status in {timeout_s} s: {last}")


def failing_line(tmp_path: Path) -> dict[str, Any]:
    (line,) = [x for x in job_lines(tmp_path / "logs") if x["event"] == "failing"]
    return line


def test_a_worker_killed_by_sigkill_is_named_with_its_signal_and_host(tmp_path: Path, collector: Collector) -> None:
    agent = run_job(tmp_path, collector, "killed-rank", ["--fail-at-step", "3", "--pause-s", "1"],
                    extra_env={"ATTEMPTS_JOB_FAIL": "kill"})
    killed = failing_line(tmp_path)
    assert f"exitcode: -9) local_rank: {killed['local_rank']} (pid: {killed['pid']})" in agent.text()
    failure = first_failure(collector.url, "killed-rank")
    cause = failure["cause"]
    assert (failure["attempt"], failure["step"]) == (0, 3)
    assert (cause["rank"], cause["basis"], cause["exit_code"], cause["signal"]) == (killed["rank"], "exit", -9,
                                                                                   "SIGKILL")
    assert cause["host"] == socket.gethostname()
    out = subprocess.run([*GOODPUT, "failures", "killed-rank", "--url", collector.url], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert f"rank {killed['rank']} on {socket.gethostname()} killed by SIGKILL (exit code -9)" in out.stdout


def test_a_worker_that_raised_is_named_with_its_exit_code_and_its_error(tmp_path: Path, collector: Collector) -> None:
    run_job(tmp_path, collector, "raised-rank", ["--die-in-init", "1"])
    raised = failing_line(tmp_path)
    cause = first_failure(collector.url, "raised-rank")["cause"]
    assert (cause["rank"], cause["exit_code"], cause["signal"]) == (raised["rank"], 1, None)
    assert cause["error_rank"] == raised["rank"]
    # what the job did: init_process_group against a port nobody listens on (tcp://127.0.0.1:1)
    assert "127.0.0.1" in cause["error"] or "timed out" in cause["error"].lower(), cause["error"]
