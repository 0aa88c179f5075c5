"""Helpers for the framework tests: a job script run twice under one run id, and its own log as the truth.

The job (examples/train_lightning.py, examples/train_huggingface.py) appends JSON lines per rank: ``start``,
``resumed``, ``step`` (start/end), ``save`` (start/end of each checkpoint write call), ``kill``, ``done``. A launch
is one run of the command; launch N of the test is goodput's attempt N (no restarts inside a launch here).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.test_cli import env_with


@dataclass(frozen=True)
class Launch:
    command: list[str]
    returncode: int
    output: str


def run_launch(command: list[str], workdir: Path, *, run_id: str, url: str, timeout_s: float = 120.0,
               extra_env: dict[str, str] | None = None) -> Launch:
    """Run one launch of the job in its own session (its SIGKILL of its process group stays inside it)."""
    env = env_with(GOODPUT_RUN_ID=run_id, GOODPUT_URL=url, GOODPUT_SPOOL_DIR=str(workdir / "spool"),
                   OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
                   TOKENIZERS_PARALLELISM="false", **(extra_env or {}))
    proc = subprocess.Popen(command, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(
            f"{command} still running after {timeout_s} s\n{out.decode(errors='replace')[-4000:]}") from None
    finally:
        kill_group(proc.pid)
    return Launch(command=command, returncode=proc.returncode, output=out.decode(errors="replace"))


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def job_log(log_dir: Path) -> list[dict[str, Any]]:
    """Every rank's lines in file order, each tagged with its launch (count of ``start`` lines of that rank)."""
    out: list[dict[str, Any]] = []
    for path in sorted(log_dir.glob("rank*.jsonl")):
        launch = -1
        for line in path.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event["event"] == "start":
                launch += 1
            out.append({**event, "launch": launch})
    return out


@dataclass(frozen=True)
class Truth:
    """What the job's log says about its launches."""

    launches: int
    ranks: set[int]
    resume_steps: dict[int, set[int]]  # launch -> the steps its ranks resumed at
    reworked_steps: set[int]  # steps done in a launch after the checkpoint the next launch resumed from
    checkpoint_steps: set[tuple[int, int]]  # (launch, step) with at least one save
    median_blocking_s: float  # per (launch, step): first save start to last save end over ranks and duplicates


def truth_from(log: list[dict[str, Any]]) -> Truth:
    launches = 1 + max(e["launch"] for e in log)
    resume_steps = {n: {e["step"] for e in log if e["event"] == "resumed" and e["launch"] == n}
                    for n in range(launches)}
    reworked: set[int] = set()
    for n in range(launches - 1):
        (resume,) = resume_steps[n + 1]
        reworked |= {e["step"] for e in log if e["event"] == "step" and e["launch"] == n and e["step"] > resume}
    saves: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for e in log:
        if e["event"] == "save":
            saves.setdefault((e["launch"], e["step"]), []).append(e)
    spans = [max(s["end"] for s in group) - min(s["start"] for s in group) for group in saves.values()]
    return Truth(launches=launches, ranks={e["rank"] for e in log}, resume_steps=resume_steps,
                 reworked_steps=reworked, checkpoint_steps=set(saves),
                 median_blocking_s=statistics.median(spans) if spans else 0.0)


def ledger_has_caught_up(truth: Truth) -> Callable[[dict[str, Any]], bool]:
    """Whether a ledger holds everything the job logged: the run ended, each launch an attempt, the reworked steps
    and every checkpoint complete. Each rank sends its own stream (and a restarted process replays the killed
    one's spool), so rank 0's run end can be stored before another rank's last records: wait for them all."""

    def caught_up(ledger: dict[str, Any]) -> bool:
        checkpoints = ledger["checkpoints"]
        return (ledger["status"] == "finished" and len(ledger["attempts"]) == truth.launches
                and ledger["steps"]["reworked"] == len(truth.reworked_steps)
                and checkpoints["count"] == checkpoints["ok"] == len(truth.checkpoint_steps))

    return caught_up


def eval_wall_seconds(log: list[dict[str, Any]]) -> tuple[float, int]:
    """(wall seconds of the job's evaluations, how many): per (launch, step), the first rank's ``eval`` start to the
    last rank's end, as the ledger spans a phase the ranks share."""
    spans: dict[tuple[int, int], tuple[float, float]] = {}
    for e in log:
        if e["event"] == "eval":
            lo, hi = spans.get((e["launch"], e["step"]), (e["start"], e["end"]))
            spans[(e["launch"], e["step"])] = (min(lo, e["start"]), max(hi, e["end"]))
    return sum(hi - lo for lo, hi in spans.values()), len(spans)


def flagged_stragglers(url: str, run_id: str) -> tuple[list[int], list[int], dict[str, Any]]:
    """(ranks /stragglers flags, ranks the run page paints as stragglers, the report)."""
    report = httpx.get(f"{url}/v1/runs/{run_id}/stragglers", timeout=30).json()
    view = httpx.get(f"{url}/v1/runs/{run_id}/view", timeout=60).json()
    return [r["rank"] for r in report["ranks"] if r["flagged"]], view["ranks"]["straggler_ranks"], report
