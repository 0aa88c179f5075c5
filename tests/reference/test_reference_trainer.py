"""The reference resume experiments (../shared/reference/resume-experiments.md) against a real `goodput serve`.

examples/reference_trainer.py runs as real processes at the client's default settings (flush interval and all):
attempt 0 dies by `os._exit(137)` (as a SIGKILL: no handler, no flush) after step 275 or 251, or half-way through
the step-300 checkpoint; attempt 1 (TORCHELASTIC_RESTART_COUNT=1, the same run id) resumes from the checkpoint at
250 and trains to step 600. Expected values come from the trainer's own JSON log, never from guesses about timing.

Where the kill falls decides what reaches the collector: right after the checkpoint (step 250), or 25 fast steps
later (no sleep: all of them in the killed process's last flush interval), no recomputed step arrives, and only
the digest of the loaded state (`tracker.resumed(..., digest=...)`) against the writer's digest of step 250 (on
disk with the checkpoint) can tell an exact resume from one that lost a piece of the state.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.test_cli import REPO, env_with
from tests.torchrun.conftest import Collector, start_collector

TRAINER = REPO / "examples" / "reference_trainer.py"


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Collector]:
    c = start_collector(tmp_path_factory.mktemp("collector"))
    yield c
    c.stop()


@dataclass
class Experiment:
    run_id: str
    log_path: Path

    def logs(self, event: str, **match: Any) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_text().splitlines():
            row = json.loads(line)
            if row["event"] == event and all(row.get(k) == v for k, v in match.items()):
                out.append(row)
        return out

    def losses(self, attempt: int) -> dict[int, float]:
        return {e["step"]: e["loss"] for e in self.logs("step", attempt=attempt)}

    def first_different_loss(self) -> int:
        """The first step attempt 1 computed whose loss differs from attempt 0's (the trainer's own numbers)."""
        before, after = self.losses(0), self.losses(1)
        return min(s for s, loss in after.items() if s in before and before[s] != loss)

    def final_weights(self) -> str:
        (done,) = self.logs("done")
        return str(done["weights"])


def run_attempt(workdir: Path, url: str | None, run_id: str, attempt: int, *args: str) -> int:
    # One launch whose worker torchrun restarted: the same launch id, the restart count moving on (a process
    # with a launch of its own would be a relaunch, numbered after the attempts of the earlier launches).
    env = env_with(GOODPUT_RUN_ID=run_id, GOODPUT_SPOOL_DIR=str(workdir / "spool"),
                   GOODPUT_LAUNCH_ID=f"reference-{workdir.name}", TORCHELASTIC_RESTART_COUNT=str(attempt))
    if url is None:
        env["GOODPUT_MODE"] = "disabled"
    else:
        env["GOODPUT_URL"] = url
    with open(workdir / f"attempt{attempt}.out", "wb") as out:
        return subprocess.run([sys.executable, str(TRAINER), "--ckpt-dir", str(workdir / "ckpt"),
                               "--log", str(workdir / "train.jsonl"), *args], env=env, cwd=workdir, stdout=out,
                              stderr=subprocess.STDOUT, timeout=180).returncode


def crash_and_resume(tmp_path: Path, collector: Collector, run_id: str, crash: tuple[str, ...],
                     resume: tuple[str, ...] = (), writer: str = "atomic") -> tuple[Experiment, dict[str, Any]]:
    """Attempt 0 with the crash, attempt 1 resuming; then the collector's resume check of the finished run."""
    workdir = tmp_path / run_id
    workdir.mkdir()
    common = ("--writer", writer)
    assert run_attempt(workdir, collector.url, run_id, 0, *common, *crash) == 137
    assert run_attempt(workdir, collector.url, run_id, 1, *common, *resume) == 0, (
        (workdir / "attempt1.out").read_text())
    run = httpx.get(f"{collector.url}/v1/runs/{run_id}", timeout=30).json()
    assert run["status"] == "finished", run  # finish() without `goodput launch` ends the run
    response = httpx.get(f"{collector.url}/v1/runs/{run_id}/resume-check", timeout=60)
    assert response.status_code == 200, response.text
    return Experiment(run_id=run_id, log_path=workdir / "train.jsonl"), response.json()


