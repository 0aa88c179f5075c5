"""examples/train_ddp.py under real torchrun (CPU, gloo), its ledger checked against the job's own logs.

Each test starts `goodput serve` on SQLite, runs the job with a fault injected from outside (SIGKILL,
SIGSTOP) or by the job's flags, then compares `/v1/runs/{run_id}/waste` with what the job logged: the steps
it ran, the step it resumed from, when it last made progress and when it gave up.
"""

from __future__ import annotations

import random
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.ledger_checks import assert_partition
from tests.test_cli import GOODPUT, env_with, free_port
from tests.torchrun.conftest import (
    DIGEST_ARGS,
    Collector,
    Job,
    fetch_ledger,
    fetch_run,
    final_digest,
    start_collector,
    start_job,
    wait_for,
)

pytestmark = pytest.mark.torchrun


def finished(ledger: dict[str, Any]) -> bool:
    return ledger["status"] == "finished"


def furthest_step(job: Job, attempt: int) -> int:
    return max(e["step"] for e in job.events("step", attempt=attempt))


def resumed_step(job: Job, attempt: int) -> int:
    steps = {e["step"] for e in job.events("resumed", attempt=attempt)}
    assert len(steps) == 1, f"ranks of attempt {attempt} resumed from different steps: {steps}"
    return steps.pop()


def test_clean_run_is_all_productive_steps(tmp_path: Path, collector: Collector, jobs: list[Job]) -> None:
    job = start_job(tmp_path / "job", collector.url, run_id="clean", args=(
        "--steps", "30", "--checkpoint-every", "10", "--step-sleep", "0.02"))
    jobs.append(job)
    assert job.wait() == 0, job.tail()
    assert {e["final_step"] for e in job.events("done")} == {30}

    ledger = fetch_ledger(collector.url, "clean", finished)
    assert ledger["steps"] == {"furthest": 30, "kept": 30, "reworked": 0, "computed": 30}
    assert ledger["restarts"] == 0 and ledger["failures"] == 0
    waste = ledger["waste_gpu_seconds"]
    assert waste["rework"] == 0 and waste["hang"] == 0
    assert ledger["goodput"] > 0
    assert ledger["checkpoints"]["ok"] == 3 and ledger["checkpoints"]["torn"] == 0
    assert ledger["allocations"][0]["gpus"] == 2, "goodput launch reported the allocation"
    assert_partition(ledger)
    run = fetch_run(collector.url, "clean")
    assert run["restarts"] == 0 and run["last_step"] == 30 and run["status"] == "finished"


def test_killed_worker_restarts_from_its_checkpoint_and_ends_with_the_same_model(
    tmp_path: Path, collector: Collector, jobs: list[Job], reference_digest: Callable[[tuple[str, ...]], str]
) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    victim, kill_after = rng.randrange(2), rng.randint(11, 24)  # after the first checkpoint (step 10)
    job = start_job(tmp_path / "job", collector.url, run_id="killed", max_restarts=1, args=(
        *DIGEST_ARGS, "--checkpoint-every", "10", "--step-sleep", "0.03"))
    jobs.append(job)
    wait_for(lambda: any(e["step"] >= kill_after for e in job.events("step", rank=victim, attempt=0)),
             60, f"rank {victim} to pass step {kill_after} (seed {seed})", job)
    job.kill(job.pid(victim, 0))
    assert job.wait() == 0, job.tail()

    furthest, resume = furthest_step(job, 0), resumed_step(job, 1)
    assert resume in (10, 20) and resume <= furthest, (resume, furthest)
    ledger = fetch_ledger(collector.url, "killed", finished)
    assert ledger["restarts"] == 1 and ledger["failures"] == 1, f"seed {seed}"
    assert ledger["attempts"][1]["resume_step"] == resume
    assert ledger["steps"]["reworked"] == furthest - resume, f"seed {seed}: the job logged {furthest} and {resume}"
    assert ledger["steps"]["kept"] == 30
    assert ledger["waste_gpu_seconds"]["rework"] > 0 or furthest == resume
    assert_partition(ledger)
    assert final_digest(job) == reference_digest(DIGEST_ARGS)


