"""Real processes: SIGKILL, SIGTERM, uncaught exceptions, normal exit and fork()."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from ingest_client.worker.spool import run_dir_name
from tests.ingest_client.conftest import spooled_records
from tests.ingest_client.fake_collector import FakeCollector, closed_port_url

REPO = Path(__file__).resolve().parents[2]


def _spawn(code: str, tmp_path: Path, **env: str) -> subprocess.Popen[str]:
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("GOODPUT_")}
    child_env.update(GOODPUT_SPOOL_DIR=str(tmp_path / "spool"), GOODPUT_RUN_ID="run-proc",
                     PYTHONPATH=str(REPO), **env)
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=child_env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _kinds(tmp_path: Path, kind: str) -> list[dict[str, Any]]:
    return [r for r in spooled_records(tmp_path / "spool") if r["kind"] == kind]


def test_sigkilled_worker_loses_at_most_half_a_second_and_the_next_process_replays_it(
    tmp_path: Path, collector: FakeCollector, make_tracker: Any
) -> None:
    child = _spawn("""
        import time, ingest_client as goodput
        tracker = goodput.init()
        started = time.monotonic()
        step = 0
        while True:
            step += 1
            with tracker.step(step):
                time.sleep(0.001)
            if step == 100:
                print("ready", flush=True)
    """, tmp_path, GOODPUT_URL=closed_port_url())
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    time.sleep(0.6)
    killed_at = time.time()
    child.send_signal(signal.SIGKILL)
    child.wait(5)
    assert child.returncode == -signal.SIGKILL

    tracker = make_tracker(url=collector.url, run_id="run-proc", spool_dir=tmp_path / "spool")
    assert tracker.flush(5.0)
    steps = [e for e in collector.of_kind("steps") if e["run_id"] == "run-proc"]
    numbers = sorted(s for e in steps for s in e["step"])
    assert numbers == list(range(1, len(numbers) + 1)), "no gaps: every spooled step is replayed"
    last_end = max(end for e in steps for end in e["end"])
    assert killed_at - last_end < 0.5, f"lost {killed_at - last_end:.3f} s of steps"
    assert len(collector.of_kind("attempt_start")) == 2  # the killed worker's and this tracker's


def test_sigterm_chains_the_previous_handler_and_records_the_reason(tmp_path: Path) -> None:
    child = _spawn("""
        import os, signal, sys, ingest_client as goodput
        def user_handler(signum, frame):
            print("user handler ran", flush=True)
            sys.exit(7)
        signal.signal(signal.SIGTERM, user_handler)
        tracker = goodput.init(sigterm_reason="preempted")
        with tracker.step(1):
            pass
        os.kill(os.getpid(), signal.SIGTERM)
        signal.pause()
    """, tmp_path, GOODPUT_MODE="offline")
    out, err = child.communicate(timeout=10)
    assert child.returncode == 7, err
    assert "user handler ran" in out
    ends = _kinds(tmp_path, "attempt_end")
    assert [(e["reason"], e.get("detail")) for e in ends] == [("preempted", "SIGTERM")]
    assert [s for e in _kinds(tmp_path, "steps") for s in e["step"]] == [1]


def test_sigterm_with_default_handler_still_kills_the_process_after_recording(tmp_path: Path) -> None:
    child = _spawn("""
        import time, ingest_client as goodput
        tracker = goodput.init()
        tracker.record_step(1, time.time(), time.time())
        print("ready", flush=True)
        time.sleep(30)
    """, tmp_path, GOODPUT_MODE="offline")
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    child.send_signal(signal.SIGTERM)
    child.wait(10)
    assert child.returncode == -signal.SIGTERM
    assert [e["reason"] for e in _kinds(tmp_path, "attempt_end")] == ["failed"]
    assert [s for e in _kinds(tmp_path, "steps") for s in e["step"]] == [1]


def test_sigterm_during_the_exception_hooks_spool_write_loses_nothing(tmp_path: Path) -> None:
    """torchrun SIGTERMs the survivors of a crashed rank: a survivor whose collective just failed is often inside
    its excepthook's durable write (attempt_end and the steps buffered before it) when the signal lands. The
    handler must let that write finish before the process dies of the signal (it used to wait 2 s for a lock its
    own thread held, then die with those rows drained from the buffer and never written)."""
    child = _spawn("""
        import os, signal, time, ingest_client as goodput
        tracker = goodput.init()
        tracker.record_step(11, time.time(), time.time())
        pipeline = tracker._pipeline
        write = pipeline._spool_records
        def write_interrupted_by_sigterm(records):
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, on this thread, mid-write
            return write(records)
        pipeline._spool_records = write_interrupted_by_sigterm
        raise RuntimeError("Connection closed by peer")
    """, tmp_path, GOODPUT_MODE="offline")
    _, err = child.communicate(timeout=10)
    assert child.returncode == -signal.SIGTERM, err
    ends = _kinds(tmp_path, "attempt_end")
    assert [(e["reason"], e["detail"]) for e in ends] == [("failed", "RuntimeError: Connection closed by peer")]
    assert [s for e in _kinds(tmp_path, "steps") for s in e["step"]] == [11]


def test_uncaught_exception_records_a_failed_attempt_and_chains_excepthook(tmp_path: Path) -> None:
    child = _spawn("""
        import ingest_client as goodput
        tracker = goodput.init()
        raise ValueError("boom")
    """, tmp_path, GOODPUT_MODE="offline")
    _, err = child.communicate(timeout=10)
    assert child.returncode == 1
    assert "ValueError: boom" in err  # the default hook still printed the traceback
    ends = _kinds(tmp_path, "attempt_end")
    assert [(e["reason"], e["detail"]) for e in ends] == [("failed", "ValueError: boom")]
    assert len(_kinds(tmp_path, "client_stats")) == 1  # the exit hook flushed and shut down


def test_normal_exit_records_a_completed_attempt_and_delivers_it(tmp_path: Path, collector: FakeCollector) -> None:
    child = _spawn("""
        import ingest_client as goodput
        tracker = goodput.init()
        tracker.resumed(0)
        for step in range(1, 4):
            with tracker.step(step) as s:
                s.loss = 1.0
    """, tmp_path, GOODPUT_URL=collector.url)
    _, err = child.communicate(timeout=10)
    assert child.returncode == 0, err
    assert [e["reason"] for e in collector.of_kind("attempt_end")] == ["completed"]
    assert collector.step_numbers() == [1, 2, 3]
    assert not list((tmp_path / "spool").rglob("*.spool")), "all acknowledged: the spool is cleaned up"


def test_exit_with_the_collector_down_says_where_the_events_are_and_how_to_send_them(tmp_path: Path) -> None:
    child = _spawn("""
        import logging, ingest_client as goodput
        logging.basicConfig()  # the client logs through `logging`, like any library: shown once configured
        tracker = goodput.init()
        with tracker.step(1):
            pass
    """, tmp_path, GOODPUT_URL=closed_port_url(), GOODPUT_EXIT_TIMEOUT_S="1")
    _, err = child.communicate(timeout=20)
    assert child.returncode == 0, err
    run_dir = tmp_path / "spool" / run_dir_name("run-proc")
    assert f"kept in {run_dir}" in err and f"run `goodput sync {run_dir}`" in err, err
    assert [s for e in _kinds(tmp_path, "steps") for s in e["step"]] == [1]


def test_forked_child_sends_nothing_and_does_not_hang(make_tracker: Any, collector: FakeCollector) -> None:
    tracker = make_tracker(url=collector.url, flush_interval_s=0.01)
    tracker.record_step(1, time.time(), time.time())
    assert tracker.flush(5.0)
    pid = os.fork()
    if pid == 0:  # the child: a DataLoader worker, say
        code = 3
        try:
            started = time.monotonic()
            with tracker.step(999):
                pass
            tracker.record_step(998, time.time(), time.time())
            ok = tracker.flush(2.0) is False and tracker.shutdown(2.0) is False and not tracker.enabled
            code = 0 if ok and time.monotonic() - started < 1.0 else 4
        finally:
            os._exit(code)
    deadline = time.monotonic() + 10
    status = None
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.01)
    else:
        os.kill(pid, signal.SIGKILL)
        raise AssertionError("forked child hung")
    assert os.waitstatus_to_exitcode(status) == 0
    tracker.record_step(2, time.time(), time.time())
    assert tracker.flush(5.0), "the parent keeps working after fork"
    assert collector.step_numbers() == [1, 2]
    assert len(collector.of_kind("attempt_start")) == 1


def test_sigterm_is_a_preemption_only_when_the_launcher_marked_one(tmp_path: Path) -> None:
    """Under a scheduler, goodput launch creates the marker when the scheduler signals it; a SIGTERM without it
    (torchrun stopping the survivors of a crashed worker) stays a failure."""
    reasons = {}
    for marked in (True, False):
        run_dir = tmp_path / ("marked" if marked else "unmarked")
        marker = run_dir / "preempted"
        run_dir.mkdir()
        if marked:
            marker.touch()
        child = _spawn("""
            import time, ingest_client as goodput
            tracker = goodput.init()
            print("ready", flush=True)
            time.sleep(30)
        """, run_dir, GOODPUT_MODE="offline", GOODPUT_PREEMPTED_MARKER=str(marker))
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        child.send_signal(signal.SIGTERM)
        child.wait(10)
        reasons[marked] = [e["reason"] for e in _kinds(run_dir, "attempt_end")]
    assert reasons == {True: ["preempted"], False: ["failed"]}