@pytest.fixture(scope="module")
def reference_weights(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Experiment 1: 600 steps uninterrupted (not reported)."""
    workdir = tmp_path_factory.mktemp("reference")
    assert run_attempt(workdir, None, "reference", 0, "--step-sleep", "0") == 0
    return Experiment(run_id="reference", log_path=workdir / "train.jsonl").final_weights()


def codes(check: dict[str, Any]) -> set[str]:
    return {f["code"] for f in check["findings"]}


@pytest.mark.parametrize("crash_at", [275, 251])
def test_an_exact_resume_after_a_crash_is_not_flagged(tmp_path: Path, collector: Collector, reference_weights: str,
                                                      crash_at: int) -> None:
    exp, check = crash_and_resume(tmp_path, collector, f"exact-{crash_at}", ("--crash-at", str(crash_at)))
    (resumed,) = exp.logs("resumed", attempt=1)
    assert (resumed["step"], resumed["checkpoint"]) == (250, "step-250")
    assert exp.final_weights() == reference_weights
    before, after = exp.losses(0), exp.losses(1)
    assert [after[s] for s in range(251, crash_at + 1)] == [before[s] for s in range(251, crash_at + 1)]
    assert check["verdict"] == "ok", check["findings"]
    (summary,) = check["resumes"]
    assert summary["resume_step"] == 250 and summary["checkpoint_attempt"] == 0, summary
    if crash_at == 275:  # the steps of the last flush interval before the kill may be lost, the earlier ones not
        assert summary["compared"]["loss"] >= 5 and summary["compared"]["digest"] >= 1, summary


@pytest.mark.parametrize("lost", ["momentum", "rng", "data", "step"])
def test_a_resume_that_discards_part_of_the_state_is_flagged(tmp_path: Path, collector: Collector,
                                                              reference_weights: str, lost: str) -> None:
    exp, check = crash_and_resume(tmp_path, collector, f"discard-{lost}", ("--crash-at", "275"),
                                  ("--discard", lost))
    assert exp.final_weights() != reference_weights  # it trained on, with a plausible loss and no error
    assert check["verdict"] == "flagged"
    assert {"loss_mismatch", "digest_mismatch"} <= codes(check), check["findings"]
    loss = next(f for f in check["findings"] if f["code"] == "loss_mismatch")
    first = exp.first_different_loss()
    assert loss["attempt"] == 1 and min(loss["steps"]) == first, (loss, first)
    example = loss["examples"][0]
    assert example["step"] == first and example["expected_attempt"] == 0
    assert example["expected"] == exp.losses(0)[first] and example["got"] == exp.losses(1)[first]
    if lost == "step":  # it loaded the checkpoint of step 250 and counted from 0
        assert first == 1
        wrong = next(f for f in check["findings"] if f["code"] == "resume_not_a_checkpoint")
        assert wrong["evidence"] == {"resume_step": 0, "checkpoint_step": 250}, wrong


@pytest.mark.parametrize(("writer", "flagged"), [("naive", True), ("atomic", False)])
def test_a_torn_checkpoint_write_is_flagged_only_when_the_loader_took_it(
        tmp_path: Path, collector: Collector, reference_weights: str, writer: str, flagged: bool) -> None:
    exp, check = crash_and_resume(tmp_path, collector, f"torn-{writer}", ("--crash-in-checkpoint", "300"),
                                  writer=writer)
    (crash,) = exp.logs("crash", attempt=0)
    assert (crash["step"], crash["where"]) == (300, "checkpoint")
    (resumed,) = exp.logs("resumed", attempt=1)
    assert resumed["step"] == 250  # the naive loader believes the old metadata; the atomic one falls back
    assert (exp.final_weights() == reference_weights) is not flagged
    assert check["verdict"] == ("flagged" if flagged else "ok"), check["findings"]
    if flagged:
        loss = next(f for f in check["findings"] if f["code"] == "loss_mismatch")
        assert min(loss["steps"]) == exp.first_different_loss() == 251


# -- wherever the kill falls: checked at load ----------------------------------------------------------------------

KILLS = {
    "right-after-the-checkpoint": ("--crash-at", "250", "--step-sleep", "0"),
    "25-fast-steps-later": ("--crash-at", "275", "--step-sleep", "0"),
}
FAST = ("--step-sleep", "0")


def saved_digest(exp: Experiment) -> str:
    """The trainer's own digest of its state after step 250 in attempt 0 (what it checkpointed)."""
    (row,) = exp.logs("step", attempt=0, step=250)
    return str(row["digest"])


def killed_at(exp: Experiment) -> int:
    (crash,) = exp.logs("crash", attempt=0)
    return int(crash["step"])


@pytest.mark.parametrize("kill", list(KILLS))
def test_an_exact_resume_is_verified_at_load_and_not_flagged_wherever_the_kill_falls(
        tmp_path: Path, collector: Collector, reference_weights: str, kill: str) -> None:
    exp, check = crash_and_resume(tmp_path, collector, f"exact-at-load-{kill}", KILLS[kill], FAST)
    assert check["verdict"] == "ok", check
    (summary,) = check["resumes"]
    assert summary.get("verified") and summary["compared"].get("digest_at_load") == 1, summary
    (resumed,) = exp.logs("resumed", attempt=1)
    assert (resumed["step"], resumed["checkpoint"], killed_at(exp)) == (250, "step-250", int(KILLS[kill][1]))
    assert resumed["digest"] == saved_digest(exp) and exp.final_weights() == reference_weights


@pytest.mark.parametrize("kill", list(KILLS))
@pytest.mark.parametrize("lost", ["momentum", "rng", "data", "step"])
def test_a_resume_that_discards_part_of_the_state_is_flagged_at_load_wherever_the_kill_falls(
        tmp_path: Path, collector: Collector, reference_weights: str, lost: str, kill: str) -> None:
    exp, check = crash_and_resume(tmp_path, collector, f"discard-at-load-{lost}-{kill}", KILLS[kill],
                                  ("--discard", lost, *FAST))
    assert exp.final_weights() != reference_weights  # it trained on, with a plausible loss and no error
    assert check["verdict"] == "flagged", check
    (resumed,) = exp.logs("resumed", attempt=1)
    assert resumed["checkpoint_step"] == 250 and resumed["digest"] != saved_digest(exp)
    at_load = next(f for f in check["findings"] if f["code"] == "digest_mismatch_at_load")
    assert at_load["attempt"] == 1 and at_load["steps"] == [250] and at_load["ranks"] == [0], at_load
    assert at_load["examples"][0] == {"rank": 0, "step": 250, "expected": saved_digest(exp),
                                      "got": resumed["digest"], "expected_attempt": 0}
    assert at_load["evidence"]["resume_step"] == resumed["step"] == (0 if lost == "step" else 250)


@pytest.mark.parametrize(("writer", "flagged"), [("naive", True), ("atomic", False)])
def test_a_torn_checkpoint_write_is_judged_at_load(tmp_path: Path, collector: Collector, reference_weights: str,
                                                   writer: str, flagged: bool) -> None:
    exp, check = crash_and_resume(tmp_path, collector, f"torn-at-load-{writer}", ("--crash-in-checkpoint", "300",
                                                                                  *FAST), FAST, writer=writer)
    assert check["verdict"] == ("flagged" if flagged else "ok"), check
    (summary,) = check["resumes"]
    assert summary["compared"].get("digest_at_load") == 1, summary
    (resumed,) = exp.logs("resumed", attempt=1)
    assert resumed["step"] == 250 and (resumed["digest"] != saved_digest(exp)) is flagged
    assert (exp.final_weights() == reference_weights) is not flagged
    codes_found = codes(check)
    assert ("digest_mismatch_at_load" in codes_found) is flagged, check["findings"]


@pytest.mark.parametrize("kill", list(KILLS))
def test_without_digests_a_resume_nothing_was_compared_for_is_unverified_never_ok(
        tmp_path: Path, collector: Collector, kill: str) -> None:
    no_digests = ("--digest-every", "0")
    exp, check = crash_and_resume(tmp_path, collector, f"no-digests-{kill}", (*KILLS[kill], *no_digests),
                                  ("--discard", "momentum", *FAST, *no_digests))
    (summary,) = check["resumes"]
    assert summary["compared"].get("digest_at_load", 0) == 0 and summary["compared"]["digest"] == 0
    if summary["compared"]["loss"] == 0:  # none of the killed attempt's steps after 250 arrived (the case)
        assert check["verdict"] == "unverified" and check["findings"] == [], check
        assert not summary["verified"] and "no recomputed step and no digest at load arrived" in check["reason"]
    else:  # a flush fell between the checkpoint and the kill: the recomputed steps tell
        assert killed_at(exp) == 275 and check["verdict"] == "flagged", check
