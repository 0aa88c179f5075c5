"""A run that fails for good keeps what its checkpoints saved (issue 30, point 8), on a real 2-rank torchrun job under
`goodput launch` at default client settings.

examples/train_ddp.py (gloo, CPU) checkpoints atomically every 20 steps; rank 1 SIGKILLs itself right after step 57
(`--kill-after-step`); every worker torchrun starts after that raises before it joins the process group
(`--die-before-init-after-kill`: a restart that never gets going, as on a broken node), so the restarts report
no resume and no step, and torchrun gives up after `--max-restarts` (rc 1). A relaunch would resume from the last
checkpoint that completed: the steps up to it are kept, the ones after it are rework, and the restarts that never
stepped change nothing.

Expected values come from the job's own logs: the steps each attempt logged, the checkpoints rank 0 logged as
published, the attempts that died before init. If gloo's connectFullMesh fails in the first round (it happens
right after a start, now and then), that round is a real attempt with no step: the kill then falls in the next
one, and everything below is still taken from the logs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.ledger_checks import assert_partition
from tests.torchrun.conftest import Collector, Job, fetch_ledger, start_job

pytestmark = pytest.mark.torchrun

CHECKPOINT_EVERY, KILL_AFTER, MAX_RESTARTS, NPROC = 20, 57, 2, 2


def test_a_job_that_gives_up_after_restarts_that_die_before_init_keeps_its_last_checkpoint(
        tmp_path: Path, collector: Collector, jobs: list[Job]) -> None:
    job = start_job(tmp_path / "job", collector.url, run_id="gives-up", max_restarts=MAX_RESTARTS, args=(
        "--steps", "100", "--checkpoint-every", str(CHECKPOINT_EVERY), "--step-sleep", "0.02",
        "--kill-after-step", str(KILL_AFTER), "--kill-rank", "1", "--die-before-init-after-kill"))
    jobs.append(job)
    assert job.wait(240) == 1, job.tail()  # torchrun gave up

    (killed,) = job.events("killed")
    stepped = killed["attempt"]  # the attempt that trained (0, unless its round failed in gloo's connect)
    died = sorted({e["attempt"] for e in job.events("died_before_init")})
    assert died == list(range(stepped + 1, MAX_RESTARTS + 1)) and died, (died, job.tail())
    assert {e["attempt"] for e in job.events("step")} == {stepped}
    steps = {e["step"] for e in job.events("step")}
    assert steps == set(range(1, KILL_AFTER + 1)), sorted(steps)
    saved = max(e["step"] for e in job.events("checkpoint"))  # published: files, manifest, rename
    assert saved == 40
    kept, reworked = {s for s in steps if s <= saved}, {s for s in steps if s > saved}
    spans = {s: (min(e["start"] for e in job.events("step", step=s)), max(e["end"] for e in job.events("step", step=s)))
             for s in steps}

    ledger = fetch_ledger(collector.url, job.run_id, lambda ledger: ledger["status"] == "failed"
                          and len(ledger["attempts"]) == MAX_RESTARTS + 1
                          and ledger["steps"]["computed"] == len(steps))
    assert ledger["restarts"] == MAX_RESTARTS
    assert (ledger["steps"]["kept"], ledger["steps"]["reworked"]) == (len(kept), len(reworked)) == (40, 17)
    attempts = {a["attempt"]: a for a in ledger["attempts"]}
    assert (attempts[stepped]["steps_kept"], attempts[stepped]["steps_reworked"]) == (40, 17)
    for number in died:
        assert attempts[number]["failed"] and attempts[number]["first_step"] is None, attempts[number]
        assert attempts[number]["resume_step"] is None, attempts[number]
    assert ledger["checkpoints"]["last_ok_step"] == saved
    # Wall time of the steps (a step spans from the first rank's start to the last rank's end, so consecutive steps
    # overlap a little; a kept step's claim wins over a reworked one's). The killed rank's last flush interval is
    # lost, but the other rank's rows of those steps arrive.
    kept_s = covered([spans[s] for s in kept])
    rework_s = covered([spans[s] for s in steps]) - kept_s
    kept_gpu_s = ledger["productive_gpu_seconds"] + ledger["waste_gpu_seconds"]["straggler"]
    assert kept_gpu_s == pytest.approx(kept_s * NPROC, rel=0.1, abs=0.05)
    assert ledger["waste_gpu_seconds"]["rework"] == pytest.approx(rework_s * NPROC, rel=0.1, abs=0.05)
    assert_partition(ledger)


def covered(spans: list[tuple[float, float]]) -> float:
    """Seconds covered by the union of the spans."""
    total, reach = 0.0, float("-inf")
    for lo, hi in sorted(spans):
        if hi > reach:
            total += hi - max(lo, reach)
            reach = hi
    return total
