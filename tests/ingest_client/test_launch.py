from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ingest_client.launcher.launch import (
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
        f"import os, sys; open({str(seen)!r}, 'w')"
        ".write(os.environ['GOODPUT_RUN_ID'] + ' ' + os.environ['GOODPUT_URL']); sys.exit(3)",
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
            "sys.exit(subprocess.run([sys.executable, '-X', 'importtime', '-c', 'pass'], "
            "capture_output=True, text=True).stderr.count('ingest_client.worker.api'))")
    done = _python(_launched_env(tmp_path, GOODPUT_MODE="disabled"), code)
    assert done.returncode == 0, "the worker's subprocess imported the client"


# -- under Slurm: Slurm's own record (recorded `scontrol show job -o` output, a fake scontrol on PATH) ----------

RUNNING = ("JobId=7 JobName=train UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901758 Nice=0 "
           "Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 "
           "BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:03 TimeLimit=UNLIMITED TimeMin=N/A "
           "SubmitTime=2026-11-30T16:15:28 EligibleTime=2026-11-30T16:15:28 AccrueTime=2026-11-30T16:15:28 "
           "StartTime=2026-11-30T16:15:31 EndTime=Unknown Deadline=N/A SuspendTime=None SecsPreSuspend=0 "
           "Partition=test AllocNode:Sid=localhost:25645 NodeList=gpu[01-02] BatchHost=gpu01 NumNodes=2 NumCPUs=2 "
           "TRES=cpu=2,node=2,billing=2 Command=/tmp/my job.sh WorkDir=/work StdOut=/tmp/b.out Power=")
# What the launcher sees while Slurm ends the job (scontrol hides why behind COMPLETING) and after.
ENDING = RUNNING.replace("JobState=RUNNING", "JobState=COMPLETING").replace("EndTime=Unknown",
                                                                           "EndTime=2026-11-30T16:15:40")
CANCELLED = ENDING.replace("JobState=COMPLETING", "JobState=CANCELLED")
REQUEUING = RUNNING.replace("JobState=RUNNING", "JobState=COMPLETING").replace("Restarts=0", "Restarts=1")
REQUEUED = RUNNING.replace("JobState=RUNNING Reason=None", "JobState=PENDING Reason=BeginTime")
TIMING_OUT = ENDING.replace("TimeLimit=UNLIMITED", "TimeLimit=00:00:09")
TIMEOUT = RUNNING.replace("JobState=RUNNING Reason=None", "JobState=TIMEOUT Reason=TimeLimit")
NODE_DOWN = ENDING.replace("Reason=None", "Reason=NodeDown")

FAKE_SCONTROL = """#!/bin/sh
# scontrol show job -o ID -> the recorded record in $FAKE_SCONTROL_JOB; scontrol show hostnames gpu[01-02]
if [ "$2" = hostnames ]; then echo gpu01; echo gpu02; else cat "$FAKE_SCONTROL_JOB"; fi
"""


def test_scontrol_records_parse_with_spaces_in_values_and_local_times() -> None:
    from ingest_client.launcher.slurm import SlurmJob, parse_scontrol_job, slurm_time

    fields = parse_scontrol_job(RUNNING + "\n")
    assert fields["Command"] == "/tmp/my job.sh" and fields["TRES"] == "cpu=2,node=2,billing=2"
    assert fields["AllocNode:Sid"] == "localhost:25645" and fields["Power"] == ""
    job = SlurmJob.from_fields("7", fields)
    assert job.started_at_s is not None and job.submitted_at_s is not None
    assert job.started_at_s - job.submitted_at_s == 3.0
    assert job.submitted_at_s == slurm_time("2026-11-30T16:15:28") and slurm_time("Unknown") is None
    assert (job.state, job.restarts, job.node_list) == ("RUNNING", 0, "gpu[01-02]")


def test_gpus_come_from_the_slurm_allocation() -> None:
    from ingest_client.launcher.slurm import gpus_of_allocation

    assert gpus_of_allocation({"SLURM_GPUS": "16", "SLURM_JOB_NUM_NODES": "2"}) == 16
    assert gpus_of_allocation({"SLURM_GPUS_PER_NODE": "a100:8", "SLURM_JOB_NUM_NODES": "4"}) == 32
    assert gpus_of_allocation({"SLURM_GPUS_ON_NODE": "4", "SLURM_NNODES": "2"}) == 8
    assert gpus_of_allocation({"SLURM_JOB_GPUS": "0,1,2,3", "SLURM_JOB_NUM_NODES": "3"}) == 12
    assert gpus_of_allocation({"SLURM_JOB_NUM_NODES": "3"}) is None


@pytest.mark.parametrize(("record", "code", "status", "detail"), [
    (RUNNING, 0, "finished", None),
    (RUNNING, 1, "failed", "slurm JobState=RUNNING Reason=None"),
    (ENDING, 143, "cancelled", "slurm: cancelled (slurm JobState=COMPLETING Reason=None)"),
    (CANCELLED, 143, "cancelled", "slurm JobState=CANCELLED Reason=None"),
    (REQUEUING, 143, None, "slurm: requeued (slurm JobState=COMPLETING Reason=None)"),
    (REQUEUED, 143, None, "slurm JobState=PENDING Reason=BeginTime"),
    (TIMING_OUT, 143, "failed", "slurm: time limit 00:00:09 reached (slurm JobState=COMPLETING Reason=None)"),
    (TIMEOUT, 143, "failed", "slurm JobState=TIMEOUT Reason=TimeLimit"),
    (NODE_DOWN, 143, "failed", "slurm: node failure (slurm JobState=COMPLETING Reason=NodeDown)"),
])
def test_the_runs_status_comes_from_slurms_final_state_then_the_exit_code(
    record: str, code: int, status: str | None, detail: str | None
) -> None:
    from ingest_client.launcher.slurm import SlurmJob, outcome, parse_scontrol_job

    ended = outcome(SlurmJob.from_fields("7", parse_scontrol_job(record)), code, restarts_at_start=0)
    assert (ended.status.value if ended.status else None, ended.detail) == (status, detail)


