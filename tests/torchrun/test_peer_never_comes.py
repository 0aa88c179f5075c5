"""A round that waits in `init_process_group` for a peer that never comes: two torchrun agents (`--nnodes 2`, c10d
on 127.0.0.1, one worker each, gloo) under `goodput launch`; node b's worker holds before `init_process_group` and
is SIGKILLed with its agent, so node a's worker waits in `init_process_group` until its timeout and the job gives up.

Live detection calls the run hung while it waits, from the moment the worker entered `init_process_group` (the
bootstrap marks it), and the final ledger books the same: startup up to that moment, hang from it to the end (the
wait, then the teardown of a run that failed for good). Before, live said hung while the final ledger booked the
whole wait as startup.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.ledger_checks import assert_partition
from tests.test_cli import free_port
from tests.torchrun.attempts import Agent, job_lines, start_agent, stop_agents
from tests.torchrun.conftest import Collector, fetch_ledger, start_collector, wait_for

pytestmark = pytest.mark.torchrun

INIT_TIMEOUT_S = 40.0
HANG_AFTER_S = 10.0  # the collector's startup floor, so that the test need not wait 300 s


@pytest.fixture
def quick_collector(tmp_path: Path) -> Iterator[Collector]:
    c = start_collector(tmp_path / "collector", GOODPUT_HANG_FLOOR_S="5",
                        GOODPUT_HANG_STARTUP_FLOOR_S=str(HANG_AFTER_S))
    yield c
    c.stop()


def _line(log_dir: Path, event: str, node: str) -> dict[str, Any] | None:
    return next((x for x in job_lines(log_dir) if x["event"] == event and x["node"] == node), None)


def test_a_round_waiting_for_a_peer_that_never_comes_is_hung_live_and_in_the_final_ledger(
    tmp_path: Path, quick_collector: Collector
) -> None:
    collector, run_id, port = quick_collector, "peer-never-comes", free_port()
    log_dir = tmp_path / "logs"
    job_args = ["--log-dir", str(log_dir), "--ckpt-dir", str(tmp_path / "ckpt"), "--steps", "5",
                "--checkpoint-every", "0", "--hold-before-init", "b", "--init-timeout", str(INIT_TIMEOUT_S)]
    agents: list[Agent] = []
    try:
        for node_rank, node in enumerate(("a", "b")):
            torchrun = ["--nnodes", "2", "--nproc-per-node", "1", "--max-restarts", "0", "--rdzv-backend", "c10d",
                        "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_id, "--node-rank", str(node_rank)]
            agents.append(start_agent(tmp_path, collector.url, run_id=run_id, node=node, torchrun_args=torchrun,
                                      job_args=job_args))
            time.sleep(1.0)  # the first agent hosts the rendezvous store
        tails = lambda: "\n".join(agent.tail() for agent in agents)  # noqa: E731
        entered = wait_for(lambda: _line(log_dir, "init", "a"), 120, "node a's worker entering init_process_group")
        holding = wait_for(lambda: _line(log_dir, "holding", "b"), 60, "node b's worker holding")
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(holding["pid"]), signal.SIGKILL)  # the peer never comes: its worker and its node are gone
        os.killpg(agents[1].proc.pid, signal.SIGKILL)
        agents[1].proc.wait(timeout=30)

        live = wait_for(lambda: _hung(collector.url, run_id), INIT_TIMEOUT_S, f"/live calling {run_id} hung\n{tails()}",
                        interval_s=0.5)
        waste = httpx.get(f"{collector.url}/v1/runs/{run_id}/waste", timeout=30).json()
        code = agents[0].proc.wait(timeout=INIT_TIMEOUT_S + 90)
        assert code != 0, tails()  # the worker's init_process_group timed out and torchrun gave up
    finally:
        stop_agents(agents, log_dir)

    # live: no progress since the worker entered init_process_group (its attempt started seconds earlier)
    assert live["threshold_basis"] == "startup"
    assert live["last_progress_time"] == pytest.approx(entered["time"], abs=0.5), (live, entered)
    provisional = waste["provisional"]
    assert provisional is not None and provisional["since"] == live["last_progress_time"], waste

    final = fetch_ledger(collector.url, run_id, lambda ledger: ledger["status"] == "failed")
    assert_partition(final)
    (attempt,) = final["attempts"]
    assert attempt["failed"] and attempt["first_step"] is None, attempt
    (allocation,) = final["allocations"]
    gpus = attempt["world_size"]
    assert gpus == allocation["gpus"] == 2
    since = provisional["since"]
    waste_final = final["waste_gpu_seconds"]
    # the same story: startup up to the wait, hang from it (the wait and the teardown) to the allocation's end
    assert waste_final["startup"] == pytest.approx((since - allocation["start"]) * gpus, abs=1e-6), final
    assert waste_final["hang"] == pytest.approx((allocation["end"] - since) * gpus, abs=1e-6), final
    assert waste_final["startup"] == pytest.approx(waste["waste_gpu_seconds"]["startup"], abs=1e-6)
    # what live booked provisionally up to its reading is the final ledger's hang up to that moment
    assert waste_final["hang"] - waste["waste_gpu_seconds"]["hang"] == pytest.approx(
        (allocation["end"] - provisional["as_of"]) * gpus, abs=1e-6)
    assert waste["waste_gpu_seconds"]["hang"] >= HANG_AFTER_S * gpus


def _hung(url: str, run_id: str) -> dict[str, Any] | None:
    response = httpx.get(f"{url}/v1/runs/{run_id}/live", timeout=30)
    if response.status_code != 200:
        return None
    live: dict[str, Any] = response.json()
    return live if live["hung"] else None
