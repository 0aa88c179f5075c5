"""Real Hugging Face ``Trainer`` (CPU, a tiny GPT-2 from a config, synthetic data) with goodput's callback, killed
after a checkpoint and relaunched under the same run id with ``resume_from_checkpoint``, no goodput variable set by
hand.

examples/train_huggingface.py saves every 8 steps; process 0 SIGKILLs the job once step 13 is done; the relaunch
resumes from ``checkpoint-8``. The ledger must agree with the job's own log: one restart, the resume step, the
reworked steps, the checkpoints and their blocking time; with 2 processes, two ranks. The Trainer restores the model,
optimizer, scheduler, RNG state and data position, so the digests every 4 steps match and the resume check says ok.

Under DDP the callback times collectives (a process slowed on purpose is named) and books evaluation as ``eval``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

from tests.ledger_checks import assert_partition
from tests.test_cli import REPO
from tests.torchrun.conftest import TORCHRUN, Collector, fetch_ledger
from tests.torchrun.frameworks import (
    eval_wall_seconds,
    flagged_stragglers,
    job_log,
    ledger_has_caught_up,
    run_launch,
    truth_from,
)

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
pytestmark = pytest.mark.torchrun

SCRIPT = REPO / "examples" / "train_huggingface.py"


@pytest.mark.parametrize("nproc", [1, 2])
def test_hf_trainer_killed_and_resumed_from_its_checkpoint_equals_the_jobs_log_and_the_resume_is_ok(
        tmp_path: Path, collector: Collector, nproc: int) -> None:
    run_id = f"hf-{nproc}"
    workdir = tmp_path / "job"
    workdir.mkdir()
    prefix = [*TORCHRUN, "--standalone", "--nproc-per-node", str(nproc)] if nproc > 1 else [sys.executable]
    job = [str(SCRIPT), "--steps", "20", "--save-steps", "8", "--digest-every", "4",
           "--output-dir", str(workdir / "out"), "--log-dir", str(workdir / "logs")]
    first = run_launch([*prefix, *job, "--kill-at-step", "13"], workdir, run_id=run_id, url=collector.url)
    assert first.returncode != 0, first.output[-3000:]
    second = run_launch([*prefix, *job], workdir, run_id=run_id, url=collector.url)
    assert second.returncode == 0, second.output[-3000:]

    truth = truth_from(job_log(workdir / "logs"))
    assert truth.launches == 2 and truth.ranks == set(range(nproc))
    assert truth.resume_steps == {0: {0}, 1: {8}}, truth.resume_steps
    ledger = fetch_ledger(collector.url, run_id, ledger_has_caught_up(truth))
    assert ledger["restarts"] == 1
    assert [a["world_size"] for a in ledger["attempts"]] == [nproc, nproc]
    assert ledger["attempts"][1]["resume_step"] == 8
    assert ledger["steps"]["reworked"] == len(truth.reworked_steps), (ledger["steps"], truth.reworked_steps)
    checkpoints = ledger["checkpoints"]
    assert checkpoints["count"] == checkpoints["ok"] == len(truth.checkpoint_steps), (checkpoints, truth)
    assert checkpoints["median_blocking_seconds"] == pytest.approx(truth.median_blocking_s, abs=0.02), (
        checkpoints, truth)
    assert_partition(ledger)

    check = httpx.get(f"{collector.url}/v1/runs/{run_id}/resume-check", timeout=60).json()
    assert check["verdict"] == "ok", check["findings"]
    (resume,) = check["resumes"]
    assert resume["resume_step"] == 8 and resume["checkpoint_attempt"] == 0, resume
    # something was compared: the digest at step 12 on every rank, and the logged losses and learning rates
    assert resume["compared"]["digest"] == nproc and resume["compared"]["loss"] > 0 < resume["compared"]["lr"], resume
    assert resume["compared"]["digest_at_load"] == nproc, resume  # the state loaded against the one saved at 8


def test_hf_trainer_under_ddp_names_the_slowed_process_and_books_evaluation_as_eval(tmp_path: Path,
                                                                                   collector: Collector) -> None:
    run_id, workdir = "hf-slow-rank", tmp_path / "job"
    workdir.mkdir()
    run = run_launch([*TORCHRUN, "--standalone", "--nproc-per-node", "2", str(SCRIPT), "--steps", "30",
                      "--save-steps", "100", "--straggler-rank", "1", "--straggler-sleep", "0.05",
                      "--eval-steps", "10", "--eval-sleep", "0.05", "--output-dir", str(workdir / "out"),
                      "--log-dir", str(workdir / "logs")], workdir, run_id=run_id, url=collector.url)
    assert run.returncode == 0, run.output[-3000:]
    eval_s, evaluations = eval_wall_seconds(job_log(workdir / "logs"))
    assert evaluations >= 2, "the job evaluated between its steps"

    ledger = fetch_ledger(collector.url, run_id, lambda ledger: ledger["status"] == "finished")
    assert_partition(ledger)
    assert ledger["steps"]["kept"] == 30
    # evaluation is its own figure (it was idle); the callback's span starts after the step's training log, just
    # before Trainer.evaluate, and ends at on_evaluate, just before it returns
    assert ledger["eval_gpu_seconds"] == pytest.approx(2 * eval_s, abs=2 * 0.03 * evaluations), (ledger, eval_s)
    flagged, painted, report = flagged_stragglers(collector.url, run_id)
    assert flagged == painted == [1], report["ranks"]  # collectives timed under the Trainer: the slow process