@pytest.mark.parametrize("nproc", [3, 2])
def test_straggler_waste_is_charged_to_the_slow_rank(tmp_path: Path, collector: Collector, jobs: list[Job],
                                                    nproc: int) -> None:
    sleep_s, steps, slow_rank = 0.1, 20, 1
    job = start_job(tmp_path / "job", collector.url, run_id="straggler", nproc=nproc, launch=False, args=(
        "--steps", str(steps), "--checkpoint-every", "0", "--straggler-rank", str(slow_rank),
        "--straggler-sleep", str(sleep_s)))
    jobs.append(job)
    assert job.wait() == 0, job.tail()

    ledger = fetch_ledger(collector.url, "straggler", finished)  # rank 0 reported run_end (no launcher)
    by_rank = {int(r): v for r, v in ledger["straggler_gpu_seconds_by_rank"].items()}
    straggler = ledger["waste_gpu_seconds"]["straggler"]
    assert max(by_rank, key=by_rank.__getitem__) == slow_rank
    assert by_rank[slow_rank] >= 0.9 * straggler, by_rank
    # The ledger's rule (docs/ledger.md): per step, (slowest compute - median compute) x world size. With 3
    # ranks the median is a normal rank, so the whole extra sleep counts; with 2 the median is the mean of
    # the two, so half of it does. Compute noise is a few ms per step.
    median_excess = sleep_s / 2 if nproc == 2 else 0.0
    assert straggler == pytest.approx((sleep_s - median_excess) * steps * nproc, rel=0.25)
    assert_partition(ledger)


def test_hung_rank_is_charged_from_its_last_progress_to_the_collective_timeout(
    tmp_path: Path, collector: Collector, jobs: list[Job]
) -> None:
    timeout_s, world = 4.0, 2
    job = start_job(tmp_path / "job", collector.url, run_id="hang", max_restarts=1, args=(
        "--steps", "16", "--checkpoint-every", "5", "--step-sleep", "0.02", "--hang-at-step", "8",
        "--hang-rank", "1", "--hang-mode", "stop", "--timeout-s", str(timeout_s)))
    jobs.append(job)
    (hang,) = wait_for(lambda: job.events("hang", attempt=0), 60, "rank 1 to stop itself", job)
    (error,) = wait_for(lambda: job.events("error", rank=0, attempt=0), 3 * timeout_s + 30,
                        "rank 0 to give up on the all-reduce", job)
    job.kill(hang["pid"])  # a stopped process ignores torchrun's SIGTERM; SIGKILL lets torchrun restart
    assert job.wait() == 0, job.tail()

    last_progress = max(e["end"] for e in job.events("step", attempt=0))
    expected = (error["time"] - last_progress) * world
    assert expected >= timeout_s * world * 0.9, "the job's own logs show the collective timeout"
    ledger = fetch_ledger(collector.url, "hang", finished)
    assert ledger["restarts"] == 1
    # The client stamps the step end and attempt_end microseconds to milliseconds away from the log lines.
    assert ledger["waste_gpu_seconds"]["hang"] == pytest.approx(expected, abs=0.2 * world)
    assert ledger["steps"]["kept"] == 16
    assert_partition(ledger)


