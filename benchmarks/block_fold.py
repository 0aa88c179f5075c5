"""Summarising one block of step rows on PostgreSQL, as the analyses do for every block that changed
(services.storage.step_blocks), against reading the same rows as the fold did before: fetched as Python tuples and
made a float64 matrix by `np.array`.

    python -m benchmarks.block_fold [--ranks 1024] [--repeats 12]

One run, one attempt, `--ranks` ranks of 128 steps each (one block) with comm, written through the collector's
writer into a throwaway database. Printed: the fold's CPU and wall time (median of the repeats after two warm-ups),
the old read's alone, and the ratios; and the CPU the database's backend spent for each (the mean over the repeats:
/proc counts in ticks of 10 ms), since what a read costs this process and what it costs PostgreSQL can move apart.
The old read is a single C call holding the GIL for the whole result: the longest such call is what every other
thread of the collector (the event loop, the writer) waits behind while an analysis folds a block
(benchmarks/gilprobe.py).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable

import numpy as np
from sqlalchemy import Connection, Engine

from benchmarks._common import machine, postgres_database
from benchmarks._procs import CLOCK_TICKS, backends, total_ticks
from services.analysis.step_blocks import BLOCK_STEPS
from services.collector.routes.ingest import validate_body
from services.settings import ServiceSettings
from services.storage import step_blocks
from services.storage.clock_readings import RequestClock
from services.storage.db import make_engine, psycopg_connection
from services.storage.migrate import upgrade
from services.storage.write import write_batches

_RANKS_A_REQUEST = 64
_OLD_READ = ("SELECT rank, step, start_time, end_time, coalesce(comm, 'NaN'::float8) FROM steps WHERE run_pk = %s "
             "AND attempt = 0 AND step >= 0 AND step < %s")


def seed(engine: Engine, ranks: int, rng: random.Random) -> int:
    """One block of `ranks` ranks' steps written as clients send them; returns the run's key."""
    settings = ServiceSettings()
    t0 = time.time() - 3600
    for first in range(0, ranks, _RANKS_A_REQUEST):
        events = []
        for rank in range(first, min(first + _RANKS_A_REQUEST, ranks)):
            ends = [t0 + step + rng.uniform(0.0, 0.02) for step in range(BLOCK_STEPS)]
            events.append({"event_id": f"steps-{rank}", "kind": "steps", "time": ends[-1], "run_id": "block-fold",
                           "attempt": 0, "rank": rank, "step": list(range(BLOCK_STEPS)),
                           "start": [end - 1.0 for end in ends], "end": ends,
                           "comm": [round(rng.uniform(0.05, 0.2), 4) for _ in ends]})
        now = time.time()
        records, clocks = validate_body(json.dumps({"events": events}).encode(), settings,
                                        RequestClock(received_at=now, sent_at=now))
        write_batches(engine, [records], clocks=[clocks])
    with engine.connect() as conn:
        return int(conn.exec_driver_sql("SELECT id FROM runs WHERE run_id = 'block-fold'").scalar_one())


def timed(engine: Engine, repeats: int, work: Callable[[Connection], object]) -> tuple[float, float, float]:
    """(median CPU s, median wall s, mean CPU s of the database's backends) of `work` in its own transaction, the
    first two runs left out."""
    database = engine.url.database
    assert database is not None
    cpu, wall = [], []
    backend_ticks = 0
    for run in range(repeats + 2):
        with engine.begin() as conn:
            ticks0 = total_ticks(backends(database))
            cpu0, wall0 = time.thread_time(), time.perf_counter()
            work(conn)
            cpu.append(time.thread_time() - cpu0)
            wall.append(time.perf_counter() - wall0)
            if run >= 2:
                backend_ticks += total_ticks(backends(database)) - ticks0
    return statistics.median(cpu[2:]), statistics.median(wall[2:]), backend_ticks / CLOCK_TICKS / repeats



def old_read(run_pk: int) -> Callable[[Connection], np.ndarray]:
    def read(conn: Connection) -> np.ndarray:
        with psycopg_connection(conn).cursor() as cursor:
            rows = cursor.execute(_OLD_READ, (run_pk, BLOCK_STEPS)).fetchall()
        return np.array(rows, dtype=np.float64).reshape(-1, 5)
    return read


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=12)
    args = ap.parse_args()
    print(f"# one block's fold on PostgreSQL  ({machine()})")
    with postgres_database() as url:
        engine = make_engine(url)
        upgrade(engine)
        run_pk = seed(engine, args.ranks, random.Random(1))
        rows = args.ranks * BLOCK_STEPS
        fold_cpu, fold_wall, fold_db = timed(engine, args.repeats,
                                             lambda conn: step_blocks._fold_block(conn, run_pk, 0, 0))
        read_cpu, read_wall, read_db = timed(engine, args.repeats, old_read(run_pk))
        engine.dispose()
    print(f"{args.ranks} ranks x {BLOCK_STEPS} steps = {rows:,} rows; median of {args.repeats}")
    print(f"fold (read, summarise, store): CPU {fold_cpu * 1e3:7.1f} ms  wall {fold_wall * 1e3:7.1f} ms  "
          f"PostgreSQL {fold_db * 1e3:7.1f} ms")
    print(f"old read alone (tuples, np.array): CPU {read_cpu * 1e3:7.1f} ms  wall {read_wall * 1e3:7.1f} ms  "
          f"PostgreSQL {read_db * 1e3:7.1f} ms")
    print(f"fold / old read: CPU {fold_cpu / read_cpu:.2f}  wall {fold_wall / read_wall:.2f}  "
          f"PostgreSQL {fold_db / read_db:.2f}")


if __name__ == "__main__":
    main()
