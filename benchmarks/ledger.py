"""Time to compute one run's ledger with 1,000,000 step events, from memory and from the database.

    python benchmarks/ledger.py [--steps 1000000] [--ranks 64]

The run is simulated (64 ranks, failures, restarts, checkpoints, a straggler, collective timings on every
step), stored through the collector's writer, and analysed three ways: from the events in memory, from
PostgreSQL, and from SQLite. From a database, two paths:

- every step row (`load_run_data`, then `build_ledger`): what exports and the resume check read;
- the block summaries, as the collector builds a run's ledger (`load_summarised_run_data`, services/derive/ledger.py):
  "cold" in a process that has not read the run (its summaries read from the database, folded beforehand as the
  collector's background analyst does), "warm" in one that has, after the last few steps of every rank arrived
  (its summary cache holds the rest; the changed blocks are folded and read again: the background analyst's
  round). The ledgers of every path are checked equal to the in-memory one.

Each figure is the best of --repeats runs; per-event times divide by the number of step events.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from benchmarks._common import machine, postgres_database
from services.analysis.ledger import build_ledger
from services.analysis.run_data import RunData, run_data_from_events
from services.collector.batch import parse_batch
from services.schemas.ledger import Ledger
from services.simulate import SimConfig, simulate
from services.storage.db import make_engine
from services.storage.load import load_run_data
from services.storage.migrate import upgrade
from services.storage.runs import get_run
from services.storage.step_blocks import fold_step_blocks, load_summarised_run_data
from services.storage.summary_cache import SummaryCache
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


def store(url: str, events: list[dict[str, Any]], *, migrate: bool = True) -> None:
    engine = make_engine(url)
    if migrate:
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


def last_records(events: list[dict[str, Any]], steps: int = 4) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the run just before each rank's last `steps` steps arrived, those steps as one record a rank): every event
    but each rank's last `steps` record, which is cut in two there, its columns sliced alike."""
    last: dict[int, int] = {}
    for i, e in enumerate(events):
        if e["kind"] == "steps":
            last[e["rank"]] = i
    cut = set(last.values())
    before: list[dict[str, Any]] = []
    tail: list[dict[str, Any]] = []
    for i, e in enumerate(events):
        n = len(e["step"]) if i in cut else 0
        if i not in cut:
            before.append(e)
        elif n <= steps:
            tail.append(e)
        else:
            columns = [k for k, v in e.items() if isinstance(v, list) and len(v) == n]
            before.append({**e, **{k: e[k][:-steps] for k in columns}, "event_id": f"{e['event_id']}:head"})
            tail.append({**e, **{k: e[k][-steps:] for k in columns}, "event_id": f"{e['event_id']}:tail"})
    return before, tail


@dataclass(frozen=True)
class Timings:
    load_s: float  # every step row
    ledger_s: float
    cold_s: float  # block summaries, a process that has not read the run: load + ledger
    warm_s: float  # block summaries, the summary cache holding all but the last records: fold, load + ledger
    warm_rows: int  # step rows in the last records


def from_database(url: str, run_id: str, events: list[dict[str, Any]], expected: Ledger, repeats: int) -> Timings:
    """Store the run but its last records, time the warm path as they arrive, then the rest on the whole run."""
    before, tail = last_records(events)
    store(url, before)
    engine = make_engine(url)
    with engine.connect() as conn:
        run = get_run(conn, run_id)
    fold_step_blocks(engine, run.pk)  # the background analyst's work, before anyone asks

    def warm() -> tuple[float, Ledger]:
        cache = SummaryCache()
        build_ledger(load_summarised_run_data(engine, run, cache))  # the cache as a build before the tail left it
        store(url, tail, migrate=False)
        with engine.connect() as conn:
            grown = get_run(conn, run_id)
        t = time.perf_counter()
        ledger = build_ledger(load_summarised_run_data(engine, grown, cache))
        return time.perf_counter() - t, ledger

    warm_s, warm_ledger = warm()  # once: the tail is stored once
    with engine.connect() as conn:
        run = get_run(conn, run_id)

    def load() -> RunData:
        with engine.connect() as conn:
            return load_run_data(conn, run)

    t_load, data = best(load, repeats)
    t_ledger, full_ledger = best(lambda: build_ledger(data), repeats)
    t_cold, cold_ledger = best(lambda: build_ledger(load_summarised_run_data(engine, run)), repeats)
    engine.dispose()
    paths = (("every row", full_ledger), ("summaries, cold", cold_ledger), ("summaries, warm", warm_ledger))
    for path, ledger in paths:
        if ledger != expected:
            raise SystemExit(f"the ledger from {url.split(':')[0]} ({path}) differs from the in-memory one")
    return Timings(t_load, t_ledger, t_cold, warm_s, sum(len(e["step"]) for e in tail))


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
    timings = {}
    with postgres_database() as pg_url:
        timings["postgresql"] = from_database(pg_url, config.run_id, result.events, ledger, args.repeats)
    with tempfile.TemporaryDirectory() as tmp:
        sqlite_url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        timings["sqlite"] = from_database(sqlite_url, config.run_id, result.events, ledger, args.repeats)
    for name, timing in timings.items():
        rows += [(f"{name}: load", timing.load_s), (f"{name}: build_ledger", timing.ledger_s),
                 (f"{name}: total", timing.load_s + timing.ledger_s), (f"{name}: summaries, cold", timing.cold_s),
                 (f"{name}: summaries, warm", timing.warm_s)]
    print(f"{'':<32}{'seconds':>10}{'us/step event':>16}{'x memory':>10}")
    for name, seconds in rows:
        print(f"{name:<32}{seconds:>10.3f}{seconds / n * 1e6:>16.3f}{seconds / t_mem:>10.2f}")
    warm_rows = timings["postgresql"].warm_rows
    print(f"every path's ledger equals the in-memory one; goodput of the run {ledger.goodput:.4f}")
    print(f"total: every step row read and analysed (exports, the resume check); summaries: as the collector builds "
          f"the ledger, cold in a process new to the run, warm after the last steps of each rank ({warm_rows:,} "
          "step rows) arrived")
    print("goal (issue 33): <= 0.25 s from PostgreSQL")


if __name__ == "__main__":
    main()