def test_collector_down_for_the_first_half_loses_and_doubles_nothing(tmp_path: Path, jobs: list[Job]) -> None:
    port = free_port()  # nothing listens here until the job is under way
    job = start_job(tmp_path / "job", f"http://127.0.0.1:{port}", run_id="offline-first", launch=False, args=(
        "--steps", "60", "--checkpoint-every", "10", "--step-sleep", "0.1"))
    jobs.append(job)
    wait_for(lambda: any(e["step"] >= 5 for e in job.events("step")), 60, "step 5", job)
    collector = start_collector(tmp_path / "collector", port=port)  # 1-2 s: up by about step 20 of 60
    try:
        up_at_step = max(e["step"] for e in job.events("step"))
        assert job.wait() == 0, job.tail()
        if up_at_step >= 60:  # a very slow machine: the job ended first; its events wait in the spool
            sync = subprocess.run([*GOODPUT, "sync", str(job.workdir / "spool"), "--url", collector.url],
                                  check=False, env=env_with(), capture_output=True, text=True, timeout=120)
            assert sync.returncode == 0, sync.stdout + sync.stderr
        steps_run = job.steps_run()
        pairs = {(attempt, step) for attempt, _, step in steps_run}
        ledger = fetch_ledger(collector.url, "offline-first",
                              lambda ledger: finished(ledger) and ledger["steps"]["computed"] >= len(pairs))
        assert ledger["steps"]["computed"] == len(pairs) == 60
        assert ledger["steps"]["kept"] == 60 and ledger["steps"]["reworked"] == 0
        stored = stored_steps(collector, "offline-first")
        assert not [k for k, n in Counter(stored).items() if n > 1], "a step was stored twice"
        assert Counter((a, r) for a, r, _ in stored) == Counter((a, r) for a, r, _ in steps_run)
        assert set(stored) == steps_run
        assert_partition(ledger)
    finally:
        collector.stop()


def stored_steps(collector: Collector, run_id: str) -> list[tuple[int, int, int]]:
    """(attempt, rank, step) of every step row in the collector's database, duplicates included."""
    from services.storage.db import make_engine
    from services.storage.load import load_run_data
    from services.storage.runs import get_run

    engine = make_engine(f"sqlite:///{collector.db_path}")
    try:
        with engine.connect() as conn:
            data = load_run_data(conn, get_run(conn, run_id))
    finally:
        engine.dispose()
    return [(int(a), int(r), int(s)) for a, r, s in data.steps[["attempt", "rank", "step"]].itertuples(index=False)]


def test_checkpoint_killed_mid_write_is_torn_skipped_and_costs_checkpoint_time(
    tmp_path: Path, collector: Collector, jobs: list[Job], reference_digest: Callable[[tuple[str, ...]], str]
) -> None:
    job = start_job(tmp_path / "job", collector.url, run_id="torn", max_restarts=1, args=(
        *DIGEST_ARGS, "--checkpoint-every", "10", "--slow-checkpoint", "1.5", "--step-sleep", "0.01"))
    jobs.append(job)
    torn = wait_for(lambda: [p for p in job.ckpt_dir.glob(".tmp-ckpt-20-*")] if job.ckpt_dir.exists() else None,
                    60, "rank 0 to start writing checkpoint 20", job)[0]
    wait_for(lambda: job.events("step", step=20), 10, "step 20's log line", job)
    # Past the client's flush interval (0.2 s), so checkpoint_start is in the spool; well before the 1.5 s write ends.
    time.sleep(0.5)
    job.kill(job.pid(0, 0))
    assert job.wait() == 0, job.tail()

    assert not job.events("checkpoint", step=20, attempt=0), "the write was meant to be interrupted"
    (resumed,) = job.events("resumed", rank=0, attempt=1)
    assert resumed["step"] == 10 and resumed["checkpoint"] == "ckpt-10"
    skipped = [e["path"] for e in job.events("skipped_checkpoint", attempt=1)]
    assert torn.name in skipped, "the loader saw the torn directory and skipped it"
    ledger = fetch_ledger(collector.url, "torn", finished)
    assert ledger["restarts"] == 1 and ledger["attempts"][1]["resume_step"] == 10
    assert ledger["checkpoints"]["torn"] == 1
    assert ledger["waste_gpu_seconds"]["checkpoint"] > 0
    assert_partition(ledger)
    assert final_digest(job) == reference_digest(DIGEST_ARGS)
