"""What PostgreSQL spends writing a step record today against one row per record (a design measured, not built).

    python -m benchmarks.record_rows [--groups 800] [--rounds 2]

Today a compact step record of the fleet's shape (a rank's 5 steps) is written as its `events` row (the idempotency
key: run, event id, digest) and its 5 `steps` rows (binary COPY), as services.storage.write does, in groups of 64
records (a group of 8 node relays' requests). The alternative keeps one row per record: the same key and digest with
the record's columns as they arrived (packed float64/int64 bytes, 240 B for 5 steps) in a `step_records` table keyed
like `events`, with an index by (run, attempt, rank, first step) for the block moves. Both write into the real
migrated schema of a throwaway database, in alternation (today, records, today, ...), the same rows; the time is
the statements' and the commit's as the client waits for them (the rows are encoded before the clock starts), and the
bytes are the tables' and indexes' after the run. Nothing else of the product reads `step_records`: the figure is the
ceiling of what moving to record rows would save on PostgreSQL (docs/architecture.md, "Where PostgreSQL's time goes").
"""

from __future__ import annotations

import argparse
import base64
import random
import statistics
import time
from collections.abc import Callable

import numpy as np
import psycopg
from sqlalchemy import text
from sqlalchemy.engine import make_url

from benchmarks._common import machine, postgres_database
from services.storage import pgcopy
from services.storage.db import json_rows, make_engine
from services.storage.migrate import upgrade
from services.storage.write import _INSERT_EVENTS_SQL

STEPS_PER_RECORD = 5
RECORDS_PER_GROUP = 64
RANKS = 2048
_RECORD_TABLE = (
    "CREATE TABLE step_records (run_pk int4 NOT NULL, event_id varchar(128) NOT NULL, time float8, attempt int4, "
    "rank int4, first_step int8, last_step int8, content_hash varchar(32), columns bytea, "
    "PRIMARY KEY (run_pk, event_id))",
    "CREATE INDEX ix_step_records_run_attempt_rank_step ON step_records (run_pk, attempt, rank, first_step)",
)
_INSERT_RECORDS_SQL = (
    "INSERT INTO step_records (run_pk, event_id, time, attempt, rank, first_step, last_step, content_hash, columns) "
    "SELECT (r->>0)::int4, r->>1, (r->>2)::float8, (r->>3)::int4, (r->>4)::int4, (r->>5)::int8, (r->>6)::int8, "
    "r->>7, decode(r->>8, 'base64') FROM jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS v(r, n) ORDER BY n "
    "ON CONFLICT (run_pk, event_id) DO NOTHING RETURNING run_pk, event_id")
_COPY_STEPS_SQL = f"COPY steps ({', '.join(pgcopy.STEP_COPY_COLUMNS)}) FROM STDIN (FORMAT binary)"

# (run pk, event id, time, rank, steps, starts, ends, digest)
_Record = tuple[int, str, float, int, np.ndarray, np.ndarray, np.ndarray, str]


class Fleet:
    """Each rank's next record of 5 steps, ranks drawn at random, ids as the client makes them (process, sequence)."""

    def __init__(self, run_pks: list[int], seed: int = 1) -> None:
        self._rng = random.Random(seed)
        self._run_pks = run_pks
        self._procs = [f"{self._rng.getrandbits(64):016x}" for _ in range(RANKS)]
        self._seq = [0] * RANKS
        self._t0 = time.time()

    def group(self) -> list[_Record]:
        records = []
        for _ in range(RECORDS_PER_GROUP):
            rank = self._rng.randrange(RANKS)
            first = self._seq[rank] * STEPS_PER_RECORD
            self._seq[rank] += 1
            steps = np.arange(first, first + STEPS_PER_RECORD, dtype=np.int64)
            starts = self._t0 + steps + self._rng.random() * 1e-3
            ends = starts + 0.9
            records.append((self._run_pks[rank % len(self._run_pks)], f"{self._procs[rank]}-{self._seq[rank]}",
                            float(ends[-1]), rank, steps, starts, ends, f"{self._rng.getrandbits(128):032x}"))
        return sorted(records, key=lambda r: (r[0], r[1]))  # the writer's key order


