"""Real PyTorch Lightning (2 CPU processes, DDP over gloo) with goodput's callback, killed after a checkpoint and
relaunched under the same run id with Lightning's own resume (``ckpt_path="last"``), no goodput variable set by hand.

examples/train_lightning.py checkpoints every 10 steps (a ``save_last`` copy too: two writes per step), and rank 0
SIGKILLs the job once step 25 is done, in its second epoch. The relaunch resumes from ``last.ckpt`` (step 20). The
ledger must agree with the job's own log: one restart, the resume step, the reworked steps, the checkpoints (one per
step, the duplicate counted once) and their blocking time; two ranks as two ranks. The example's data loader resumes
mid-epoch (its position is in the checkpoint), so the digests every 4 steps and the losses after the resume are the
killed run's and the resume check says ok; so it does from a checkpoint at the epoch's end.

Under DDP the callback times collectives (a rank slowed on purpose is named) and books validation as ``eval``.
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

pytest.importorskip("lightning")
pytestmark = pytest.mark.torchrun

SCRIPT = REPO / "examples" / "train_lightning.py"
STEPS_PER_EPOCH = 16  # 512 samples / 2 ranks / batch 16


def _job_args(workdir: Path, *, checkpoint_every: int, kill_at: int | None) -> list[str]:
    return [str(SCRIPT), "--devices", "2", "--steps", "32", "--checkpoint-every", str(checkpoint_every),
            "--digest-every", "4", "--step-sleep", "0.01", "--ckpt-dir", str(workdir / "ckpt"),
            "--log-dir", str(workdir / "logs"), *(["--kill-at-step", str(kill_at)] if kill_at else [])]


def _killed_and_relaunched(workdir: Path, collector: Collector, run_id: str, *, torchrun: bool,
                           checkpoint_every: int, kill_at: int) -> None:
    workdir.mkdir(parents=True)
    prefix = [*TORCHRUN, "--standalone", "--nproc-per-node", "2"] if torchrun else [sys.executable]
    first = run_launch([*prefix, *_job_args(workdir, checkpoint_every=checkpoint_every, kill_at=kill_at)], workdir,
                       run_id=run_id, url=collector.url)
    assert first.returncode != 0, first.output[-3000:]
    second = run_launch([*prefix, *_job_args(workdir, checkpoint_every=checkpoint_every, kill_at=None)], workdir,
                        run_id=run_id, url=collector.url)
    assert second.returncode == 0, second.output[-3000:]


def _check_ledger_against_log(collector: Collector, run_id: str, workdir: Path, resume_step: int) -> None:
    truth = truth_from(job_log(workdir / "logs"))
    assert truth.launches == 2 and truth.ranks == {0, 1}
    assert truth.resume_steps == {0: {0}, 1: {resume_step}}, truth.resume_steps

    try:
        ledger = fetch_ledger(collector.url, run_id, ledger_has_caught_up(truth))
    except AssertionError as exc:
        raise AssertionError(f"checkpoints the job logged (launch, step): {sorted(truth.checkpoint_steps)}; "
                             f"the collector's (attempt, step, ok, torn): {_checkpoint_rows(collector, run_id)}; "
                             f"reworked steps logged: {sorted(truth.reworked_steps)}; {exc}"[:6000]) from None
    assert ledger["restarts"] == 1
    assert [a["world_size"] for a in ledger["attempts"]] == [2, 2]
    assert ledger["attempts"][1]["resume_step"] == resume_step
    assert ledger["steps"]["reworked"] == len(truth.reworked_steps), (ledger["steps"], truth.reworked_steps)
    checkpoints = ledger["checkpoints"]
    assert checkpoints["count"] == checkpoints["ok"] == len(truth.checkpoint_steps), (
        checkpoints, sorted(truth.checkpoint_steps), _checkpoint_rows(collector, run_id))
    assert checkpoints["median_blocking_seconds"] == pytest.approx(truth.median_blocking_s, abs=0.02), (
        checkpoints, truth)
    assert_partition(ledger)
    ranks = httpx.get(f"{collector.url}/v1/runs/{run_id}/ranks", timeout=30)
    assert ranks.status_code == 200, ranks.text
    assert "1" in ranks.text  # rank 1 reported as itself (was: both processes rank 0)


def _checkpoint_rows(collector: Collector, run_id: str) -> list[tuple[int, int, bool, bool]]:
    """(attempt, step, ok, torn) of each checkpoint the collector holds, for a failure message short enough to read."""
    listed = httpx.get(f"{collector.url}/v1/runs/{run_id}/checkpoints", timeout=30).json()["checkpoints"]
    return [(c["attempt"], c["step"], c["ok"], c["torn"]) for c in listed]


@pytest.mark.parametrize("torchrun", [False, True], ids=["lightning-launcher", "torchrun"])
def test_lightning_killed_mid_epoch_and_relaunched_equals_the_jobs_log_and_resumes_exactly(
        tmp_path: Path, collector: Collector, torchrun: bool) -> None:
    run_id = f"lightning-{'torchrun' if torchrun else 'own'}"
    _killed_and_relaunched(tmp_path / "job", collector, run_id, torchrun=torchrun, checkpoint_every=10, kill_at=25)
    _check_ledger_against_log(collector, run_id, tmp_path / "job", resume_step=20)
    check = httpx.get(f"{collector.url}/v1/runs/{run_id}/resume-check", timeout=60).json()
    assert check["verdict"] == "ok", check["findings"]  # the loader resumed at step 20's batch of epoch 1
    (resume,) = check["resumes"]
    # compared: the digest at step 24 on both ranks, and the losses of the recomputed steps 21-25
    assert resume["compared"]["digest"] == 2 and resume["compared"]["loss"] >= 2 * 4, resume
    # and what the checkpoint saved was loaded exactly: checked at load, on both ranks
    assert resume["compared"]["digest_at_load"] == 2, resume


def test_lightning_resumed_from_an_epoch_end_checkpoint_is_an_exact_resume(tmp_path: Path,
                                                                           collector: Collector) -> None:
    _killed_and_relaunched(tmp_path / "job", collector, "lightning-epoch-end", torchrun=False,
                           checkpoint_every=STEPS_PER_EPOCH, kill_at=STEPS_PER_EPOCH + 5)
    _check_ledger_against_log(collector, "lightning-epoch-end", tmp_path / "job", resume_step=STEPS_PER_EPOCH)
    check = httpx.get(f"{collector.url}/v1/runs/lightning-epoch-end/resume-check", timeout=60).json()
    assert check["verdict"] == "ok", check["findings"]
    (resume,) = check["resumes"]
    assert resume["compared"]["digest"] == 2 and resume["compared"]["loss"] > 0, resume  # step 20, both ranks
    assert resume["compared"]["digest_at_load"] == 2, resume  # the digest taken at the checkpoint, both ranks


def test_lightning_under_ddp_names_the_slowed_rank_and_books_validation_as_eval(tmp_path: Path,
                                                                               collector: Collector) -> None:
    run_id, workdir = "lightning-slow-rank", tmp_path / "job"
    workdir.mkdir()
    run = run_launch([sys.executable, str(SCRIPT), "--devices", "2", "--steps", "30", "--checkpoint-every", "100",
                      "--step-sleep", "0.01", "--straggler-rank", "1", "--straggler-sleep", "0.05",
                      "--val-every", "10", "--val-sleep", "0.05", "--ckpt-dir", str(workdir / "ckpt"),
                      "--log-dir", str(workdir / "logs")], workdir, run_id=run_id, url=collector.url)
    assert run.returncode == 0, run.output[-3000:]
    eval_s, evaluations = eval_wall_seconds(job_log(workdir / "logs"))
    assert evaluations >= 2, "the job validated between its steps"

    ledger = fetch_ledger(collector.url, run_id, lambda ledger: ledger["status"] == "finished")
    assert_partition(ledger)
    assert ledger["steps"]["kept"] == 30
    # validation is its own figure (it was idle): the job's own spans, first rank's start to last rank's end, x 2
    assert ledger["eval_gpu_seconds"] == pytest.approx(2 * eval_s, abs=2 * 0.02 * evaluations), (ledger, eval_s)
    flagged, painted, report = flagged_stragglers(collector.url, run_id)
    assert flagged == painted == [1], report["ranks"]  # collectives timed under Trainer: the slow rank is named