def _slurm_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, record: str, **extra: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(FAKE_SCONTROL)
    (bin_dir / "scontrol").chmod(0o755)
    job_file = tmp_path / "job.txt"
    job_file.write_text(record)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SCONTROL_JOB", str(job_file))
    for name, value in {"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "2", "SLURM_GPUS_ON_NODE": "4",
                        "SLURM_NODEID": "0", "SLURM_PROCID": "0", "SLURM_RESTART_COUNT": "0", **extra}.items():
        monkeypatch.setenv(name, value)
    return job_file


def test_under_slurm_the_allocation_starts_at_slurms_start_time_with_its_gpus_and_hosts(
    tmp_path: Path, collector: FakeCollector, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ingest_client.launcher.slurm import slurm_time

    _slurm_env(tmp_path, monkeypatch, RUNNING)
    code = launch_main(["--url", collector.url, "--spool-dir", str(tmp_path / "spool"), "--", sys.executable, "-c",
                        "pass"])
    assert code == 0
    (submitted,) = collector.of_kind("run_submitted")
    (start,) = collector.of_kind("allocation_start")
    assert submitted["time"] == slurm_time("2026-11-30T16:15:28") and submitted["run_id"] == "slurm-7"
    assert start["time"] == slurm_time("2026-11-30T16:15:31"), "Slurm's StartTime, not the launcher's start"
    assert (start["gpus"], start["hosts"], start["job_id"]) == (8, ["gpu01", "gpu02"], "7")
    assert [e["event_id"] for e in sorted(collector.events, key=lambda e: e["time"])][1:] == [
        "slurm-7-r0-allocation_start", "slurm-7-r0-allocation_end", "slurm-7-r0-run_end"]
    assert [(e["status"], e.get("detail")) for e in collector.of_kind("run_end")] == [("finished", None)]


def test_a_scancelled_job_ends_the_run_cancelled_with_slurms_state(
    tmp_path: Path, collector: FakeCollector, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_file = _slurm_env(tmp_path, monkeypatch, RUNNING)
    cancel = f"import sys; open({str(job_file)!r}, 'w').write({ENDING!r}); sys.exit(143)"
    assert launch_main(["--url", collector.url, "--spool-dir", str(tmp_path / "spool"), "--", sys.executable,
                        "-c", cancel]) == 143
    assert [(e["status"], e["detail"]) for e in collector.of_kind("run_end")] == [
        ("cancelled", "slurm: cancelled (slurm JobState=COMPLETING Reason=None)")]


def test_a_requeued_job_ends_its_allocation_but_not_the_run(
    tmp_path: Path, collector: FakeCollector, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_file = _slurm_env(tmp_path, monkeypatch, REQUEUING, SLURM_RESTART_COUNT="1")
    requeued = REQUEUING.replace("Restarts=1", "Restarts=2")
    requeue = f"import sys; open({str(job_file)!r}, 'w').write({requeued!r}); sys.exit(143)"
    launch_main(["--url", collector.url, "--spool-dir", str(tmp_path / "spool"), "--", sys.executable, "-c",
                 requeue])
    assert collector.of_kind("run_end") == []
    assert [e["event_id"] for e in collector.of_kind("allocation_end")] == ["slurm-7-r1-allocation_end"]


def test_under_srun_only_the_first_task_sends_run_level_events(
    tmp_path: Path, collector: FakeCollector, monkeypatch: pytest.MonkeyPatch
) -> None:
    _slurm_env(tmp_path, monkeypatch, RUNNING, SLURM_NODEID="0", SLURM_PROCID="1")
    assert launch_main(["--url", collector.url, "--spool-dir", str(tmp_path / "spool"), "--", sys.executable,
                        "-c", "pass"]) == 0
    assert collector.requests == []


def test_the_warning_signal_asks_the_run_to_checkpoint_and_the_command_ignores_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    posted: list[tuple[str, dict[str, str]]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            posted.append((self.path, json.loads(body)))
            self.send_response(201)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"id": 1}')

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("GOODPUT_MODE", "offline")  # run events to the spool only: the stub takes the request
    warn = ("import os, signal, sys, time; assert signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN; "
            "os.kill(os.getppid(), signal.SIGUSR1); time.sleep(1.0)")
    try:
        code = launch_main(["--run-id", "r/1", "--url", f"http://127.0.0.1:{server.server_port}", "--gpus", "1",
                            "--spool-dir", str(tmp_path), "--", sys.executable, "-c", warn])
    finally:
        server.shutdown()
        server.server_close()
    assert code == 0, "the command ignored the warning (SIG_IGN inherited) and the launcher survived it"
    assert posted == [("/v1/runs/r%2F1/checkpoint-request",
                       {"reason": "preemption warning (SIGUSR1)", "requested_by": "goodput launch"})]
