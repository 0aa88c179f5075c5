from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ingest_client.launch import (
    BOOTSTRAP_DIR,
    gpus_from_torchrun_args,
    launch_main,
    node_rank_of,
    resolve_run_id,
    worker_environment,
)
from tests.ingest_client.conftest import CLIENT_ENV, spooled_records
from tests.ingest_client.fake_collector import FakeCollector

REPO = Path(__file__).resolve().parents[2]


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


# -- the bootstrap: a worker's tracker starts with its interpreter ---------------------------------------------

PROBE = ("import ingest_client as g, os; t = g.get_tracker(); "
         "print('tracker' if t else 'none', t.context.attempt if t else '', os.environ.get('GOODPUT_GENERATION'))")


def _python(env: dict[str, str], code: str = PROBE) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                          check=False)


def _launched_env(tmp_path: Path, *, worker: bool = True, **extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GOODPUT_") and k not in CLIENT_ENV}
    env = worker_environment({**base, "PYTHONPATH": str(REPO)}, run_id="boot", bootstrap=True)
    env.update({"GOODPUT_MODE": "offline", "GOODPUT_SPOOL_DIR": str(tmp_path / "spool"), **extra})
    if worker:
        env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", TORCHELASTIC_RESTART_COUNT="0")
    return env


def test_launch_prepends_the_bootstrap_to_the_users_pythonpath_and_names_the_launch() -> None:
    env = worker_environment({"PYTHONPATH": "/mine:/theirs", "GOODPUT_GENERATION": "3"}, run_id="r", bootstrap=True)
    assert env["PYTHONPATH"].split(os.pathsep) == [str(BOOTSTRAP_DIR), "/mine", "/theirs"]
    assert (BOOTSTRAP_DIR / "sitecustomize.py").is_file()
    assert env["GOODPUT_LAUNCH_ID"].startswith("launch") and "GOODPUT_GENERATION" not in env
    assert env["GOODPUT_LAUNCH_ID"] != worker_environment({}, run_id="r", bootstrap=True)["GOODPUT_LAUNCH_ID"]
    off = worker_environment({"PYTHONPATH": "/mine"}, run_id="r", bootstrap=False)
    assert off["PYTHONPATH"] == "/mine" and off["GOODPUT_BOOTSTRAP"] == "0"
    assert "PYTHONPATH" not in worker_environment({"GOODPUT_BOOTSTRAP": "0"}, run_id="r", bootstrap=True)


def test_bootstrap_starts_a_worker_tracker_that_the_scripts_init_joins_without_a_warning(tmp_path: Path) -> None:
    code = ("import logging, ingest_client as g; logging.basicConfig(level=logging.WARNING); "
            "t = g.get_tracker(); assert t is not None and t.context.generation == 0, t; "
            "assert g.init(run_id='boot') is t; print('joined', t.context.attempt)")
    done = _python(_launched_env(tmp_path), code)
    assert done.returncode == 0 and done.stdout.split() == ["joined", "0"], done.stderr
    assert done.stderr == "", "joining the bootstrapped tracker with the same settings warns nothing"
    records = spooled_records(tmp_path / "spool")
    (start,) = [r for r in records if r.get("kind") == "attempt_start"]
    assert start["run_id"] == "boot" and start["attempt"] == 0
    assert [r["reason"] for r in records if r.get("kind") == "attempt_end"] == ["completed"]


def test_a_script_init_that_contradicts_the_bootstrap_warns_and_keeps_the_running_tracker(tmp_path: Path) -> None:
    code = ("import logging, ingest_client as g; logging.basicConfig(level=logging.WARNING); "
            "t = g.get_tracker(); u = g.init(run_id='another', sigterm_reason='preempted'); "
            "print(u is t, u.context.run_id, u.config.sigterm_reason)")
    done = _python(_launched_env(tmp_path), code)
    assert done.stdout.split() == ["True", "boot", "preempted"], done.stderr
    assert "run_id='another'" in done.stderr and "GOODPUT_BOOTSTRAP=0" in done.stderr
    assert "sigterm_reason" not in done.stderr, "a setting the tracker reads when used is adopted silently"


@pytest.mark.parametrize(("case", "extra", "worker"), [
    ("the agent or the launcher (no RANK)", {}, False),
    ("a subprocess of a worker", {"GOODPUT_WORKER_PID": "1"}, True),
    ("GOODPUT_BOOTSTRAP=0", {"GOODPUT_BOOTSTRAP": "0"}, True),
])
def test_bootstrap_starts_nothing_outside_a_torchrun_worker(tmp_path: Path, case: str, extra: dict[str, str],
                                                           worker: bool) -> None:
    done = _python(_launched_env(tmp_path, worker=worker, **extra))
    assert done.returncode == 0 and done.stdout.split()[0] == "none", (case, done.stderr)
    assert not (tmp_path / "spool").exists(), case


def test_a_worker_subprocess_inherits_the_generation_and_starts_no_tracker(tmp_path: Path) -> None:
    code = ("import subprocess, sys, ingest_client as g; assert g.get_tracker() is not None; "
            f"sys.exit(subprocess.run([sys.executable, '-c', {PROBE!r}]).returncode)")
    done = _python(_launched_env(tmp_path), code)
    assert done.returncode == 0 and done.stdout.split() == ["none", "0"], done.stderr


def test_a_broken_bootstrap_never_breaks_the_worker_and_says_so_once(tmp_path: Path) -> None:
    done = _python(_launched_env(tmp_path, GOODPUT_QUEUE_CAPACITY="lots"), "print('ran')")
    assert done.returncode == 0 and done.stdout.strip() == "ran"
    assert done.stderr.count("goodput:") == 1 and "GOODPUT_QUEUE_CAPACITY" in done.stderr, done.stderr


def test_bootstrap_runs_the_next_sitecustomize_on_the_path(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIR_SITECUSTOMIZE'] = 'ran'\n")
    env = _launched_env(tmp_path)
    env["PYTHONPATH"] += os.pathsep + str(theirs)
    done = _python(env, "import os, ingest_client as g; print(os.environ.get('THEIR_SITECUSTOMIZE'), "
                        "g.get_tracker() is not None)")
    assert done.stdout.split() == ["ran", "True"], done.stderr


def test_an_exception_before_the_script_calls_init_ends_the_attempt_failed(tmp_path: Path) -> None:
    done = _python(_launched_env(tmp_path), "raise RuntimeError('rendezvous timed out')")
    assert done.returncode == 1
    ends = [r for r in spooled_records(tmp_path / "spool") if r.get("kind") == "attempt_end"]
    assert [(e["reason"], e["detail"]) for e in ends] == [("failed", "RuntimeError: rendezvous timed out")]


def test_a_disabled_worker_still_marks_its_subprocesses_as_not_workers(tmp_path: Path) -> None:
    code = ("import os, subprocess, sys; "
            f"sys.exit(subprocess.run([sys.executable, '-X', 'importtime', '-c', 'pass'], "
            "capture_output=True, text=True).stderr.count('ingest_client.api'))")
    done = _python(_launched_env(tmp_path, GOODPUT_MODE="disabled"), code)
    assert done.returncode == 0, "the worker's subprocess imported the client"
