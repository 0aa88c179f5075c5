"""`goodput launch` reads torchrun's report of a failed worker and names it by the attempt and rank its launch file
holds (the end-to-end check with real processes: tests/torchrun/test_failure_causes.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ingest_client.common.events import EventKind
from ingest_client.launcher.launch import _pass_on
from ingest_client.launcher.worker_exits import WorkerExitReporter, parse_failure, worker_of
from ingest_client.worker.generation import COUNTER_DIR, claim_launch_attempt

TORCHRUN_LINE = (b"E1204 17:40:01.123000 4100 torch/distributed/elastic/multiprocessing/api.py:1003] failed "
                 b"(exitcode: -9) local_rank: 1 (pid: 4242) of binary: /usr/bin/python3")


def test_torchruns_failure_line_gives_the_exit_code_local_rank_and_pid() -> None:
    failure = parse_failure(TORCHRUN_LINE)
    assert failure is not None
    assert (failure.exit_code, failure.local_rank, failure.pid) == (-9, 1, 4242)
    assert failure.line.startswith("failed (exitcode: -9) local_rank: 1 (pid: 4242)")
    assert parse_failure(b"[default0]: step 12 loss 2.31") is None


def test_the_launch_file_names_each_worker_process_attempt_and_rank(tmp_path: Path) -> None:
    env = {"GOODPUT_LAUNCH_ID": "launchx", "RANK": "3", "LOCAL_RANK": "1"}
    attempt = claim_launch_attempt(tmp_path, env, torchrun_worker=True, attempt_base=0, offset=2)
    (launch_file,) = (tmp_path / COUNTER_DIR).glob("*.launch")
    assert worker_of(launch_file, os.getpid()) == (attempt, 3) == (2, 3)
    assert worker_of(launch_file, os.getpid() + 1) is None


def test_the_reporter_sends_the_failed_workers_attempt_end_with_its_exit_code(tmp_path: Path) -> None:
    directory = tmp_path / COUNTER_DIR
    directory.mkdir()
    (directory / "h-launchx.launch").write_text(
        "base 0 host h owner 1 1\nattempt 0 pid 4242 time 1.000 rank 5\nattempt 1 pid 4300 time 2.000 rank 5\n")
    sent: list[tuple[EventKind, dict[str, Any]]] = []
    reporter = WorkerExitReporter(lambda kind, _t, fields: sent.append((kind, fields)), run_dir=tmp_path,
                                  launch_key="h-launchx", launch_name="h-launchx.boot")
    reporter.on_line(TORCHRUN_LINE)
    reporter.on_line(b"failed (exitcode: 1) local_rank: 0 (pid: 999) of binary: x")  # not this launch's: left out
    assert sent == [(EventKind.ATTEMPT_END, {
        "attempt": 0, "rank": 5, "launch": "h-launchx.boot", "reason": "failed", "exit_code": -9,
        "detail": "torchrun: failed (exitcode: -9) local_rank: 1 (pid: 4242) of binary: /usr/bin/python3"})]


def test_the_commands_stderr_passes_through_as_it_comes_and_whole_lines_are_read(tmp_path: Path) -> None:
    script = ("import sys,time; sys.stderr.write('progress 10%\\r'); sys.stderr.flush(); time.sleep(0.3); "
              "sys.stderr.write('line one\\nline two\\n'); sys.stderr.flush()")
    child = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE)
    lines: list[bytes] = []
    reader = _pass_on(child.stderr, lines.append)
    assert child.wait(timeout=30) == 0
    reader.join(timeout=5)
    assert lines == [b"progress 10%\rline one", b"line two"]
