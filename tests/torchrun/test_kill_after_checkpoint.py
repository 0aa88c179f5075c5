"""A rank SIGKILLed within 50 ms after a completed checkpoint, on a real 2-rank torchrun job at default client settings.

examples/train_ddp.py (gloo, CPU) checkpoints at step 10 on rank 0, which then SIGKILLs itself after a random delay
below 50 ms (`--kill-after-checkpoint`): no handler runs, nothing is flushed. Whatever rank 0 recorded in its last
flush interval is lost, but the checkpoint's events were on disk before `tracker.checkpoint` returned: the restarted
process replays them. The checkpoint must be stored, the resume check must say ok, and the ledger's rework must
equal what the job logged (every step a rank logged after the checkpoint, thrown away by the resume from it).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.ledger_checks import assert_partition
from tests.torchrun.conftest import DIGEST_ARGS, Collector, Job, fetch_ledger, final_digest, start_job

pytestmark = pytest.mark.torchrun

CHECKPOINT_AT = 10
STEP_SLEEP_S = 0.1  # longer than the kill delay: the killed rank logs no step after the checkpoint


def test_a_rank_killed_right_after_a_checkpoint_keeps_it_and_the_resume_is_ok(
        tmp_path: Path, collector: Collector, jobs: list[Job],
        reference_digest: Callable[[tuple[str, ...]], str]) -> None:
    seed = random.randrange(1 << 30)
    delay_s = random.Random(seed).uniform(0.0, 0.05)
    job = start_job(tmp_path / "job", collector.url, run_id="killed-after-ckpt", launch=False, max_restarts=1, args=(
        *DIGEST_ARGS, "--checkpoint-every", str(CHECKPOINT_AT), "--step-sleep", str(STEP_SLEEP_S),
        "--digest-every", "5", "--kill-after-checkpoint", str(CHECKPOINT_AT), "--kill-rank", "0",
        "--kill-delay-s", f"{delay_s:.4f}"))
    jobs.append(job)
    assert job.wait(180) == 0, job.tail()
    context = f"seed {seed}, delay {delay_s * 1000:.1f} ms"

    (scheduled,) = job.events("kill_scheduled")
    assert (scheduled["attempt"], scheduled["rank"], scheduled["step"]) == (0, 0, CHECKPOINT_AT)
    resumes = {e["step"] for e in job.events("resumed", attempt=1)}
    assert resumes == {CHECKPOINT_AT}, resumes
    logged_checkpoints = job.events("checkpoint")
    after = [e for e in job.events("step", attempt=0) if e["step"] > CHECKPOINT_AT]
    reworked_steps = {e["step"] for e in after}
    spans = {s: (min(e["start"] for e in after if e["step"] == s), max(e["end"] for e in after if e["step"] == s))
             for s in reworked_steps}

    # The killed rank's last records arrive when its restarted process replays its spool, maybe after the run end.
    try:
        ledger = fetch_ledger(collector.url, job.run_id, lambda ledger: ledger["status"] == "finished"
                              and ledger["checkpoints"]["ok"] == len(logged_checkpoints)
                              and ledger["steps"]["reworked"] == len(reworked_steps))
    except AssertionError as exc:  # which rank logged which step after the checkpoint, to tell a loss from a race
        logged = sorted((e["rank"], e["step"]) for e in after)
        raise AssertionError(f"{context}; (rank, step) logged after the checkpoint in attempt 0: {logged}; "
                             f"checkpoints logged: {len(logged_checkpoints)}; {exc}") from None
    assert ledger["restarts"] == 1 and ledger["attempts"][1]["resume_step"] == CHECKPOINT_AT, context
    assert ledger["checkpoints"]["ok"] == len(logged_checkpoints) and ledger["checkpoints"]["torn"] == 0, (
        context, ledger["checkpoints"])
    assert ledger["steps"]["reworked"] == len(reworked_steps), (context, ledger["steps"], sorted(reworked_steps))
    rework_s = sum(hi - lo for lo, hi in spans.values())
    assert ledger["waste_gpu_seconds"]["rework"] == pytest.approx(rework_s * 2, rel=0.1, abs=0.05), context
    assert_partition(ledger)

    check = httpx.get(f"{collector.url}/v1/runs/{job.run_id}/resume-check", timeout=60).json()
    assert check["verdict"] == "ok", (context, check["findings"])
    (resume,) = check["resumes"]
    assert resume["resume_step"] == CHECKPOINT_AT and resume["checkpoint_attempt"] == 0, (context, resume)
    # whatever the kill took with it, rank 0's digest of step 10 was on disk with its checkpoint: checked at load
    assert resume["compared"]["digest_at_load"] >= 1 and resume["verified"], (context, resume)
    assert final_digest(job) == reference_digest(DIGEST_ARGS), context  # the resume was exact
