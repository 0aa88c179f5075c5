"""Time to compute one run's ledger with 1,000,000 step events, from memory and from the database.

    python benchmarks/ledger.py [--steps 1000000] [--ranks 64]

The run is simulated (64 ranks, failures, restarts, checkpoints, a straggler, collective timings on every
step), stored through the collector's writer, and analysed three ways: from the events in memory, from
PostgreSQL, and from SQLite. Each figure is the best of --repeats runs; per-event times divide by the number
of step events.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from benchmarks._common import machine, postgres_database
from services.analysis.ledger import build_ledger
from services.analysis.run_data import RunData, run_data_from_events
from services.collector.batch import parse_batch
from services.simulate import SimConfig, simulate
from services.storage.db import make_engine
from services.storage.load import load_run_data
from services.storage.migrate import upgrade
from services.storage.runs import get_run
from services.storage.writer import BatchWriter

T = TypeVar("T")


def best(fn: Callable[[], T], repeats: int) -> tuple[float, T]:
    """The fastest of ``repeats`` calls, and the last call's value."""
    times: list[float] = []
    for _ in range(repeats):
        t = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - t)
    return min(times), value


def store(url: str, events: list[dict[str, Any]]) -> None:
    engine = make_engine(url)
    upgrade(engine)
    writer = BatchWriter(engine)
    writer.start()
    try:
        for i in range(0, len(events), 2000):
            records = parse_batch(json.dumps({"events": events[i:i + 2000]}).encode(), max_events=10**6,
                                  max_rows=10**8)
            writer.submit(records).result(timeout=600)
    finally:
        writer.stop()
    engine.dispose()


def from_database(url: str, run_id: str, repeats: int) -> tuple[float, float]:
    engine = make_engine(url)

    def load() -> RunData:
        with engine.connect() as conn:
            return load_run_data(conn, get_run(conn, run_id))

    t_load, data = best(load, repeats)
    t_ledger, _ = best(lambda: build_ledger(data), repeats)
    engine.dispose()
    return t_load, t_ledger


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1_000_000, help="step events (rank x step)")
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    per_rank = args.steps // args.ranks
    config = SimConfig(run_id="ledger-bench", ranks=args.ranks, hours=per_rank * 0.5 / 3600 * 0.93, step_s=0.5,
                       mtbf_s=per_rank * 0.5 / 3, checkpoint_every=500, straggler_rank=3, jitter=0.05, seed=1,
                       max_failures=3)
    t = time.perf_counter()
    result = simulate(config)
    data = run_data_from_events(config.run_id, result.events)
    n = len(data.steps)
    print(f"# ledger benchmark  ({machine()})")
    print(f"run: {args.ranks} ranks, {n:,} step events, {len(data.collectives):,} collective events, "
          f"{result.truth.failures} failures (simulated in {time.perf_counter() - t:.1f} s)")

    t_mem, ledger = best(lambda: build_ledger(data), args.repeats)
    rows = [("memory: build_ledger", t_mem)]
    with postgres_database() as pg_url:
        store(pg_url, result.events)
        pg_load, pg_ledger = from_database(pg_url, config.run_id, args.repeats)
    with tempfile.TemporaryDirectory() as tmp:
        sqlite_url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        store(sqlite_url, result.events)
        lite_load, lite_ledger = from_database(sqlite_url, config.run_id, args.repeats)
    rows += [("postgresql: load", pg_load), ("postgresql: build_ledger", pg_ledger),
             ("postgresql: total", pg_load + pg_ledger), ("sqlite: load", lite_load),
             ("sqlite: build_ledger", lite_ledger), ("sqlite: total", lite_load + lite_ledger)]
    print(f"{'':<28}{'seconds':>10}{'us/step event':>16}{'x memory':>10}")
    for name, seconds in rows:
        print(f"{name:<28}{seconds:>10.3f}{seconds / n * 1e6:>16.3f}{seconds / t_mem:>10.2f}")
    print(f"goal: under 1 s from the database; goodput of the run {ledger.goodput:.4f}")


if __name__ == "__main__":
    main()
