from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ingest_client.launch import gpus_from_torchrun_args, launch_main, node_rank_of, resolve_run_id
from tests.ingest_client.fake_collector import FakeCollector


def test_launch_exports_the_run_id_and_sends_run_level_events(tmp_path: Path, collector: FakeCollector) -> None:
    seen = tmp_path / "seen.txt"
    code = launch_main([
        "--run-id", "job-42", "--url", collector.url, "--spool-dir", str(tmp_path / "spool"),
        "--submitted-at", "1700000000", "--job-id", "42", "--",
        sys.executable, "-c",
        f"import os, sys; open({str(seen)!r}, 'w').write(os.environ['GOODPUT_RUN_ID'] + ' ' + os.environ['GOODPUT_URL']); sys.exit(3)",
        "--nproc-per-node=4", "--nnodes", "2",
    ])
    assert code == 3
    assert seen.read_text() == f"job-42 {collector.url}"
    kinds = [e["kind"] for e in sorted(collector.events, key=lambda e: e["time"])]
    assert kinds == ["run_submitted", "allocation_start", "allocation_end", "run_end"]
    (submitted,) = collector.of_kind("run_submitted")
    assert submitted["time"] == 1700000000.0 and submitted["job_id"] == "42"
    assert collector.of_kind("allocation_start")[0]["gpus"] == 8
    assert collector.of_kind("run_end")[0]["status"] == "failed"
    assert all(e["run_id"] == "job-42" and "rank" not in e for e in collector.events)


def test_launch_on_a_non_zero_node_sends_nothing_but_runs_the_command(
    tmp_path: Path, collector: FakeCollector, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_NODEID", "1")
    code = launch_main(["--url", collector.url, "--gpus", "8", "--spool-dir", str(tmp_path), "--",
                        sys.executable, "-c", "pass"])
    assert code == 0
    assert collector.requests == []


def test_launch_finished_run_and_returns_zero(tmp_path: Path, collector: FakeCollector) -> None:
    code = launch_main(["--run-id", "r", "--url", collector.url, "--gpus", "2", "--spool-dir", str(tmp_path),
                        "--", sys.executable, "-c", "pass"])
    assert code == 0
    assert [e["status"] for e in collector.of_kind("run_end")] == ["finished"]
    assert collector.of_kind("run_submitted") == []  # submission time unknown


def test_run_id_resolution_order() -> None:
    assert resolve_run_id("flag", {"GOODPUT_RUN_ID": "env", "SLURM_JOB_ID": "7"}) == "flag"
    assert resolve_run_id(None, {"GOODPUT_RUN_ID": "env", "SLURM_JOB_ID": "7"}) == "env"
    assert resolve_run_id(None, {"SLURM_JOB_ID": "7"}) == "slurm-7"
    assert resolve_run_id(None, {"KUBERNETES_SERVICE_HOST": "x", "JOB_NAME": "train"}) == "k8s-train"
    assert resolve_run_id(None, {}).startswith("run-")


def test_gpu_count_and_node_rank_from_the_torchrun_command_line() -> None:
    assert gpus_from_torchrun_args(["torchrun", "--nproc-per-node", "8", "--nnodes=4", "train.py"], {}) == 32
    assert gpus_from_torchrun_args(["torchrun", "--nproc_per_node=2", "train.py"], {}) == 2
    assert gpus_from_torchrun_args(["torchrun", "--nproc-per-node", "gpu", "train.py"], {}) is None
    assert gpus_from_torchrun_args(["torchrun", "--nproc-per-node", "8", "--nnodes", "1:4"],
                                   {"SLURM_JOB_NUM_NODES": "3"}) == 24
    assert node_rank_of(["torchrun", "--node-rank", "2"], {}) == 2
    assert node_rank_of(["torchrun"], {"NODE_RANK": "0"}) == 0
    assert node_rank_of(["torchrun"], {}) is None
