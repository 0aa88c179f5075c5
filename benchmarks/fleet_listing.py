"""The fleet's list pages with thousands of runs: `GET /v1/runs` and `GET /v1/fleet/window`, unpaged, and the live
answers of its running runs (`/v1/live`, `/v1/preemption-candidates`), on PostgreSQL and SQLite.

    python -m benchmarks.fleet_listing [--runs 3000] [--db postgresql,sqlite] [--ranks 4] [--steps 120]

A fleet of `--runs` simulated runs (services.simulate: `--ranks` ranks, about `--steps` steps each, failures and
restarts, every 7th run with a straggler, one run in 50 still running), started one after another so that the last
ones run now, is written through the collector's writer (the compact records the client sends) into a new
database, and every run's ledger is built and stored as the collector's background analyst keeps it. Then, each
endpoint in a collector process of its own started for it (`goodput serve`, background analysis off), asked for
every run (`limit=10000`):

- cold: the first request of the process (nothing of the fleet in its memory; the database's own cache is warm);
- warm: the same request again, three times (the median printed).

Baseline, measured in the same run: a bare `SELECT * FROM runs` of the fleet (every column, the stored ledgers
included) from a new connection, in this process. Printed: the times, and their ratio to the baseline; and, for
where the rest goes, the time the running runs' hang verdicts take in this process (each a few index lookups:
services.derive.live.live_hangs; the simulated running runs stopped mid-run, so they are all hung by then: the
worst case, each then listed from its whole ledger with its hang so far).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
from sqlalchemy import text

from benchmarks._common import collector, machine, postgres_database
from services.collector.batch import parse_batch
from services.derive.cache import AnalysisCache
from services.derive.ledger import current_ledger
from services.derive.live import live_config, live_hangs
from services.settings import ServiceSettings
from services.simulate import SimConfig, simulate
from services.storage.db import make_engine
from services.storage.migrate import upgrade
from services.storage.runs import list_runs
from services.storage.writer import BatchWriter

RUN_SPACING_S = 600.0  # one run starts every 10 minutes
STEP_S = 1.0


def fleet_events(runs: int, ranks: int, steps: int, now: float) -> Iterator[list[dict[str, Any]]]:
    """Each run's events: finished and failed runs with failures and restarts, stragglers, a few running ones."""
    first = now - runs * RUN_SPACING_S - steps * STEP_S
    for i in range(runs):
        running = i % 50 == 49
        config = SimConfig(run_id=f"fleet-{i:05d}", ranks=ranks, hours=steps * STEP_S / 3600, step_s=STEP_S,
                           mtbf_s=steps * STEP_S * (0.5 + i % 4), checkpoint_every=max(steps // 6, 1),
                           checkpoint_s=2.0, startup_s=10.0, queue_s=30.0, detect_s=10.0,
                           straggler_rank=1 % ranks if i % 7 == 0 else None,
                           end="running" if running else ("failed" if i % 11 == 5 else "finished"),
                           max_failures=3, seed=i, start_time=first + i * RUN_SPACING_S, records_per_rank=20,
                           heartbeat_s=5.0 if running else None)
        yield simulate(config).events


def build_fleet(url: str, runs: int, ranks: int, steps: int) -> dict[str, float]:
    engine = make_engine(url)
    upgrade(engine)
    writer = BatchWriter(engine)
    writer.start()
    started = time.monotonic()
    rows = 0
    try:
        batch: list[dict[str, Any]] = []
        for events in fleet_events(runs, ranks, steps, time.time()):
            batch.extend(events)
            if len(batch) >= 5000:
                rows += _write(writer, batch)
                batch = []
        if batch:
            rows += _write(writer, batch)
    finally:
        writer.stop()
    written = time.monotonic() - started
    started = time.monotonic()
    analyses = AnalysisCache(engine)
    with engine.connect() as conn:
        listed = list_runs(conn, limit=runs)
    for row in listed:
        current_ledger(analyses, row)
    analysed = time.monotonic() - started
    engine.dispose()
    return {"records": rows, "write_s": written, "analyse_s": analysed}


def _has_runs(url: str) -> bool:
    """Whether `url` (--url) holds a fleet already (built by an earlier run of this benchmark): measured as it is,
    upgraded to this checkout's migrations."""
    engine = make_engine(url)
    try:
        upgrade(engine)
        with engine.connect() as conn:
            return bool(conn.execute(text("SELECT count(*) FROM runs")).scalar())
    finally:
        engine.dispose()


def _write(writer: BatchWriter, events: list[dict[str, Any]]) -> int:
    records = parse_batch(json.dumps({"events": events}).encode(), max_events=10**6, max_rows=10**8)
    writer.submit(records).result(timeout=600)
    return len(events)


def bare_select_s(url: str) -> float:
    engine = make_engine(url)
    try:
        started = time.monotonic()
        with engine.connect() as conn:
            conn.execute(text("SELECT * FROM runs")).all()
        return time.monotonic() - started
    finally:
        engine.dispose()


def hang_verdicts(url: str) -> dict[str, float]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            running = list_runs(conn, status="running", limit=10_000)
        started = time.monotonic()
        hung = live_hangs(engine, running, time.time(), live_config(ServiceSettings()))  # as `goodput serve`
        return {"running": len(running), "hung": len(hung), "seconds": time.monotonic() - started}
    finally:
        engine.dispose()


def timed_get(client: httpx.Client, path: str) -> tuple[float, dict[str, Any]]:
    started = time.monotonic()
    response = client.get(path)
    seconds = time.monotonic() - started
    response.raise_for_status()
    return seconds, response.json()


@contextmanager
def quiet_collector(url: str) -> Iterator[httpx.Client]:
    os.environ["GOODPUT_WARM_ANALYSES_S"] = "0"
    os.environ["GOODPUT_RAW_RETENTION_DAYS"] = "0"
    with collector(url) as base, httpx.Client(base_url=base, timeout=600) as client:
        yield client


# (name, path, the answer's list): the lists of every run, then the live ones of the running runs
ENDPOINTS = (("/v1/runs", "/v1/runs?limit=10000", "runs"), ("/v1/fleet/window", "/v1/fleet/window?limit=10000", "runs"),
             ("/v1/live", "/v1/live", "runs"), ("/v1/preemption-candidates", "/v1/preemption-candidates", "candidates"))


def measure_endpoint(url: str, path: str, key: str) -> dict[str, Any]:
    with quiet_collector(url) as client:
        cold, body = timed_get(client, path)
        warm = [timed_get(client, path)[0] for _ in range(3)]
    runs = body[key]
    return {"cold_s": cold, "warm_s": statistics.median(warm), "runs": len(runs),
            "stale": sum(1 for r in runs if (r.get("run") or r).get("stale")), "bytes": len(json.dumps(body))}


def measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    built = build_fleet(url, args.runs, args.ranks, args.steps) if not _has_runs(url) else {}
    baseline = statistics.median(bare_select_s(url) for _ in range(3))
    out: dict[str, Any] = {"fleet": built, "baseline_s": baseline, "hangs": hang_verdicts(url)}
    for name, path, key in ENDPOINTS:
        out[name] = measure_endpoint(url, path, key)
    return out


def report(db: str, result: dict[str, Any]) -> None:
    fleet, baseline = result["fleet"], result["baseline_s"]
    if fleet:
        print(f"\n{db}: {fleet['records']:,} records written in {fleet['write_s']:.1f} s; every run's ledger built "
              f"and stored in {fleet['analyse_s']:.1f} s")
    else:
        print(f"\n{db}: the fleet already stored there")
    print(f"  baseline: SELECT * FROM runs {baseline * 1000:.1f} ms")
    hangs = result["hangs"]
    print(f"  hang verdicts of the {hangs['running']} running runs ({hangs['hung']} hung): "
          f"{hangs['seconds'] * 1000:,.0f} ms")
    for name, _, _ in ENDPOINTS:
        r = result[name]
        print(f"  {name:<26} {r['runs']:,} runs ({r['stale']} stale), "
              f"{r['bytes'] / 1e6:.1f} MB: cold {r['cold_s'] * 1000:,.0f} ms ({r['cold_s'] / baseline:.1f}x the "
              f"baseline), warm {r['warm_s'] * 1000:,.0f} ms ({r['warm_s'] / baseline:.1f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3000)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=120, help="steps of useful work per run")
    parser.add_argument("--db", default="postgresql,sqlite")
    parser.add_argument("--url", help="measure this database (the fleet is built there when it holds no run yet) "
                        "instead of a new one, which is dropped afterwards")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    print(f"machine: {machine()}; {args.runs:,} runs x {args.ranks} ranks x ~{args.steps} steps")
    results: dict[str, Any] = {}
    for db in [args.url] if args.url else args.db.split(","):
        if db == args.url:
            results[db] = measure(db, args)
        elif db == "postgresql":
            with postgres_database() as url:
                results[db] = measure(url, args)
        elif db == "sqlite":
            with tempfile.TemporaryDirectory() as tmp:
                results[db] = measure(f"sqlite:///{tmp}/fleet.db", args)
        else:
            parser.error(f"--db: postgresql or sqlite, not {db!r}")
        report(db, results[db])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
