"""A run relaunched on other machines with fresh spools (a Kubernetes pod rescheduled, a cloud VM replaced, a job
resubmitted elsewhere; no Slurm, no GOODPUT_ATTEMPT_BASE): each machine is a UTS namespace with a host name of its
own and its own spool directory; checkpoints and the job's logs live on storage they share. The ledger's attempts,
restarts and rework must be the job's own, as its logs tell them, and the resume check must not flag the correct
resumes of the relaunches.

Before the collector numbered attempts from every launch's, a relaunch on a fresh spool numbered its first attempt 0
again: the run showed no restart, its recomputed steps were dropped as duplicates of the first launch's, and the
resume check flagged them (`resume_not_a_checkpoint`, `repeated_steps`).
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.ledger_checks import assert_partition
from tests.test_cli import free_port
from tests.torchrun.attempts import (
    Agent,
    Generation,
    generations_from_logs,
    job_lines,
    reworked_from_logs,
    start_agent,
    stop_agents,
)
from tests.torchrun.conftest import Collector, fetch_ledger, wait_for

pytestmark = pytest.mark.torchrun

FLAGGED = {"resume_not_a_checkpoint", "repeated_steps"}


def stored_attempt_starts(collector: Collector, run_id: str) -> list[dict[str, Any]]:
    with sqlite3.connect(collector.db_path) as conn:
        rows = conn.execute(
            "SELECT e.attempt, e.rank, e.data FROM events e JOIN runs r ON r.id = e.run_pk "
            "WHERE r.run_id = ? AND e.kind = 'attempt_start'", (run_id,)).fetchall()
    return [{"attempt": a, "rank": r, **json.loads(d or "{}")} for a, r, d in rows]


def attempts_by_generation(collector: Collector, run_id: str, log_dir: Path) -> list[set[int]]:
    """The attempt numbers the collector gave each generation's processes (a generation's processes from the job's
    logs, by pid)."""
    starts = stored_attempt_starts(collector, run_id)
    per_slot: dict[tuple[str, int], list[tuple[float, int]]] = {}
    for x in job_lines(log_dir):
        if x["event"] == "start":
            per_slot.setdefault((x["node"], x["local_rank"]), []).append((x["time"], x["pid"]))
    generations: list[set[int]] = []
    for seq in per_slot.values():
        for g, (_, pid) in enumerate(sorted(seq)):
            while len(generations) <= g:
                generations.append(set())
            generations[g].add(pid)
    return [{s["attempt"] for s in starts if s.get("pid") in pids} for pids in generations]


def check_against_logs(collector: Collector, run_id: str, log_dir: Path, generations: list[Generation],
                       steps: int, world: int, context: str) -> dict[str, Any]:
    reworked, rework_wall_s = reworked_from_logs(generations)
    ledger = fetch_ledger(collector.url, run_id, lambda ledger: ledger["status"] == "finished"
                          and len(ledger["attempts"]) >= len(generations)
                          and ledger["steps"]["reworked"] >= reworked, timeout_s=60)
    assert len(ledger["attempts"]) == len(generations), (ledger["attempts"], context)
    assert ledger["restarts"] == len(generations) - 1, context
    assert [a["attempt"] for a in ledger["attempts"]] == list(range(len(generations)))
    numbered = attempts_by_generation(collector, run_id, log_dir)
    assert numbered == [{g} for g in range(len(generations))], (numbered, context)  # one number per round
    for attempt, gen in zip(ledger["attempts"], generations, strict=True):
        if gen.resume_step is not None:
            assert attempt["resume_step"] == gen.resume_step, (attempt, gen.number, context)
    assert ledger["steps"]["reworked"] == reworked, context
    assert ledger["steps"]["kept"] == steps, context
    assert ledger["waste_gpu_seconds"]["rework"] == pytest.approx(rework_wall_s * world, rel=0.1, abs=0.2), context
    assert_partition(ledger)
    check = httpx.get(f"{collector.url}/v1/runs/{run_id}/resume-check", timeout=60).json()
    assert not {f["code"] for f in check["findings"]} & FLAGGED, (check["findings"], context)
    return ledger


@pytest.mark.parametrize("launched", [True, False], ids=["goodput-launch", "torchrun"])
def test_a_single_process_job_relaunched_on_another_host_has_a_restart_and_its_rework(
        tmp_path: Path, collector: Collector, launched: bool) -> None:
    """The first process checkpoints at 20, reaches 30 and dies; the relaunch on another host resumes from 20 and
    finishes at 50."""
    run_id, log_dir = f"relaunched-{launched}", tmp_path / "logs"
    job_args = ["--log-dir", str(log_dir), "--ckpt-dir", str(tmp_path / "ckpt"), "--steps", "50",
                "--checkpoint-every", "20", "--fail-at-step", "30"]
    agents: list[Agent] = []
    try:
        for host, env in (("host-a", {"ATTEMPTS_JOB_FAIL": "1"}), ("host-b", {})):
            torchrun = ["--standalone", "--nproc-per-node", "1", "--max-restarts", "0", "--local-addr", "127.0.0.1"]
            agent = start_agent(tmp_path, collector.url, run_id=run_id, node="n", torchrun_args=torchrun,
                                job_args=job_args, extra_env=env, host=host, spool=f"spool-{host}", launch=launched)
            agents.append(agent)
            assert agent.proc.wait(timeout=180) == (1 if env else 0), agent.tail()
        generations = generations_from_logs(log_dir)
        assert [g.resume_step for g in generations] == [0, 20] and max(generations[0].steps[0]) == 30
        assert max(generations[1].steps[0]) == 50
        check_against_logs(collector, run_id, log_dir, generations, 50, 1, "\n".join(a.tail() for a in agents))
        hosts = {(s["attempt"], s["host"]) for s in stored_attempt_starts(collector, run_id)}
        assert hosts == {(0, "host-a"), (1, "host-b")}
    finally:
        stop_agents(agents, log_dir)


STEPS, KILL_AT, HOLD_AT, EVERY = 24, 12, 18, 5


def test_a_two_node_job_with_a_killed_worker_then_relaunched_on_two_other_hosts(
        tmp_path: Path, collector: Collector) -> None:
    """Two torchrun agents (`--nnodes 2`, c10d on 127.0.0.1, one process each, gloo) on hosts a1 and b1. The
    worker on node b is SIGKILLed after step 12: both agents restart their workers (a's without counting a
    restart, pytorch/pytorch#108158). The job is then lost at step 18 (both nodes killed) and relaunched on hosts
    a2 and b2 with fresh spools, where it resumes from 15 and finishes."""
    run_id, log_dir = "two-nodes-relaunched", tmp_path / "logs"
    job_args = ["--log-dir", str(log_dir), "--ckpt-dir", str(tmp_path / "ckpt"), "--steps", str(STEPS),
                "--checkpoint-every", str(EVERY), "--fail-at-step", str(KILL_AT), "--pause-s", "10",
                "--hold-at-step", str(HOLD_AT)]
    agents: list[Agent] = []

    def start_launch(hosts: tuple[str, str], max_restarts: int, kill_on_b: bool) -> list[Agent]:
        port = free_port()
        started = []
        for node, host in zip(("a", "b"), hosts, strict=True):
            torchrun = ["--nnodes", "2", "--nproc-per-node", "1", "--max-restarts", str(max_restarts),
                        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_id,
                        "--local-addr", "127.0.0.1", "--node-rank", "0" if node == "a" else "1"]
            env = {"ATTEMPTS_JOB_FAIL": "kill"} if kill_on_b and node == "b" else {}
            started.append(start_agent(tmp_path, collector.url, run_id=run_id, node=node, torchrun_args=torchrun,
                                       job_args=job_args, extra_env=env, host=host, spool=f"spool-{host}"))
            time.sleep(1.0)  # the first agent hosts the rendezvous store
        agents.extend(started)
        return started

    try:
        first = start_launch(("a1", "b1"), 3, kill_on_b=True)
        tails = lambda: "\n".join(agent.tail() for agent in agents)  # noqa: E731

        def both_holding() -> bool:
            return len([x for x in job_lines(log_dir) if x["event"] == "halted"]) == 2

        wait_for(both_holding, 180, f"both nodes at step {HOLD_AT} after the restart\n{tails()}")
        time.sleep(1.0)  # heartbeats and the last records sent
        stop_agents(first, log_dir)  # the nodes are lost: every process SIGKILLed
        second = start_launch(("a2", "b2"), 3, kill_on_b=False)
        codes = [agent.proc.wait(timeout=180) for agent in second]
        assert codes == [0, 0], tails()

        generations = generations_from_logs(log_dir)
        assert all(g.processes == 2 for g in generations), [g.processes for g in generations]
        assert generations[0].resume_step == 0 and generations[-1].resume_step == 15
        assert max(generations[-1].step_spans) == STEPS
        assert sum(1 for g in generations if g.resume_step == 10) >= 1, "the restart after the kill resumed at 10"
        check_against_logs(collector, run_id, log_dir, generations, STEPS, 2, tails())
        hosts_of: dict[int, set[str]] = {}
        for s in stored_attempt_starts(collector, run_id):
            hosts_of.setdefault(s["attempt"], set()).add(s["host"])
        assert hosts_of[0] == {"a1", "b1"} and hosts_of[len(generations) - 1] == {"a2", "b2"}, hosts_of
    finally:
        stop_agents(agents, log_dir)
