"""`goodput launch` inside real Slurm batch jobs (a one-node Slurm, tests/slurm/conftest.py) reporting to a real
`goodput serve`: the queue wait is Slurm's (StartTime - SubmitTime), the allocation starts at Slurm's StartTime,
`scancel` ends the run cancelled with Slurm's state as its detail, and a preemption warning (what
`--signal=B:USR1@N` delivers) followed by `scontrol requeue` gives two allocations, the wait between as queue,
attempts numbered on, the first one `preempted`, and rework equal to the steps the job's log shows it lost. Expected
values come from Slurm's own record of each job (`scontrol show job`), never from the test's guesses about timing.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ingest_client.launcher.slurm import slurm_time
from tests.slurm.conftest import SlurmCluster
from tests.test_cli import REPO, free_port
from tests.torchrun.conftest import Collector, fetch_ledger, start_collector, wait_for

WORKER = Path(__file__).resolve().parent / "worker.py"


class Jobs:
    """Batch jobs of one test: each runs `goodput launch --gpus 1 -- python worker.py LOG STEPS STEP_S`."""

    def __init__(self, slurm: SlurmCluster, collector: Collector, workdir: Path) -> None:
        self.slurm, self.collector, self.workdir = slurm, collector, workdir
        self.ids: list[str] = []

    def submit(self, name: str, steps: int, step_s: float, *worker_args: str, srun_torchrun: bool = False) -> str:
        """With ``srun_torchrun``, the shape of examples/slurm_train_ddp.sbatch: ``exec srun goodput launch --
        torchrun ... --rdzv-backend c10d`` (one node, one process on gloo)."""
        script = self.workdir / f"{name}.sh"
        runner = f"{sys.executable} -m services.cli launch"
        command = f"{sys.executable}"
        if srun_torchrun:
            runner = f"srun --kill-on-bad-exit=1 {runner}"
            command = (f"{sys.executable} -m torch.distributed.run --nnodes 1 --nproc-per-node 1 --max-restarts 0 "
                       f"--rdzv-backend c10d --rdzv-endpoint 127.0.0.1:{free_port()} --rdzv-id $SLURM_JOB_ID")
        script.write_text("\n".join([
            "#!/bin/bash",
            f"cd {REPO}",
            f"export PYTHONPATH={REPO}",
            "unset $(compgen -e | grep '^GOODPUT_')",
            "export GOODPUT_SIGNAL_POLL_S=0.2",
            f"exec {runner} --gpus 1 --url {self.collector.url} "
            f"--spool-dir {self.workdir / 'spool'} -- {command} {WORKER} {self.log(name)} {steps} {step_s} "
            f"{' '.join(worker_args)}",
            "",
        ]))
        job_id = self.slurm.sbatch(script, "-J", name, "-o", str(self.workdir / f"{name}.out"), "--open-mode=append")
        self.ids.append(job_id)
        return job_id

    def log(self, name: str) -> Path:
        return self.workdir / f"{name}.jsonl"

    def logged(self, name: str) -> list[dict[str, Any]]:
        path = self.log(name)
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def output(self, name: str) -> str:
        path = self.workdir / f"{name}.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def cancel_all(self) -> None:
        if self.ids:
            self.slurm.run("scancel", *self.ids)


@pytest.fixture
def jobs(slurm: SlurmCluster, tmp_path: Path) -> Iterator[Jobs]:
    slurm.wait_idle()
    collector = start_collector(tmp_path / "collector")
    made = Jobs(slurm, collector, tmp_path)
    try:
        yield made
    finally:
        made.cancel_all()
        slurm.wait_idle()
        collector.stop()


def test_a_job_that_waited_behind_another_shows_slurms_queue_wait_and_allocation(jobs: Jobs) -> None:
    holder = jobs.submit("holder", steps=8, step_s=0.5)
    jobs.slurm.wait_state(holder, ("RUNNING",))
    waiter = jobs.submit("waiter", steps=2, step_s=0.1)
    assert jobs.slurm.job(waiter)["JobState"] == "PENDING", "the holder has the node: the waiter queues"
    record = jobs.slurm.wait_state(waiter, ("COMPLETED", "FAILED"), timeout_s=90)
    assert record["JobState"] == "COMPLETED", jobs.output("waiter")
    submitted, started, ended = (slurm_time(record[k]) for k in ("SubmitTime", "StartTime", "EndTime"))
    assert submitted is not None and started is not None and ended is not None
    assert started - submitted >= 1.0, f"the waiter should have waited for the holder: {record}"

    ledger = fetch_ledger(jobs.collector.url, "slurm-" + waiter, lambda led: led.get("status") == "finished")
    assert abs(ledger["queue_seconds"] - (started - submitted)) <= 1.0, (ledger, record)
    # The allocation runs from Slurm's StartTime to the launcher's end (Slurm's EndTime is whole seconds).
    assert abs(ledger["allocated_gpu_seconds"] - (ended - started)) <= 1.5, (ledger, record)


def test_scancel_ends_the_run_cancelled_with_slurms_state(jobs: Jobs) -> None:
    job = jobs.submit("cancelled", steps=200, step_s=0.1)
    wait_for(lambda: any(e["event"] == "step" for e in jobs.logged("cancelled")) or None, 60, "a first step")
    jobs.slurm.run("scancel", job)
    record = jobs.slurm.wait_state(job, ("CANCELLED",))
    fetch_ledger(jobs.collector.url, "slurm-" + job, lambda led: led.get("status") == "cancelled", timeout_s=30)
    assert record["JobState"] == "CANCELLED"
    with sqlite3.connect(jobs.collector.db_path) as db:
        (data,) = db.execute("SELECT data FROM events WHERE kind = 'run_end'").fetchone()  # the only run
    assert json.loads(data)["detail"].startswith("slurm: cancelled"), data
    steps = sum(e["event"] == "step" for e in jobs.logged("cancelled"))
    assert 0 < steps < 200, "cancelled while running"


def _steps_before_requeue(jobs: Jobs, name: str) -> tuple[int, int]:
    """(last step, last checkpoint step) the job logged in its first allocation."""
    first = [e for e in jobs.logged(name) if e.get("event") in ("step", "checkpoint")]
    restarted = [e["time"] for e in jobs.logged(name) if e["event"] == "start" and e["restarts"] > 0]
    before = [e for e in first if not restarted or e["time"] < restarted[0]]
    last = max(e["step"] for e in before if e["event"] == "step")
    saved = max((e["step"] for e in before if e["event"] == "checkpoint"), default=0)
    return last, saved


@pytest.mark.parametrize(("mode", "shape"), [("honour", "plain"), ("ignore", "plain"), ("honour", "srun-torchrun")])
def test_a_preemption_warning_then_requeue_costs_only_the_steps_since_the_last_checkpoint(
    jobs: Jobs, tmp_path: Path, mode: str, shape: str
) -> None:
    name = f"preempt-{mode}-{shape}"
    job = jobs.submit(name, 60, 0.1, str(tmp_path / f"{name}.ckpt"), "5", mode, srun_torchrun=shape != "plain")
    wait_for(lambda: sum(e["event"] == "step" for e in jobs.logged(name)) >= 7 or None, 60, "seven steps")
    first = jobs.slurm.job(job)
    jobs.slurm.run("scancel", "--batch", "--signal=USR1", job)  # what sbatch --signal=B:USR1@N sends
    if mode == "honour":
        wait_for(lambda: any(e.get("requested") for e in jobs.logged(name)) or None, 30, "the requested checkpoint")
    else:  # keep stepping past the last periodic checkpoint: those steps are lost
        wait_for(lambda: [e["step"] for e in jobs.logged(name) if e["event"] == "step"][-1] % 5 == 3 or None, 30,
                 "steps past the last checkpoint")
    jobs.slurm.run("scontrol", "requeue", job)
    jobs.slurm.wait_state(job, ("PENDING",))
    jobs.slurm.run("scontrol", "update", f"JobId={job}", "StartTime=now")  # Slurm holds a requeue 2 min
    second = jobs.slurm.wait_state(job, ("RUNNING", "COMPLETED"), timeout_s=90)
    record = jobs.slurm.wait_state(job, ("COMPLETED",), timeout_s=90)
    assert record["Restarts"] == "1", record

    ledger = fetch_ledger(jobs.collector.url, "slurm-" + job, lambda led: led.get("status") == "finished")
    last, saved = _steps_before_requeue(jobs, name)
    if mode == "honour":
        assert last == saved, "an honoured warning checkpoints the last completed step"
    else:
        assert last > saved
    allocations = ledger["allocations"]
    assert [a["start"] for a in allocations] == [slurm_time(first["StartTime"]), slurm_time(second["StartTime"])]
    # Slurm's times are whole seconds: a requeue started at once (StartTime=now) may begin in the second it ended
    assert allocations[0]["end"] <= allocations[1]["start"]
    queue = ((allocations[0]["start"] - slurm_time(first["SubmitTime"]))
             + (allocations[1]["start"] - allocations[0]["end"]))  # the first wait, then the requeue's
    assert ledger["queue_seconds"] == pytest.approx(queue, abs=1e-6)
    attempts = ledger["attempts"]
    assert [(a["attempt"], a["reason"]) for a in attempts] == [(0, "preempted"), (1, "completed")], attempts
    # The first attempt's steps after its last checkpoint are redone by the second: its lost (reworked) steps.
    assert (attempts[0]["last_step"], attempts[0]["steps_reworked"]) == (last, last - saved), (attempts, last, saved)
    assert (ledger["waste_gpu_seconds"]["rework"] > 0) == (last > saved)
    total = ledger["productive_gpu_seconds"] + sum(ledger["waste_gpu_seconds"].values())
    assert total == pytest.approx(ledger["allocated_gpu_seconds"], rel=1e-9)
