"""benchmarks.requests' CPU of a round: what a server's event-loop thread burns counts as its event loop's, what its
other threads and child processes burn as theirs, and PostgreSQL's backends of the benchmark's database apart."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import psycopg
from sqlalchemy.engine import make_url

from benchmarks._procs import CLOCK_TICKS, backends, cpu_ticks, tree
from benchmarks.requests import CpuWindow, RoundCpu

BURN_S = 0.4
TICK_S = 0.02  # /proc counts CPU in ticks of 10 ms: two of slack


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def _burning_child(seconds: float) -> subprocess.Popen[bytes]:
    """A child that burns `seconds` of CPU, then sleeps (alive: a reaped child's CPU is no longer its own)."""
    code = (f"import time\nend = time.process_time() + {seconds}\nwhile time.process_time() < end: pass\n"
            "time.sleep(60)\n")
    return subprocess.Popen([sys.executable, "-c", code])


def test_the_main_thread_is_the_event_loop_and_other_threads_and_children_count_besides() -> None:
    window = CpuWindow(os.getpid())
    window.start()
    child = _burning_child(BURN_S)
    try:
        _burn(BURN_S)  # this (main) thread: the event loop's share
        helper = threading.Thread(target=_burn, args=(BURN_S,))
        helper.start()
        helper.join()
        assert child.pid in tree(os.getpid())
        deadline = time.monotonic() + 30
        while (cpu_ticks(child.pid) or 0) / CLOCK_TICKS < BURN_S and time.monotonic() < deadline:
            time.sleep(0.05)
        used = window.stop()
    finally:
        child.kill()
        child.wait()
    assert used.database == 0
    assert BURN_S - TICK_S <= used.event_loop < used.server
    # the helper thread's and the child's, besides the main thread's
    assert used.server - used.event_loop >= 2 * (BURN_S - TICK_S)
    assert used.seconds >= BURN_S


def test_the_backends_of_the_benchmarks_database_count_as_postgresql(postgres_url: str) -> None:
    database = make_url(postgres_url).database
    assert database is not None
    dsn = make_url(postgres_url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn) as conn:
        assert backends(database)  # this connection's backend, named by its title
        window = CpuWindow(os.getpid(), database)
        window.start()
        conn.execute("SELECT count(*) FROM generate_series(1, 3000000)").fetchone()
        used = window.stop()
    assert used.database >= TICK_S  # the backend counted the series
    assert used.database > used.server  # and this process only waited for it


def test_a_round_says_cores_and_cpu_per_request() -> None:
    line = RoundCpu(seconds=20.0, server=16.0, event_loop=10.0, database=6.0).line(requests=100_000)
    assert line == ("cpu 0.80 cores (160 us a request; event loop 0.50, other threads and processes 0.30), "
                    "PostgreSQL 0.30 cores (60 us a request)")
    assert "PostgreSQL" not in RoundCpu(seconds=20.0, server=20.0, event_loop=20.0, database=0.0).line(240_000)
