"""Step events per second through HTTP into PostgreSQL, next to raw binary COPY of the same rows.

    python benchmarks/ingest.py [--rows 1000000] [--steps-per-record 200] [--records-per-request 10]

The collector runs as its own process (`goodput serve`, one worker) and the load generator in this one, on the
same machine. Bodies are built before timing starts. The baseline copies the same rows into the same (emptied)
`steps` table with PostgreSQL binary COPY, in 100,000-row transactions, in the same run. `steps` is partitioned by
day of end_time (migration 0007): both paths COPY into the partitioned table, which routes every row to the same
partition (printed: the rows' day is older than the partitions made ahead, so DEFAULT); the HTTP path also writes
the events rows, step_marks and the runs row of each transaction, as the collector does.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from http.client import HTTPConnection
from urllib.parse import urlsplit

import numpy as np
from sqlalchemy import Engine, text

from benchmarks._common import collector, machine, postgres_database
from services.storage.db import make_engine
from services.storage.migrate import upgrade
from services.storage.step_columns import stored_step_count
from services.storage.write import copy_steps

T0 = 1_767_225_600.0


def build_bodies(rows: int, steps_per_record: int, records_per_request: int) -> list[bytes]:
    bodies = []
    per_request = steps_per_record * records_per_request
    n_requests = rows // per_request
    for q in range(n_requests):
        events = []
        for k in range(records_per_request):
            rank = k
            first = q * steps_per_record + 1
            steps = list(range(first, first + steps_per_record))
            start = [T0 + s * 0.5 for s in steps]
            events.append({"event_id": f"b{q}-r{rank}", "run_id": "bench", "kind": "steps", "time": start[-1] + 0.5,
                           "attempt": 0, "rank": rank, "step": steps, "start": start,
                           "end": [s + 0.4 for s in start], "loss": [2.0] * steps_per_record})
        bodies.append(json.dumps({"schema_version": 1, "events": events}).encode())
    return bodies


def send_all(url: str, bodies: list[bytes], concurrency: int) -> tuple[float, int, int]:
    """POST every body, `concurrency` at a time, on kept-alive connections; (seconds, events accepted, 503s).
    The load generator shares the machine's cores with the collector and PostgreSQL, so it is the standard
    library's http.client (a few us per request), not httpx (about 1.4 ms of CPU per 140 kB request, 0.7 s per
    million events). A 503 (the collector's write queue is full: it holds about a second of writing, and a
    collector that has not measured its pace yet holds 5,000 rows) is sent again after its Retry-After, as the
    client does; the time waited counts."""
    queue = list(reversed(bodies))
    lock = threading.Lock()
    accepted = [0]
    overloaded = [0]
    errors: list[str] = []
    address = urlsplit(url)
    headers = {"Content-Type": "application/json"}

    def worker() -> None:
        http = HTTPConnection(address.hostname or "127.0.0.1", address.port, timeout=120)
        try:
            while True:
                with lock:
                    if not queue:
                        return
                    body = queue.pop()
                http.request("POST", "/v1/events", body=body, headers=headers)
                response = http.getresponse()
                answer = response.read()
                if response.status == 503:
                    with lock:
                        overloaded[0] += 1
                        queue.append(body)
                    time.sleep(float(response.getheader("Retry-After") or 1))
                    continue
                if response.status != 200:
                    errors.append(answer[:200].decode(errors="replace"))
                    return
                with lock:
                    accepted[0] += json.loads(answer)["accepted"]
        finally:
            http.close()

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    elapsed = time.perf_counter() - t
    if errors:
        raise RuntimeError(f"ingest failed: {errors[0]}")
    return elapsed, accepted[0], overloaded[0]


def copy_baseline(engine: Engine, rows: int, chunk: int = 100_000) -> float:
    n = rows
    cols: dict[str, np.ndarray] = {
        "run_pk": np.ones(n, dtype=np.int32), "attempt": np.zeros(n, dtype=np.int32),
        "rank": (np.arange(n) % 10).astype(np.int32), "step": np.arange(n, dtype=np.int64),
        "start_time": T0 + np.arange(n) * 0.5, "end_time": T0 + np.arange(n) * 0.5 + 0.4,
        "loss": np.full(n, 2.0), "lr": np.full(n, np.nan), "comm": np.full(n, np.nan),
    }
    t = time.perf_counter()
    for i in range(0, n, chunk):
        with engine.begin() as conn:
            copy_steps(conn, {k: v[i:i + chunk] for k, v in cols.items()})
    return time.perf_counter() - t


_EMPTY = "TRUNCATE steps, step_columns, step_marks, step_blocks, events, runs RESTART IDENTITY CASCADE"


def _partitions(engine: Engine) -> str:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT tableoid::regclass::text, count(*) FROM steps GROUP BY 1 ORDER BY 1")).all()
    return ", ".join(f"{name} {count:,}" for name, count in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--steps-per-record", type=int, default=200)
    ap.add_argument("--records-per-request", type=int, default=10)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    bodies = build_bodies(args.rows, args.steps_per_record, args.records_per_request)
    rows = len(bodies) * args.steps_per_record * args.records_per_request
    print(f"# ingest benchmark  ({machine()})")
    print(f"{rows} step events in {len(bodies)} requests of {args.records_per_request} compact records x "
          f"{args.steps_per_record} steps; {args.concurrency} concurrent senders; best of {args.repeats}")
    with postgres_database() as url:
        engine = make_engine(url)
        upgrade(engine)
        best_copy = best_http = float("inf")
        with collector(url) as base:
            for rep in range(args.repeats):
                with engine.begin() as conn:
                    conn.execute(text(_EMPTY))
                best_copy = min(best_copy, copy_baseline(engine, rows))
                copied_into = _partitions(engine)
                with engine.begin() as conn:
                    conn.execute(text(_EMPTY))
                elapsed, accepted, refused = send_all(base, bodies, args.concurrency)
                with engine.connect() as conn:
                    stored = stored_step_count(conn)  # in `steps` and in block rows
                if stored != rows or accepted != len(bodies) * args.records_per_request:
                    raise RuntimeError(f"stored {stored} rows of {rows}")
                best_http = min(best_http, elapsed)
                if rep == 0:
                    print(f"  rows landed in: COPY {copied_into}, HTTP {_partitions(engine)}")
                print(f"  run {rep + 1}: COPY {rows / best_copy:,.0f} rows/s   HTTP {rows / elapsed:,.0f} events/s   "
                      f"({refused} requests answered 503 and sent again)")
        engine.dispose()
    http_rate, copy_rate = rows / best_http, rows / best_copy
    print(f"raw binary COPY : {copy_rate:12,.0f} rows/s")
    print(f"HTTP ingest     : {http_rate:12,.0f} step events/s")
    print(f"ratio HTTP/COPY : {http_rate / copy_rate:12.2f}   (goal >= 0.7; goal >= 100,000 events/s)")


if __name__ == "__main__":
    main()
