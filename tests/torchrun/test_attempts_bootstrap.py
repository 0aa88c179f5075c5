"""An attempt that dies inside `init_process_group`, before the script could call `goodput.init()`: under
`goodput launch` the bootstrap recorded it as the interpreter started, so it is a restart and its time is
startup/failure cost, not idle. With `--no-bootstrap` it is invisible, as it was before the bootstrap."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.ledger_checks import assert_partition
from tests.torchrun.attempts import Agent, generations_from_logs, run_standalone
from tests.torchrun.conftest import Collector, fetch_ledger, fetch_run

pytestmark = pytest.mark.torchrun

NPROC, STEPS = 2, 10


def run_job(tmp_path: Path, collector: Collector, run_id: str, launch_args: tuple[str, ...] = ()) -> Agent:
    return run_standalone(tmp_path, collector.url, run_id=run_id, nproc=NPROC, steps=STEPS, max_restarts=3,
                          job_args=["--die-in-init", "1"], launch_args=launch_args)


def test_an_attempt_that_dies_in_init_process_group_is_a_restart_booked_as_startup(
    tmp_path: Path, collector: Collector
) -> None:
    agent = run_job(tmp_path, collector, "dies-in-init")
    generations = generations_from_logs(tmp_path / "logs")
    assert agent.rounds() == len(generations) >= 2, agent.tail()
    first, last = generations[0], generations[-1]
    assert first.joined_ranks == frozenset() and first.steps == {}, "generation 0 never got through init"
    assert max(last.step_spans) == STEPS
    # gloo's connectFullMesh may fail right after a restart: such a generation is real and counted too.
    ledger = fetch_ledger(collector.url, "dies-in-init", lambda ledger: ledger["status"] == "finished"
                          and len(ledger["attempts"]) >= len(generations))
    assert ledger["restarts"] == fetch_run(collector.url, "dies-in-init")["restarts"] == len(generations) - 1
    attempts = ledger["attempts"]
    assert [a["attempt"] for a in attempts] == [g.number for g in generations]
    for attempt, gen in zip(attempts[:-1], generations[:-1], strict=True):
        if not gen.steps:  # died before its first step: failed, and all of its time is startup/failure cost
            assert attempt["failed"] and attempt["first_step"] is None, attempt
            spent = attempt["gpu_seconds"]
            assert spent.get("idle", 0.0) == pytest.approx(0.0, abs=1e-6), spent
            assert spent.get("productive", 0.0) == 0.0, spent
    # From the first worker's start to the last generation's first step, the job was starting or failing.
    first_step_start = min(lo for lo, _ in last.step_spans.values())
    before_training_s = (first_step_start - first.start) * NPROC
    failure_cost = sum(v for k, v in ledger["waste_gpu_seconds"].items() if k not in ("idle", "rework", "straggler"))
    assert failure_cost >= 0.9 * before_training_s, (ledger["waste_gpu_seconds"], before_training_s)
    assert_partition(ledger)


def test_without_the_bootstrap_an_attempt_that_dies_before_init_is_not_seen(
    tmp_path: Path, collector: Collector
) -> None:
    agent = run_job(tmp_path, collector, "no-bootstrap", launch_args=("--no-bootstrap",))
    generations = generations_from_logs(tmp_path / "logs")
    assert agent.rounds() == len(generations) >= 2, agent.tail()
    ledger = fetch_ledger(collector.url, "no-bootstrap", lambda ledger: ledger["status"] == "finished")
    reached_init = [g for g in generations if g.joined_ranks]
    assert ledger["restarts"] == len(reached_init) - 1 < len(generations) - 1
    assert_partition(ledger)
