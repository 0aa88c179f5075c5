"""Load: many simulated ranks streaming into one collector on PostgreSQL, then the proof that nothing was lost.

    python -m benchmarks.load [--ranks 1024] [--duration 180] [--workers 1] [--connections 256]

Each simulated rank does one training step per second and, every 1-2 s (uniformly at random), posts one compact
`steps` record holding its steps since its last acknowledged post, each with its seconds inside collectives as
`comm` (what the real client sends). A post that fails (429/503 with Retry-After, a timeout, a refused
connection) is sent again with the same event id after the delay the collector asked for (else an exponential
backoff); steps made meanwhile wait for the next post, as in the client. Only loopback addresses are used.

Reported: throughput (step rows/s and requests/s), request latency p50/p99 (as the load generator saw it, in
the same 2-core machine), rejections by status and whether their retries succeeded, the collector's resident
memory over time (all its processes, from /proc), and the ledger check: every (rank, step) made is stored in
`steps` exactly once and the ledger counts every step.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from sqlalchemy import text

from benchmarks._common import REPO, free_port, machine, postgres_database
from services.storage.db import make_engine

RUN_ID = "load-bench"


@dataclass
class Stats:
    latencies_s: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    retried_then_ok: int = 0
    requests_ok: int = 0
    rows_acked: int = 0


@dataclass
class Rank:
    rank: int
    made: int = 0  # steps generated so far: 1..made
    acked: int = 0  # steps acknowledged: 1..acked


def _record(rank: Rank, first: int, last: int, t0: float, rng: random.Random) -> dict[str, object]:
    steps = list(range(first, last + 1))
    return {"event_id": f"r{rank.rank}-s{first}-{last}", "run_id": RUN_ID, "kind": "steps", "time": t0 + last,
            "attempt": 0, "rank": rank.rank, "step": steps, "start": [t0 + s - 1 for s in steps],
            "end": [t0 + s - 0.02 for s in steps], "comm": [round(rng.uniform(0.05, 0.2), 4) for _ in steps]}


async def _post(client: httpx.AsyncClient, url: str, body: Mapping[str, object], stats: Stats,
                deadline: float) -> int | None:
    """Post until acknowledged or the deadline; the accepted row count, None if given up."""
    delay = 0.5
    tries = 0
    while time.monotonic() < deadline:
        tries += 1
        started = time.perf_counter()
        try:
            response = await client.post(url, json=body)
        except httpx.HTTPError as exc:
            stats.errors[type(exc).__name__] += 1
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, 30.0)
            continue
        stats.latencies_s.append(time.perf_counter() - started)
        stats.statuses[response.status_code] += 1
        if response.status_code == 200:
            stats.requests_ok += 1
            if tries > 1:
                stats.retried_then_ok += 1
            return int(response.json()["accepted"])
        if response.status_code in (429, 503):
            retry_after = float(response.headers.get("Retry-After", delay))
            await asyncio.sleep(retry_after * random.uniform(1.0, 1.5))
            continue
        raise RuntimeError(f"the collector refused a batch: {response.status_code} {response.text[:300]}")
    return None


async def _rank_loop(rank: Rank, client: httpx.AsyncClient, url: str, t0: float, started: float,
                     duration_s: float, stats: Stats, rng: random.Random) -> None:
    start_event = {"event_id": f"r{rank.rank}-start", "run_id": RUN_ID, "kind": "attempt_start", "time": t0,
                   "attempt": 0, "rank": rank.rank, "world_size": RANKS, "host": f"node{rank.rank // 8}"}
    await asyncio.sleep(rng.uniform(0, 2.0))  # ranks do not start in the same millisecond
    await _post(client, url, {"events": [start_event]}, stats, started + duration_s + 120)
    while True:
        now = time.monotonic()
        rank.made = min(int(now - started), int(duration_s))  # one step per second of wall time
        final = now - started >= duration_s
        if rank.made > rank.acked:
            body = {"events": [_record(rank, rank.acked + 1, rank.made, t0, rng)]}
            if await _post(client, url, body, stats, started + duration_s + 120) is not None:
                stats.rows_acked += rank.made - rank.acked
                rank.acked = rank.made
        if final and rank.acked >= rank.made:
            return
        await asyncio.sleep(rng.uniform(1.0, 2.0))


def _rss_kib(root_pid: int) -> int:
    """Resident memory of a process and its children (the uvicorn workers)."""
    total = 0
    pids = [root_pid]
    try:
        children = subprocess.run(["pgrep", "-P", str(root_pid)], capture_output=True, text=True, check=False)
        pids += [int(p) for p in children.stdout.split()]
    except OSError:
        pass
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


RANKS = 1024


async def _drive(url: str, ranks: int, duration_s: float, connections: int) -> tuple[Stats, list[Rank], float]:
    stats = Stats()
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    t0 = time.time()
    started = time.monotonic()
    all_ranks = [Rank(r) for r in range(ranks)]
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(30.0, pool=60.0)) as client:
        await asyncio.gather(*(_rank_loop(r, client, f"{url}/v1/events", t0, started, duration_s, stats,
                                          random.Random(r.rank)) for r in all_ranks))
    return stats, all_ranks, time.monotonic() - started


def _verify(db_url: str, ranks: list[Rank]) -> dict[str, object]:
    engine = make_engine(db_url)
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT s.rank, count(*), count(DISTINCT s.step), min(s.step), max(s.step) FROM steps s "
            "JOIN runs r ON r.id = s.run_pk WHERE r.run_id = :run GROUP BY s.rank"), {"run": RUN_ID}).all()
    engine.dispose()
    by_rank = {int(r[0]): (int(r[1]), int(r[2]), int(r[3]), int(r[4])) for r in rows}
    bad = [r.rank for r in ranks if by_rank.get(r.rank) != (r.made, r.made, 1, r.made) and r.made > 0]
    return {"ranks_checked": len(ranks), "steps_made": sum(r.made for r in ranks),
            "rows_stored": sum(v[0] for v in by_rank.values()), "ranks_wrong": bad[:20]}


def main(argv: list[str] | None = None) -> int:
    global RANKS
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=1024)
    p.add_argument("--duration", type=float, default=180.0, help="seconds of streaming (default 180)")
    p.add_argument("--workers", type=int, default=1, help="collector processes")
    p.add_argument("--connections", type=int, default=256, help="HTTP connections the load generator keeps")
    p.add_argument("--json", help="also write the results as JSON to this file")
    ns = p.parse_args(argv)
    if not 1 <= ns.ranks <= 100_000 or not 1 <= ns.duration <= 24 * 3600:
        p.error("--ranks must be 1-100000 and --duration 1-86400 seconds")
    RANKS = ns.ranks
    with postgres_database() as db_url:
        port = free_port()
        env = {**os.environ, "GOODPUT_DATABASE_URL": db_url, "PYTHONPATH": str(REPO)}
        proc = subprocess.Popen([sys.executable, "-m", "services.cli", "serve", "--host", "127.0.0.1", "--port",
                                 str(port), "--workers", str(ns.workers), "--no-dashboard"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        rss: list[tuple[float, int]] = []
        stop = threading.Event()
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.2)
            else:
                raise SystemExit("the collector did not start")
            began = time.monotonic()

            def sample() -> None:
                while not stop.is_set():
                    rss.append((time.monotonic() - began, _rss_kib(proc.pid)))
                    stop.wait(5.0)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            print(f"driving {ns.ranks} ranks for {ns.duration:.0f} s against {url} ({ns.workers} worker(s)) ...",
                  flush=True)
            stats, ranks, wall_s = asyncio.run(_drive(url, ns.ranks, ns.duration, ns.connections))
            stop.set()
            sampler.join(10)
            ledger = httpx.get(f"{url}/v1/runs/{RUN_ID}/waste", timeout=600).json()
            check = _verify(db_url, ranks)
        finally:
            stop.set()
            proc.terminate()
            proc.wait(30)
    lat = sorted(stats.latencies_s)
    result = {
        "machine": machine(), "ranks": ns.ranks, "duration_s": ns.duration, "wall_s": round(wall_s, 1),
        "workers": ns.workers, "connections": ns.connections,
        "requests": sum(stats.statuses.values()), "requests_ok": stats.requests_ok,
        "requests_per_s": round(stats.requests_ok / wall_s, 1),
        "step_rows_per_s": round(stats.rows_acked / wall_s, 1),
        "latency_p50_ms": round(1000 * statistics.median(lat), 1) if lat else None,
        "latency_p99_ms": round(1000 * lat[int(0.99 * (len(lat) - 1))], 1) if lat else None,
        "latency_max_ms": round(1000 * lat[-1], 1) if lat else None,
        "statuses": dict(stats.statuses), "transport_errors": dict(stats.errors),
        "rejected_then_acknowledged": stats.retried_then_ok,
        "rss_mib": [(round(t), round(k / 1024, 1)) for t, k in rss],
        "rss_max_mib": round(max((k for _, k in rss), default=0) / 1024, 1),
        "ledger_steps": ledger.get("steps"), **check,
    }
    print(json.dumps(result, indent=2))
    ok = (not check["ranks_wrong"] and check["rows_stored"] == check["steps_made"]
          and ledger.get("steps", {}).get("computed") == max(r.made for r in ranks))
    print("nothing lost or duplicated: every (rank, step) made is stored exactly once" if ok
          else "MISMATCH: see ranks_wrong / rows_stored / steps_made above")
    if ns.json:
        Path(ns.json).write_text(json.dumps(result, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
