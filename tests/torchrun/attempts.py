"""Helpers of the attempt tests: tests/torchrun/attempts_job.py under one or two torchrun agents, and the truth
that the job's logs and torchrun's own output give about its worker generations."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.test_cli import GOODPUT, env_with
from tests.torchrun.conftest import TORCHRUN, json_lines

JOB = Path(__file__).resolve().parent / "attempts_job.py"
_ROUND_RE = re.compile(r"Rendezvous complete for workers")


@dataclass
class Agent:
    """One `goodput launch -- torchrun ...` (one node), in its own process group."""

    node: str
    proc: subprocess.Popen[bytes]
    output: Path

    def text(self) -> str:
        return self.output.read_text(errors="replace") if self.output.exists() else ""

    def rounds(self) -> int:
        """How many times this agent completed a rendezvous and started its worker group (torchrun's log)."""
        return len(_ROUND_RE.findall(self.text()))

    def tail(self, lines: int = 60) -> str:
        return f"--- {self.node} ---\n" + "\n".join(self.text().splitlines()[-lines:])


def start_agent(workdir: Path, url: str, *, run_id: str, node: str, torchrun_args: list[str], job_args: list[str],
                launch_args: tuple[str, ...] = (), extra_env: dict[str, str] | None = None, host: str | None = None,
                spool: str | None = None, launch: bool = True) -> Agent:
    """`goodput launch -- torchrun ...` (`launch`: else torchrun alone) for one node. `host`: its own host name (a
    UTS namespace: another machine, as far as the job and goodput can tell); `spool`: its spool directory's name
    under `workdir` (default `spool-<node>`)."""
    workdir.mkdir(parents=True, exist_ok=True)
    # TORCH_DISABLE_SHARE_RDZV_TCP_STORE: each round's rank 0 hosts a new store for init_process_group. With the
    # agent's store shared across rounds, a new round's gloo reads the previous round's addresses and times out.
    env = env_with(GOODPUT_RUN_ID=run_id, GOODPUT_URL=url, GOODPUT_SPOOL_DIR=str(workdir / (spool or f"spool-{node}")),
                   ATTEMPTS_JOB_NODE=node, OMP_NUM_THREADS="1", LOGLEVEL="INFO",
                   TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", **(extra_env or {}))
    command = [*TORCHRUN, *torchrun_args, "--monitor-interval", "0.1", str(JOB), *job_args]
    if launch:
        command = [*GOODPUT, "launch", *launch_args, "--", *command]
    if host is not None:  # torchrun and gloo then find no address by this name: they use 127.0.0.1
        env["GLOO_SOCKET_IFNAME"] = "lo"
        command = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', host, *command]
    output = workdir / f"torchrun-{node}{'-' + host if host else ''}.out"
    with open(output, "wb") as out:
        proc = subprocess.Popen(command, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    return Agent(node=node, proc=proc, output=output)


def run_standalone(workdir: Path, url: str, *, run_id: str, nproc: int, steps: int, max_restarts: int,
                   job_args: list[str], launch_args: tuple[str, ...] = (),
                   extra_env: dict[str, str] | None = None) -> Agent:
    """The job for `steps` steps, no checkpoints, under `goodput launch -- torchrun --standalone` with `nproc`
    workers and up to `max_restarts` restarts, run until torchrun exits 0 (3 min at most); its logs in
    `workdir/logs`, its workers stopped after."""
    log_dir = workdir / "logs"
    job_args = ["--log-dir", str(log_dir), "--ckpt-dir", str(workdir / "ckpt"), "--steps", str(steps),
                "--checkpoint-every", "0", *job_args]
    torchrun = ["--standalone", "--nproc-per-node", str(nproc), "--max-restarts", str(max_restarts)]
    agent = start_agent(workdir, url, run_id=run_id, node="n", torchrun_args=torchrun, job_args=job_args,
                        launch_args=launch_args, extra_env=extra_env)
    try:
        assert agent.proc.wait(timeout=180) == 0, agent.tail()
    finally:
        stop_agents([agent], log_dir)
    return agent


def stop_agents(agents: list[Agent], log_dir: Path) -> None:
    """SIGKILL every worker the logs name (if the pid is still an attempts_job.py) and each agent's group."""
    for line in job_lines(log_dir):
        if line["event"] == "start":
            with contextlib.suppress(OSError):
                if b"attempts_job.py" in Path(f"/proc/{line['pid']}/cmdline").read_bytes():
                    os.kill(int(line["pid"]), signal.SIGKILL)
    for agent in agents:
        if agent.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(agent.proc.pid, signal.SIGKILL)
            agent.proc.wait(timeout=30)


def job_lines(log_dir: Path) -> list[dict[str, Any]]:
    return json_lines(sorted(log_dir.glob("*-local*.jsonl")))


@dataclass(frozen=True)
class Generation:
    """One round of the worker group as the job logged it."""

    number: int
    processes: int  # worker processes started
    joined_ranks: frozenset[int]  # ranks that got through init_process_group
    resume_step: int | None
    steps: dict[int, set[int]]  # rank -> steps it completed
    step_spans: dict[int, tuple[float, float]]  # step -> (first start, last end) over ranks
    start: float  # the first process start


def generations_from_logs(log_dir: Path) -> list[Generation]:
    """Worker processes in start order per (node, local rank): the k-th one of each belongs to round k (torchrun
    starts one process per local rank per round on every agent; the tests check this against its output)."""
    by_process: dict[tuple[str, int, int], list[dict[str, Any]]] = defaultdict(list)
    for line in job_lines(log_dir):
        by_process[(line["node"], line["local_rank"], line["pid"])].append(line)
    starts: dict[tuple[str, int], list[tuple[float, tuple[str, int, int]]]] = defaultdict(list)
    for key, lines in by_process.items():
        (start,) = [x for x in lines if x["event"] == "start"]
        starts[key[:2]].append((start["time"], key))
    numbered: dict[int, list[tuple[str, int, int]]] = defaultdict(list)
    for seq in starts.values():
        for number, (_, key) in enumerate(sorted(seq)):
            numbered[number].append(key)
    out = []
    for number in sorted(numbered):
        keys = numbered[number]
        lines = [x for key in keys for x in by_process[key]]
        resumes = {x["step"] for x in lines if x["event"] == "resumed"}
        assert len(resumes) <= 1, f"ranks of generation {number} resumed from different steps: {resumes}"
        steps: dict[int, set[int]] = defaultdict(set)
        spans: dict[int, tuple[float, float]] = {}
        for x in lines:
            if x["event"] == "step":
                steps[x["rank"]].add(x["step"])
                lo, hi = spans.get(x["step"], (x["start"], x["end"]))
                spans[x["step"]] = (min(lo, x["start"]), max(hi, x["end"]))
        out.append(Generation(
            number=number, processes=len(keys),
            joined_ranks=frozenset(x["rank"] for x in lines if x["event"] == "joined"),
            resume_step=resumes.pop() if resumes else None, steps=dict(steps), step_spans=spans,
            start=min(x["time"] for x in lines if x["event"] == "start"),
        ))
    return out


def reworked_from_logs(generations: list[Generation]) -> tuple[int, float]:
    """Steps thrown away (per docs/ledger.md: a step of generation k above the resume step of a later one) and
    their job-level wall seconds (first rank's start to last rank's end)."""
    count, seconds = 0, 0.0
    for i, gen in enumerate(generations):
        later = [g.resume_step for g in generations[i + 1:] if g.resume_step is not None]
        if not later:
            continue
        floor = min(later)
        for step, (lo, hi) in gen.step_spans.items():
            if step > floor:
                count += 1
                seconds += hi - lo
    return count, seconds
