"""Two torchrun agents (`--nnodes 2`, c10d rendezvous on 127.0.0.1), each under `goodput launch`, node b's host clock
5 s ahead (issue 30, point 5): its processes, the launcher, torchrun and the workers, read time.time() 5 s ahead and
call their host node-b (a sitecustomize on node b's PYTHONPATH, as a second machine would be). Synchronous gloo
steps end with an all-reduce; the ledger's productive time must be the job's own, from its logs on the true clock,
and node-b's offset must be measured, while before, every step spanned the 5 s between the hosts."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.ledger_checks import assert_partition
from tests.test_cli import REPO, free_port
from tests.torchrun.attempts import Agent, job_lines, start_agent, stop_agents
from tests.torchrun.conftest import Collector, fetch_ledger

pytestmark = pytest.mark.torchrun

NPROC, STEPS, SKEW_S = 2, 40, 5.0
SHIM = '''import os, socket, time
_skew = float(os.environ.get("SKEW_CLOCK_S", "0"))
if _skew:
    _real = time.time
    time.time = lambda: _real() + _skew
    socket.gethostname = lambda: os.environ["SKEW_HOSTNAME"]
'''


def test_a_node_whose_clock_is_5_s_ahead_is_measured_and_taken_out(tmp_path: Path, collector: Collector) -> None:
    run_id, port = "skewed-nodes", free_port()
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(SHIM)
    log_dir, ckpt_dir = tmp_path / "logs", tmp_path / "ckpt"
    job_args = ["--log-dir", str(log_dir), "--ckpt-dir", str(ckpt_dir), "--steps", str(STEPS),
                "--checkpoint-every", "10", "--step-sleep", "0.05"]
    agents: list[Agent] = []
    try:
        for node_rank, node in enumerate(("a", "b")):
            torchrun = ["--nnodes", "2", "--nproc-per-node", str(NPROC), "--max-restarts", "0",
                        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_id,
                        "--node-rank", str(node_rank)]
            skewed = {"SKEW_CLOCK_S": str(SKEW_S), "SKEW_HOSTNAME": "node-b",
                      "PYTHONPATH": f"{shim}:{REPO}"} if node == "b" else {}
            agents.append(start_agent(tmp_path, collector.url, run_id=run_id, node=node, torchrun_args=torchrun,
                                      job_args=job_args, extra_env=skewed))
            time.sleep(1.0)  # the first agent hosts the rendezvous store
        codes = [agent.proc.wait(timeout=180) for agent in agents]
        tails = "\n".join(agent.tail() for agent in agents)
        assert codes == [0, 0], tails

        # the job's own account, on the true clock: node b logged its times 5 s ahead. Each step's log line brackets
        # the tracker's step from outside (start, end) and from inside (inner_start, inner_end)
        outer: dict[int, list[tuple[float, float]]] = {}
        inner: dict[int, list[tuple[float, float]]] = {}
        for line in job_lines(log_dir):
            if line["event"] == "step":
                skew = SKEW_S if line["node"] == "b" else 0.0
                outer.setdefault(line["step"], []).append((line["start"] - skew, line["end"] - skew))
                inner.setdefault(line["step"], []).append((line["inner_start"] - skew, line["inner_end"] - skew))
        assert sorted(outer) == list(range(1, STEPS + 1)) and all(len(v) == 2 * NPROC for v in outer.values())
        # a job step runs from its first rank's start to its last rank's end; consecutive steps overlap (a rank
        # starts the next one while another leaves the all-reduce), and the ledger counts that time once
        outer_s, inner_s = (union_seconds([(min(s for s, _ in v), max(e for _, e in v)) for v in spans.values()])
                            for spans in (outer, inner))

        ledger = fetch_ledger(collector.url, run_id, lambda ledger: ledger["status"] == "finished"
                              and ledger["steps"]["kept"] == STEPS)
        assert_partition(ledger)
        clocks = {c["host"]: c["offset_seconds"] for c in ledger["clocks"]}
        assert clocks["node-b"] == pytest.approx(SKEW_S, abs=0.05), (clocks, tails)
        assert [v for h, v in clocks.items() if h != "node-b"] == [0.0]
        # The job's steps (first rank's start to last rank's end) lie between the two brackets, but for what the
        # collector cannot know: node b's offset is measured, and each step's span moves by at most its error.
        # (Before, every step spanned the 5 s between the hosts: productive 16.96 GPU-s against the logs' 8.94.)
        slack = abs(clocks["node-b"] - SKEW_S) * STEPS
        gpus = 2 * NPROC
        assert (inner_s - slack) * gpus <= ledger["productive_gpu_seconds"] <= (outer_s + slack) * gpus, (
            inner_s * gpus, ledger["productive_gpu_seconds"], outer_s * gpus, clocks)
    finally:
        stop_agents(agents, log_dir)


def union_seconds(spans: list[tuple[float, float]]) -> float:
    """The length of the union of the spans."""
    total, reach = 0.0, -float("inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total
