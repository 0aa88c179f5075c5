"""Live hang detection and checkpoint requests on real torchrun jobs (examples/train_ddp.py, CPU, gloo).

A rank is SIGSTOPped from outside at a known time, with the gloo timeout long (120 s): the collector must flag
the run hung, naming that rank, within its threshold plus a few seconds, long before the timeout would.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.torchrun.conftest import Collector, Job, start_job, wait_for

pytestmark = pytest.mark.torchrun

GLOO_TIMEOUT_S = 120.0


def live(url: str, run_id: str) -> dict[str, Any] | None:
    response = httpx.get(f"{url}/v1/runs/{run_id}/live", timeout=10)
    return response.json() if response.status_code == 200 else None


def stop_a_rank_and_time_detection(collector: Collector, job: Job, victim: int, *, poll_s: float = 0.2
                                   ) -> tuple[float, dict[str, Any]]:
    """SIGSTOP `victim` once the job trains steadily; (seconds from the stop to the first hung answer, it)."""
    wait_for(lambda: len(job.events("step", rank=victim)) >= 30, 90, "30 steps", job)
    wait_for(lambda: (lv := live(collector.url, job.run_id)) and lv["median_step_seconds"], 30, "step times")
    pid = job.pid(victim, 0)
    stopped_at = time.time()
    os.kill(pid, signal.SIGSTOP)
    try:
        while time.time() - stopped_at < GLOO_TIMEOUT_S:
            answer = live(collector.url, job.run_id)
            if answer and answer["hung"]:
                return time.time() - stopped_at, answer
            time.sleep(poll_s)
        raise AssertionError(f"not flagged hung within the {GLOO_TIMEOUT_S} s gloo timeout: {answer}")
    finally:
        job.terminate()  # SIGKILL to the whole process group (a stopped process ignores SIGTERM)


def test_a_sigstopped_rank_is_flagged_hung_and_named_long_before_the_collective_timeout(
    tmp_path: Path, collector: Collector, jobs: list[Job]
) -> None:
    job = start_job(tmp_path / "job", collector.url, run_id="live-hang", launch=False, args=(
        "--steps", "100000", "--checkpoint-every", "0", "--step-sleep", "0.05", "--timeout-s", str(GLOO_TIMEOUT_S)))
    jobs.append(job)
    latency, answer = stop_a_rank_and_time_detection(collector, job, victim=1)
    threshold = answer["threshold_seconds"]
    assert threshold == 30.0 and answer["threshold_basis"] == "floor"  # 10 x ~0.06 s steps is below the floor
    # The stop can land just after a step ended: progress then stopped up to one step before the SIGSTOP.
    assert threshold - 1.0 <= latency <= threshold + 5.0, (latency, answer)
    assert latency < GLOO_TIMEOUT_S / 3
    assert answer["suspect_ranks"] == [1], answer["suspects"]
    (suspect,) = answer["suspects"]
    assert any(r.startswith("no heartbeat") for r in suspect["reasons"])
    by_rank = {r["rank"]: r for r in answer["ranks"]}
    assert not by_rank[0]["silent"] and by_rank[0]["heartbeat_age_seconds"] < 10


def test_a_checkpoint_request_reaches_a_ddp_job_and_its_checkpoint_is_linked(
    tmp_path: Path, collector: Collector, jobs: list[Job]
) -> None:
    job = start_job(tmp_path / "job", collector.url, run_id="live-ckpt", launch=False, args=(
        "--steps", "100000", "--checkpoint-every", "0", "--step-sleep", "0.02", "--honor-checkpoint-requests"))
    jobs.append(job)
    wait_for(lambda: job.events("step", rank=0), 60, "the first step", job)
    wait_for(lambda: live(collector.url, "live-ckpt"), 30, "the run's first events")
    posted = time.time()
    request = httpx.post(f"{collector.url}/v1/runs/live-ckpt/checkpoint-request",
                         json={"reason": "test", "requested_by": "pytest"}, timeout=10).json()
    (asked_0,) = wait_for(lambda: job.events("checkpoint_requested", rank=0), 15, "rank 0 to see the request", job)
    (asked_1,) = wait_for(lambda: job.events("checkpoint_requested", rank=1), 5, "rank 1 to agree", job)
    assert asked_0["step"] == asked_1["step"], "every rank checkpoints at the same step"
    assert asked_0["time"] - posted < 5.0, "the client learns of it within a few seconds"
    (written,) = wait_for(lambda: job.events("checkpoint", rank=0), 15, "the checkpoint", job)
    assert written["step"] == asked_0["step"]

    def fulfilled() -> dict[str, Any] | None:
        answer = httpx.get(f"{collector.url}/v1/runs/live-ckpt/checkpoint-request", timeout=10).json()
        return next((r for r in answer["requests"] if r["id"] == request["id"] and not r["pending"]), None)

    done = wait_for(fulfilled, 15, "the request to be marked fulfilled", job)
    assert done["fulfilled_step"] == written["step"]
    assert len(job.events("checkpoint_requested", rank=0)) == 1, "one request, one checkpoint"
    job.terminate()
