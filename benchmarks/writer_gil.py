"""The group-commit writer's wall time per group while another thread of its process runs Python, as the event loop
does under load, at several GIL switch intervals, in one run.

    python -m benchmarks.writer_gil [--groups 40] [--intervals 0.005,0.001,0.0005,0.0002]

Every group is what the writer commits under `benchmarks.requests`' load: 32 requests of one 2-step `steps` record
from one of 1,024 ranks, written by `write_batches` on PostgreSQL through one held connection. Each round trip of a
group releases the GIL a few times inside the driver (sending, polling, reading). With the process otherwise idle
the writer takes it straight back; with a thread running Python, CPython hands it back only when that thread is
made to switch, after the switch interval (5 ms by default), so a group's wall grows with its round trips times
the interval. Printed per interval: the group's wall alone and beside a busy thread (json.loads in a loop), the
writer thread's CPU per group, and the busy wall as a ratio of CPython's default (the baseline, measured in the same
run). The serving process sets its interval from this (services/collector/app.py, `GIL_SWITCH_INTERVAL_S`).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import threading
import time
from collections.abc import Iterator

from sqlalchemy import Connection

from benchmarks._common import machine, postgres_database
from services.collector.routes.ingest import validate_body
from services.settings import ServiceSettings
from services.storage.clock_readings import RequestClock
from services.storage.db import make_engine
from services.storage.migrate import upgrade
from services.storage.write import write_batches

REQUESTS_PER_GROUP = 32
RANKS = 1024


def request_bodies(t0: float, ranks: int = RANKS) -> Iterator[bytes]:
    """benchmarks/wrk/steps_record.lua's bodies: each a new event id and the next two steps of a rank, the ranks in
    turn."""
    for n in itertools.count(1):
        rank, step = n % ranks, (n // ranks) * 2 + 1
        start = t0 + step * 0.01
        yield json.dumps({"events": [{
            "event_id": f"w0-{n}", "run_id": "writer-gil", "kind": "steps", "time": start + 0.02, "attempt": 0,
            "rank": rank, "step": [step, step + 1], "start": [start, start + 0.01],
            "end": [start + 0.009, start + 0.019], "comm": [0.002, 0.003]}]}).encode()


def write_groups(conn: Connection, bodies: Iterator[bytes], groups: int, settings: ServiceSettings,
                 known_runs: dict[tuple[str, str], int]) -> tuple[float, float]:
    """(wall s, writer thread CPU s) per group over `groups` groups; the bodies are parsed before the clocks start."""
    wall = cpu = 0.0
    for _ in range(groups):
        now = time.time()
        parsed = [validate_body(next(bodies), settings, RequestClock(received_at=now, sent_at=now - 0.01))
                  for _ in range(REQUESTS_PER_GROUP)]
        started, started_cpu = time.perf_counter(), time.thread_time()
        write_batches(conn, [records for records, _ in parsed], known_runs=known_runs,
                      clocks=[readings for _, readings in parsed])
        wall += time.perf_counter() - started
        cpu += time.thread_time() - started_cpu
    return wall / groups, cpu / groups


class BusyThread:
    """A thread running Python until stopped: what the event loop is to the writer while it parses requests."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        body = json.dumps({"events": list(range(50))})
        while not self._stop.is_set():
            for _ in range(100):
                json.loads(body)

    def __enter__(self) -> BusyThread:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", type=int, default=40, help="groups per interval and condition")
    ap.add_argument("--intervals", default="0.005,0.001,0.0005,0.0002",
                    help="switch intervals in seconds; the first is the baseline (CPython's default: 0.005)")
    args = ap.parse_args()
    intervals = [float(x) for x in args.intervals.split(",")]
    settings = ServiceSettings()
    bodies = request_bodies(time.time() - 3600)
    default = sys.getswitchinterval()
    print(f"# the writer beside a busy thread  ({machine()})")
    print(f"groups of {REQUESTS_PER_GROUP} requests (one 2-step record each), {args.groups} groups per interval "
          "and condition, PostgreSQL")
    results = []
    with postgres_database() as url:
        engine = make_engine(url)
        upgrade(engine)
        known_runs: dict[tuple[str, str], int] = {}
        try:
            with engine.connect() as conn:
                write_groups(conn, bodies, 10, settings, known_runs)  # the run created, statements prepared
                for interval in intervals:
                    sys.setswitchinterval(interval)
                    alone = write_groups(conn, bodies, args.groups, settings, known_runs)
                    with BusyThread():
                        busy = write_groups(conn, bodies, args.groups, settings, known_runs)
                    results.append((interval, alone, busy))
        finally:
            sys.setswitchinterval(default)
            engine.dispose()
    base = results[0][2][0]
    print(f"{'switch interval':>16}{'alone ms':>10}{'busy ms':>9}{'alone CPU ms':>14}{'busy CPU ms':>13}"
          f"{'busy x first':>14}")
    for interval, (alone_wall, alone_cpu), (busy_wall, busy_cpu) in results:
        print(f"{interval * 1e3:>13.1f} ms{alone_wall * 1e3:>10.1f}{busy_wall * 1e3:>9.1f}{alone_cpu * 1e3:>14.2f}"
              f"{busy_cpu * 1e3:>13.2f}{busy_wall / base:>14.2f}")
    print("ms: per group of 32 requests (wall, and the writer thread's CPU); busy x first: the wall beside a busy "
          "thread against the first interval's")


if __name__ == "__main__":
    main()
