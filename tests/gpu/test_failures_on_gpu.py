"""Failure on a GPU: a rank SIGKILLed after a checkpoint, and a rank SIGSTOPped mid-step, under real torchrun.

The same faults as the CPU tests (tests/torchrun/test_kill_after_checkpoint.py, test_live_hang.py), with the model,
the data and the step clock on the GPU (examples/train_ddp.py --device cuda; two ranks share one GPU where only one
is present, the collectives over gloo with CUDA tensors). What must hold is what the CPU tests check: the rework is
what the job logged, the resume is checked ok at load, the partition sums, and a stopped rank is flagged and named
long before the collective timeout; and the view says why the attempt failed (the rank the test killed, on this
host, by SIGKILL, as torchrun reported it to `goodput launch`). Under `goodput launch`, so the launcher and the node
relay are in the path.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

import httpx
import pytest

from tests.ledger_checks import assert_partition
from tests.torchrun.conftest import Collector, Job, collector, fetch_ledger, jobs, start_job  # noqa: F401
from tests.torchrun.test_failure_causes import first_failure
from tests.torchrun.test_live_hang import GLOO_TIMEOUT_S, stop_a_rank_and_time_detection

pytestmark = [pytest.mark.gpu(devices=1), pytest.mark.torchrun]

CHECKPOINT_AT = 10
GPU = ("--device", "cuda")


def test_a_gpu_rank_killed_after_a_checkpoint_costs_the_rework_its_job_logged(
        tmp_path: Path, collector: Collector, jobs: list[Job]) -> None:  # noqa: F811
    delay_s = random.uniform(0.0, 0.05)
    job = start_job(tmp_path / "job", collector.url, run_id="gpu-killed", launch=True, max_restarts=1, args=(
        *GPU, "--steps", "30", "--seed", "7", "--digest-every", "5", "--checkpoint-every", str(CHECKPOINT_AT),
        "--step-sleep", "0.1", "--kill-after-checkpoint", str(CHECKPOINT_AT), "--kill-rank", "0",
        "--kill-delay-s", f"{delay_s:.4f}"))
    jobs.append(job)
    assert job.wait(300) == 0, job.tail()

    after = [e for e in job.events("step", attempt=0) if e["step"] > CHECKPOINT_AT]
    reworked = {e["step"] for e in after}
    spans = [(min(e["start"] for e in after if e["step"] == s), max(e["end"] for e in after if e["step"] == s))
             for s in reworked]
    ledger = fetch_ledger(collector.url, job.run_id, lambda lg: lg["status"] == "finished"
                          and lg["steps"]["reworked"] == len(reworked), timeout_s=60)
    assert ledger["restarts"] == 1 and ledger["attempts"][1]["resume_step"] == CHECKPOINT_AT
    rework_s = sum(hi - lo for lo, hi in spans)
    assert ledger["waste_gpu_seconds"]["rework"] == pytest.approx(rework_s * 2, rel=0.1, abs=0.05)
    assert_partition(ledger)
    check = httpx.get(f"{collector.url}/v1/runs/{job.run_id}/resume-check", timeout=60).json()
    assert check["verdict"] == "ok", check["findings"]  # the GPU state (and its RNG) was restored whole
    cause = first_failure(collector.url, job.run_id)["cause"]
    assert (cause["rank"], cause["basis"], cause["signal"]) == (0, "exit", "SIGKILL"), cause
    assert cause["host"] == socket.gethostname(), cause


def test_a_sigstopped_gpu_rank_is_flagged_hung_and_named_before_the_collective_timeout(
        tmp_path: Path, collector: Collector, jobs: list[Job]) -> None:  # noqa: F811
    job = start_job(tmp_path / "job", collector.url, run_id="gpu-hang", launch=True, args=(
        *GPU, "--steps", "100000", "--checkpoint-every", "0", "--step-sleep", "0.05",
        "--timeout-s", str(GLOO_TIMEOUT_S)))
    jobs.append(job)
    latency, answer = stop_a_rank_and_time_detection(collector, job, victim=1)
    assert answer["threshold_seconds"] - 1.0 <= latency <= answer["threshold_seconds"] + 5.0, (latency, answer)
    assert answer["suspect_ranks"] == [1], answer["suspects"]
