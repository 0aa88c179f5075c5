"""`goodput analyst`: a collector's background analyses and retention in a process of their own.

On PostgreSQL `goodput serve` starts one beside its workers (GOODPUT_ANALYST=auto or process) and starts it again
if it dies; the workers then run no background job. Building a run's analyses is seconds of Python and NumPy at a
time: in a worker's thread it shares the interpreter lock with the event loop and the writer, so every request
waits behind it now and then; in its own process it shares only the cores. The analyses it stores are read by every
worker (services.derive.cache), as they were when one worker's thread built them.

It can run alone too (a container of its own), with the collectors' GOODPUT_ANALYST=elsewhere: any number of
analysts share the work, one round at a time (PostgreSQL advisory locks).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

RESTART_DELAYS_S = (1.0, 2.0, 5.0, 15.0, 60.0)  # after each exit in a row; a process that ran a minute starts over
_STEADY_S = 60.0


def add_analyst_parser(sub: Any, db_help: str) -> None:  # Any: argparse's subparsers action type is private
    analyst = sub.add_parser(
        "analyst", help="run the background analyses and retention alone (what `goodput serve` starts beside its "
                        "workers on PostgreSQL)")
    analyst.add_argument("--db", help=db_help)
    # `goodput serve` passes its pid: the analyst ends with it, even when it was killed (SIGKILL sends no signal on)
    analyst.add_argument("--exit-with", type=int, help=argparse.SUPPRESS)
    analyst.set_defaults(handler=run_analyst)


def run_analyst(ns: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from services.cli.main import print_settings_problems
    from services.derive.background import BackgroundJobs
    from services.derive.cache import AnalysisCache
    from services.derive.memory import tune_allocator
    from services.metrics.instruments import CollectorInstruments
    from services.settings import ServerSettings
    from services.storage.db import UNREACHABLE_ERRORS, make_engine
    from services.storage.migrate import upgrade
    from services.storage.summary_cache import SummaryCache

    try:
        server = ServerSettings(**({"database_url": ns.db} if ns.db else {}))
    except ValidationError as exc:  # e.g. GOODPUT_RAW_RETENTION_DAYS=nan: said in one line each, nothing started
        print_settings_problems("goodput analyst", exc)
        return 1
    if server.database_url.startswith("sqlite"):
        print("goodput analyst: needs PostgreSQL; on SQLite (one writer) the collector runs its background analyses "
              "in its own process (GOODPUT_ANALYST=thread)", file=sys.stderr)
        return 1
    if server.warm_analyses_s <= 0 and server.prune_interval_s <= 0:
        print("goodput analyst: nothing to do: GOODPUT_WARM_ANALYSES_S and GOODPUT_PRUNE_INTERVAL_S are both 0",
              file=sys.stderr)
        return 0
    tune_allocator()
    engine = make_engine(server.database_url)
    try:
        upgrade(engine)  # one process at a time (an advisory lock): at head already when `goodput serve` started it
    except UNREACHABLE_ERRORS as exc:
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        print(f"goodput analyst: the database does not answer ({reason}); nothing started. Check "
              "GOODPUT_DATABASE_URL (or --db) and that PostgreSQL is up", file=sys.stderr)
        engine.dispose()
        return 1
    analyses = AnalysisCache(engine, summaries=SummaryCache(capacity_bytes=server.analysis_cache_mb << 20))
    instruments = CollectorInstruments.create()  # counted into `goodput serve`'s metrics files, summed by /metrics
    analyses.summaries.report_size_to(instruments.analysis_cache.set)
    analyses.report_cpu_to(instruments.analysis_cpu.inc)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    jobs = BackgroundJobs(analyses, server)
    jobs.start()
    try:
        while not stop.wait(1.0):
            if ns.exit_with is not None and os.getppid() != ns.exit_with:
                break  # `goodput serve` is gone
    finally:
        jobs.stop()
        engine.dispose()
    return 0


class AnalystProcess:
    """`goodput serve`'s analyst: started with the workers, started again when it exits on its own (after 1 s, then
    longer while it keeps exiting), stopped with the server."""

    def __init__(self, env: dict[str, str]) -> None:
        self._env = env
        self._stopping = threading.Event()
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._watch: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None else None

    def start(self) -> None:
        self._spawn()
        self._watch = threading.Thread(target=self._supervise, name="goodput-analyst-watch", daemon=True)
        self._watch.start()

    def stop(self, timeout_s: float = 15.0) -> None:
        self._stopping.set()
        with self._lock:
            proc = self._proc
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        _forget_metrics_of(proc.pid)

    def _spawn(self) -> None:
        with self._lock:
            if self._stopping.is_set():
                return
            # a session of its own: a terminal's Ctrl-C stops the server, which stops its analyst, not both at once
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "services.cli", "analyst", "--exit-with", str(os.getpid())], env=self._env,
                start_new_session=True)

    def _supervise(self) -> None:
        exits_in_a_row = 0
        while True:
            proc = self._proc
            assert proc is not None
            started = time.monotonic()
            code = proc.wait()
            if self._stopping.is_set():
                return
            _forget_metrics_of(proc.pid)
            exits_in_a_row = 1 if time.monotonic() - started >= _STEADY_S else exits_in_a_row + 1
            delay = RESTART_DELAYS_S[min(exits_in_a_row, len(RESTART_DELAYS_S)) - 1]
            print(f"goodput: the analyst process (pid {proc.pid}) exited with code {code}; starting it again in "
                  f"{delay:.0f} s. Meanwhile run pages build their analyses when opened, and raw rows are not pruned",
                  file=sys.stderr, flush=True)
            if self._stopping.wait(delay):
                return
            self._spawn()


def _forget_metrics_of(pid: int) -> None:
    """A dead process's gauges leave the sums (its counters stay counted, as a worker's do)."""
    from prometheus_client import multiprocess

    from services.metrics.instruments import multiprocess_dir

    if multiprocess_dir():
        multiprocess.mark_process_dead(pid)
