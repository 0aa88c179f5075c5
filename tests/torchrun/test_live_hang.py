"""Live hang detection and checkpoint requests on real torchrun jobs (examples/train_ddp.py, CPU, gloo).

A rank is SIGSTOPped from outside at a known time, with the gloo timeout long (120 s): the collector must flag
the run hung, naming that rank, within its threshold plus a few seconds, long before the timeout would. And,
under `goodput launch` with a shorter timeout: while hung, the run's hang so far is in /waste, /v1/runs and
/metrics (provisional, growing); once the job has failed, the final ledger's hang runs from the last step to the
end of the allocation (the timeout, then torchrun's teardown), as the job's own logs say.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.ledger_checks import assert_partition
from tests.torchrun.conftest import Collector, Job, fetch_ledger, start_job, wait_for

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
    # both ranks run on this machine: the stopped one is silent while its host's other rank heart-beats
    assert suspect["host"] == socket.gethostname()
    assert any(r.startswith("no heartbeat") and r.endswith(f"while other ranks on host {suspect['host']} do")
               for r in suspect["reasons"]), suspect
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


# Long enough for the hang to be flagged (30 s floor) and read twice before rank 0's all-reduce gives up.
SHORT_GLOO_TIMEOUT_S = 45.0
TORCHRUN_TEARDOWN_S = 30.0  # torchrun's SIGTERM-to-SIGKILL wait when it stops a worker group (a stopped rank)


def provisional_everywhere(url: str, run_id: str) -> dict[str, float]:
    """The run's provisional hang GPU-seconds as /waste, /v1/runs and /metrics say it now (and /waste's hang)."""
    waste = httpx.get(f"{url}/v1/runs/{run_id}/waste", timeout=30).json()
    assert_partition(waste)
    (listed,) = [r for r in httpx.get(f"{url}/v1/runs", timeout=30).json()["runs"] if r["run_id"] == run_id]
    samples = {(s.name, s.labels.get("run_id", ""), s.labels.get("category", "")): s.value
               for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=30).text)
               for s in family.samples}
    return {
        "waste": waste["provisional"]["hang_gpu_seconds"] if waste["provisional"] else 0.0,
        "waste_hang": waste["waste_gpu_seconds"]["hang"],
        "runs": listed["provisional"]["hang_gpu_seconds"] if listed["provisional"] else 0.0,
        "runs_hang": listed["waste_gpu_seconds"]["hang"],
        "metrics": samples.get(("goodput_run_provisional_hang_gpu_seconds", run_id, ""), 0.0),
        "metrics_hang": samples[("goodput_run_waste_gpu_seconds", run_id, "hang")],
        "fleet_hang": samples[("goodput_fleet_waste_gpu_seconds", "", "hang")],
    }


def test_a_hang_is_provisional_hang_everywhere_while_it_lasts_and_its_final_hang_is_the_jobs_log(
    tmp_path: Path, collector: Collector, jobs: list[Job]
) -> None:
    world = 2
    job = start_job(tmp_path / "job", collector.url, run_id="hang-ledger", launch=True, max_restarts=0, args=(
        "--steps", "100000", "--checkpoint-every", "0", "--step-sleep", "0.05",
        "--timeout-s", str(SHORT_GLOO_TIMEOUT_S)))
    jobs.append(job)
    wait_for(lambda: len(job.events("step", rank=1)) >= 30, 90, "30 steps", job)
    wait_for(lambda: (lv := live(collector.url, job.run_id)) and lv["median_step_seconds"], 30, "step times")
    stopped_at = time.time()
    os.kill(job.pid(1, 0), signal.SIGSTOP)
    try:
        wait_for(lambda: (lv := live(collector.url, job.run_id)) and lv["hung"], 45, "the hung flag", job)
        first = provisional_everywhere(collector.url, job.run_id)
        time.sleep(2.0)
        second = provisional_everywhere(collector.url, job.run_id)
        read_at = time.time()
        assert read_at - stopped_at < SHORT_GLOO_TIMEOUT_S - 3, "both reads happened while the job was hung"
        for where in ("waste", "runs", "metrics"):
            # from the last step (about when the rank stopped) to the read, on both GPUs; 2 s later, 4 GPU-s more
            assert first[where] >= 25.0 * world, (where, first)
            assert second[where] - first[where] >= 1.5 * world, (where, first, second)
        for read in (first, second):
            assert read["waste_hang"] >= read["waste"] and read["runs_hang"] >= read["runs"]
            assert read["fleet_hang"] == read["metrics_hang"] >= read["metrics"]
        # Nobody intervenes: rank 0's all-reduce times out, torchrun tears the group down (SIGTERM; the stopped
        # rank gets SIGKILL 30 s later) and the launcher ends the allocation and the run.
        code = job.proc.wait(timeout=SHORT_GLOO_TIMEOUT_S + TORCHRUN_TEARDOWN_S + 60)
        exited_at = time.time()
    finally:
        job.terminate()
    assert code != 0, job.tail()

    ledger = fetch_ledger(collector.url, job.run_id, lambda lg: lg["status"] == "failed")
    assert_partition(ledger)
    assert ledger["provisional"] is None and ledger["restarts"] == 0 and ledger["failures"] == 1
    last_step_end = max(e["end"] for e in job.events("step", attempt=0))
    (error,) = job.events("error", rank=0, attempt=0)
    assert error["time"] - last_step_end >= 0.9 * SHORT_GLOO_TIMEOUT_S, "the job's log shows the timeout"
    (attempt,) = ledger["attempts"]
    assert attempt["end"] == pytest.approx(error["time"], abs=0.5)  # rank 0's attempt_end(failed)
    (allocation,) = ledger["allocations"]
    teardown_s = allocation["end"] - attempt["end"]
    assert teardown_s >= 0.8 * TORCHRUN_TEARDOWN_S, teardown_s
    # Hang plus teardown = the last logged step end to the allocation's end. The launcher stamps
    # allocation_end as torchrun exits, then sends its last events and exits itself (`exited_at`, seen here):
    # that flush to a local collector takes well under a second. The last step on the collector is rank 0's
    # (the stopped rank's last events die with it), within one step (0.06 s) of the logs' latest.
    expected_s = exited_at - last_step_end
    hang_s = ledger["waste_gpu_seconds"]["hang"] / world
    assert expected_s - 1.5 <= hang_s <= expected_s + 0.1, (hang_s, expected_s, teardown_s)
    assert allocation["end"] <= exited_at

    # Why it failed, as the view says: rank 0 raised gloo's timeout (its error text, word for word as the job
    # logged it) and exited with 1, which is what torchrun reported first to goodput launch; the stopped rank 1 is
    # the one rank 0 waited for (behind it in step or collectives when the attempt stopped).
    (failure,) = httpx.get(f"{collector.url}/v1/runs/{job.run_id}/view", timeout=30).json()["timeline"]["failures"]
    cause = failure["cause"]
    assert (cause["rank"], cause["basis"], cause["exit_code"], cause["signal"]) == (0, "exit", 1, None), cause
    assert cause["host"] == socket.gethostname()
    assert (cause["error_rank"], cause["error"][:500]) == (0, error["error"])
    assert cause["hung_ranks"] == [1], cause