def write_today(conn: psycopg.Connection, records: list[_Record]) -> Callable[[], None]:
    events = json_rows([(pk, event_id, "steps", t, 0, rank, int(steps[-1]), f'{{"n":{len(steps)}}}', digest)
                        for pk, event_id, t, rank, steps, _, _, digest in records])
    n = sum(len(r[4]) for r in records)
    nan = np.full(n, np.nan)
    body = pgcopy.encode_step_rows(
        np.repeat(np.array([r[0] for r in records], np.int32), STEPS_PER_RECORD), np.zeros(n, np.int32),
        np.repeat(np.array([r[3] for r in records], np.int32), STEPS_PER_RECORD),
        np.concatenate([r[4] for r in records]), np.concatenate([r[5] for r in records]),
        np.concatenate([r[6] for r in records]), nan, nan, nan)

    def write() -> None:
        conn.execute(_INSERT_EVENTS_SQL, (events,)).fetchall()
        with conn.cursor().copy(_COPY_STEPS_SQL) as copy:
            copy.write(pgcopy.HEADER + body + pgcopy.TRAILER)
    return write


def write_records(conn: psycopg.Connection, records: list[_Record]) -> Callable[[], None]:
    nan = np.full(STEPS_PER_RECORD, np.nan)
    rows = json_rows([(pk, event_id, t, 0, rank, int(steps[0]), int(steps[-1]), digest, base64.b64encode(
        b"".join(column.tobytes() for column in (steps, starts, ends, nan, nan, nan))).decode())
        for pk, event_id, t, rank, steps, starts, ends, digest in records])

    def write() -> None:
        conn.execute(_INSERT_RECORDS_SQL, (rows,)).fetchall()
    return write


WAYS = {"today": write_today, "records": write_records}
_SIZES_SQL = {"today": "pg_total_relation_size('events') + (SELECT coalesce(sum(pg_total_relation_size(inhrelid)), 0) "
                       "FROM pg_inherits WHERE inhparent = 'steps'::regclass)",
              "records": "pg_total_relation_size('step_records')"}


def prepare(url: str) -> list[int]:
    """The migrated schema with the `step_records` table beside it, and 8 runs: their primary keys."""
    engine = make_engine(url)
    upgrade(engine)
    with engine.begin() as conn:
        for i in range(8):
            conn.execute(text("INSERT INTO runs (run_id, project, status, version, ledger_version) "
                              "VALUES (:r, 'default', 'running', 0, -1)"), {"r": f"run-{i}"})
        run_pks = [int(pk) for pk, in conn.execute(text("SELECT id FROM runs ORDER BY id"))]
        for statement in _RECORD_TABLE:
            conn.execute(text(statement))
    engine.dispose()
    return run_pks


def write_groups(conn: psycopg.Connection, way: str, groups: list[list[_Record]]) -> float:
    """Seconds the statements and commits of `groups` took, each group one transaction, written `way`."""
    spent = 0.0
    for records in groups:
        write = WAYS[way](conn, records)
        started = time.perf_counter()
        with conn.transaction():
            write()
        spent += time.perf_counter() - started
    return spent


def measure(way: str, groups: int) -> tuple[float, float]:
    """(us a step row, bytes a step row) of `groups` groups written one way into a new database."""
    with postgres_database() as url:
        fleet = Fleet(prepare(url))
        steps = groups * RECORDS_PER_GROUP * STEPS_PER_RECORD
        with psycopg.connect(driver_url(url)) as conn:
            spent = sum(write_groups(conn, way, [fleet.group()]) for _ in range(groups))
            size = int(conn.execute(f"SELECT {_SIZES_SQL[way]}").fetchone()[0])  # type: ignore[index]
    return spent / steps * 1e6, size / steps


def driver_url(url: str) -> str:
    """A SQLAlchemy URL as psycopg takes it."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--groups", type=int, default=800, help="groups of 64 five-step records per measurement")
    p.add_argument("--rounds", type=int, default=2, help="alternations of the two ways")
    ns = p.parse_args()
    print(f"{machine()}; {ns.groups} groups of {RECORDS_PER_GROUP} records of {STEPS_PER_RECORD} steps a way, "
          f"{ns.rounds} round(s), alternating")
    results: dict[str, list[tuple[float, float]]] = {way: [] for way in WAYS}
    for _ in range(ns.rounds):
        for way in WAYS:
            us, size = measure(way, ns.groups)
            results[way].append((us, size))
            print(f"  {way:8s} {us:6.2f} us a step row, {size:5.1f} B a step row")
    today = statistics.median(us for us, _ in results["today"])
    records = statistics.median(us for us, _ in results["records"])
    print(f"median: today {today:.2f} us a step row, one row per record {records:.2f} us: x{records / today:.2f}")


if __name__ == "__main__":
    main()
