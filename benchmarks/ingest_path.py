"""The collector's ingest path without HTTP: a node relay's request inflated, parsed and checked as the ingest route
does, then written by the group-commit writer's code on PostgreSQL, timed in this process's CPU by group size.

    python -m benchmarks.ingest_path [--groups 1,2,4,8,16,32] [--rounds 8] [--relays 256] [--heartbeats]

Every request is what a node relay posts at the 5 s pace of a 100,000-GPU fleet (docs/architecture.md): for each of
its 8 ranks, the round's 5 steps as one merged `steps` record, 8 records and 40 step rows, gzip'd. A rank that steps
sends no heartbeat (ingest_client); `--heartbeats`: one per rank per request as well, 16 records, as clients did
before.
The relays' ranks form runs of 256. A group of N requests is written in one transaction, as the writer does with
the N requests queued while its last transaction committed; at the fleet's rate a process's groups hold 10-20
requests, at a quiet collector's one or two. Printed per group size: CPU per request of the route's part (inflate,
parse and validate, plausibility, clock readings) and of the writer's, both per step row, and each size's writer
cost as a ratio of groups of one (the baseline, measured in the same run): what a transaction's fixed cost adds
when groups are small. What `benchmarks.load` measures on top of this is HTTP, the event loop, the threads' hand-offs
and, on this VM, the cores shared with the load generator and PostgreSQL.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import random
import time

from sqlalchemy import Connection

from benchmarks._common import machine, postgres_database
from services.collector.batch import decompress
from services.collector.routes.ingest import validate_body
from services.settings import ServiceSettings
from services.storage.clock_readings import ClockReadings, RequestClock
from services.storage.db import make_engine
from services.storage.migrate import upgrade
from services.storage.records import IngestRecord
from services.storage.write import write_batches

RANKS_PER_RELAY = 8
RANKS_PER_RUN = 256
STEPS_PER_RECORD = 5  # one step a second at the 5 s pace


def relay_body(relay: int, round_: int, t0: float, rng: random.Random, heartbeats: bool = False) -> bytes:
    """One relay's gzip'd request of one round: 5 steps of each of its ranks, from its run's offset + round*5 + 1
    (and a heartbeat of each rank after them with `heartbeats`)."""
    events = []
    for g in range(relay * RANKS_PER_RELAY, (relay + 1) * RANKS_PER_RELAY):
        run, rank = divmod(g, RANKS_PER_RUN)
        # the runs are at different steps, as a fleet's are: their ranks fill a block of 128 steps (and move it) in
        # different rounds, so every group size pays its share of the moves
        first = (run * 53) % 128 + round_ * STEPS_PER_RECORD + 1
        steps = list(range(first, first + STEPS_PER_RECORD))
        ends = [t0 + s + rng.uniform(0.0, 0.02) for s in steps]
        common = {"run_id": f"ingest-path-{run:04d}", "attempt": 0, "rank": rank}
        events.append({"event_id": f"r{g}-{round_}-steps", "kind": "steps", "time": ends[-1], **common,
                       "step": steps, "start": [e - 1.0 for e in ends], "end": ends,
                       "comm": [round(rng.uniform(0.05, 0.2), 4) for _ in steps]})
        if heartbeats:
            events.append({"event_id": f"r{g}-{round_}-beat", "kind": "heartbeat", "time": ends[-1] + 0.5, **common,
                           "step": first + STEPS_PER_RECORD, "collectives": 0})
    return gzip.compress(json.dumps({"events": events}, separators=(",", ":")).encode(), compresslevel=5)


def route_part(body: bytes, settings: ServiceSettings) -> tuple[list[IngestRecord], ClockReadings]:
    """What the ingest route does with a body before it queues it: inflate, then its own `validate_body`."""
    now = time.time()
    raw = decompress(body, "gzip", settings.ingest.max_body_bytes)
    return validate_body(raw, settings, RequestClock(received_at=now, sent_at=now - 0.01))


def measure(conn: Connection, bodies: list[list[bytes]], group: int, settings: ServiceSettings,
            known_runs: dict[tuple[str, str], int]) -> tuple[float, float, int]:
    """(route CPU s, writer CPU s, requests) over `bodies` (rounds of every relay's request), in groups of `group`."""
    route_s = writer_s = 0.0
    requests = 0
    for round_bodies in bodies:
        for i in range(0, len(round_bodies), group):
            started = time.thread_time()
            parsed = [route_part(body, settings) for body in round_bodies[i:i + group]]
            parsed_at = time.thread_time()
            write_batches(conn, [records for records, _ in parsed], known_runs=known_runs,
                          clocks=[readings for _, readings in parsed])
            route_s += parsed_at - started
            writer_s += time.thread_time() - parsed_at
            requests += len(parsed)
    return route_s, writer_s, requests


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", default="1,2,4,8,16,32", help="group sizes (requests per transaction)")
    ap.add_argument("--rounds", type=int, default=8, help="rounds of every relay's request per group size")
    ap.add_argument("--relays", type=int, default=256, help="relays (8 ranks each)")
    ap.add_argument("--heartbeats", action="store_true",
                    help="a heartbeat of each rank in every request too, as clients sent them while ranks stepped")
    args = ap.parse_args()
    sizes = [int(g) for g in args.groups.split(",")]
    settings = ServiceSettings()
    rng = random.Random(1)
    t0 = time.time() - 3600
    rows_per_request = RANKS_PER_RELAY * STEPS_PER_RECORD
    records = RANKS_PER_RELAY * (2 if args.heartbeats else 1)
    print(f"# ingest path, no HTTP  ({machine()})")
    print(f"{args.relays} relays x {RANKS_PER_RELAY} ranks; a request: {records} records "
          f"({rows_per_request} step rows), gzip'd; {args.rounds} rounds per group size; CPU of this process")
    with postgres_database() as url:
        engine = make_engine(url)
        upgrade(engine)
        known_runs: dict[tuple[str, str], int] = {}
        round_numbers = itertools.count()  # every round once: each request is new

        def rounds(n: int) -> list[list[bytes]]:
            return [[relay_body(r, k, t0, rng, args.heartbeats) for r in range(args.relays)]
                    for k in itertools.islice(round_numbers, n)]

        with engine.connect() as conn:
            measure(conn, rounds(1), 8, settings, known_runs)  # runs created, numbers and marks warm
            results = [(size, *measure(conn, rounds(args.rounds), size, settings, known_runs)) for size in sizes]
        engine.dispose()
    base = results[0][2] / results[0][3] if sizes[0] == 1 else None  # the writer's CPU a request in groups of one
    print(f"{'requests a group':>17}{'route us/req':>14}{'writer us/req':>15}{'route us/row':>14}"
          f"{'writer us/row':>15}{'total us/row':>14}{'writer x one':>14}")
    for size, route_s, writer_s, requests in results:
        per_writer = writer_s / requests
        rows = requests * rows_per_request
        ratio = f"{per_writer / base:.2f}" if base else "-"
        print(f"{size:>17}{route_s / requests * 1e6:>14.0f}{per_writer * 1e6:>15.0f}{route_s / rows * 1e6:>14.1f}"
              f"{writer_s / rows * 1e6:>15.1f}{(route_s + writer_s) / rows * 1e6:>14.1f}{ratio:>14}")
    print("writer x one: the writer's CPU per request against groups of one request (the first size when it is 1)")


if __name__ == "__main__":
    main()
