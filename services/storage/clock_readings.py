"""What the collector's own clock says of its senders' clocks: per (run, attempt, rank), kept as requests arrive.

A request's events tell when they happened by the sender's clock; the collector knows when the request arrived by
its own. Two readings per request, per (run, attempt, rank) whose events it carries (attempt and rank -1 for
run-level events):

- `lead`: the largest `time - received` of its events. An event cannot arrive before it happens, so a clock is at
  least this far ahead of the collector's (a positive lead is proof; a negative one is a clock behind, or events
  that waited: a spool replayed later, a backlog).
- `offset`: `sent_at - received`, where `sent_at` is the sender's clock as it sent the request (the client's
  `Goodput-Sent-At` header): the sender's clock minus the collector's, less the request's time in flight
  (milliseconds), whichever way it is off. A request comes from one host (a rank, or its node's relay), so it
  measures the clock of every (attempt, rank) it carries, when it carries events from the sender's last `FRESH_S`
  by that clock: what a host sends live, not a replay of a spool that may have been written elsewhere.

Each is kept as its largest value in the current minute of receipt and in the minute before it, so a clock that
is set right (NTP stepping it) is followed within two minutes. `collector_offsets` turns them into each rank's
clock offset from the collector's: the offset when a sender said when it sent, else the lead when it is positive,
else 0; below `DEADBAND_S` (network and flush delays) 0. Live hang detection takes each rank's times back by it
(services.storage.live), so that "seconds since progress" is the collector's clock against what the collector
observed, never a client's clock against the server's.
"""

from __future__ import annotations

import json
import math
import statistics
import threading
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, text

from services.schemas.clocks import HostClock
from services.storage.db import json_rows
from services.storage.one_trip import OneTrip
from services.storage.records import IngestRecord, column_max

WINDOW_S = 60.0
FRESH_S = 120.0  # events this recent by the sender's clock, when it sent them, are what it sends live
DEADBAND_S = 1.0  # offsets smaller than this are delays, not clocks: taken as 0


@dataclass(frozen=True, slots=True)
class RequestClock:
    """When a request arrived (the collector's clock) and when its sender says it sent it (None: not said)."""

    received_at: float
    sent_at: float | None = None


@dataclass(frozen=True, slots=True)
class ClockReadings:
    """One request's readings per (run, attempt, rank)."""

    window: int
    received_at: float
    lead: dict[tuple[str, int, int], float]  # (run_id, attempt, rank) -> largest time - received
    offset: dict[tuple[str, int, int], float]  # (run_id, attempt, rank) -> sent_at - received (a live request)


def readings_of(records: Sequence[IngestRecord], clock: RequestClock) -> ClockReadings:
    received = clock.received_at
    latest: dict[tuple[str, int, int], float] = {}  # per (run, attempt, rank), its events' latest time
    for r in records:
        key = (r.run_id, -1 if r.attempt is None else int(r.attempt), -1 if r.rank is None else int(r.rank))
        when = r.time
        rows = r.step_rows if r.step_rows is not None else r.collective_rows
        if rows is not None and len(rows.end):
            when = max(when, column_max(rows.end))
        if when > latest.get(key, -math.inf):
            latest[key] = when
    lead = {key: when - received for key, when in latest.items()}
    offset: dict[tuple[str, int, int], float] = {}
    sent = clock.sent_at
    if sent is not None and any(sent - FRESH_S <= when <= sent + DEADBAND_S for when in latest.values()):
        offset = dict.fromkeys(latest, sent - received)
    return ClockReadings(window=int(received // WINDOW_S), received_at=received, lead=lead, offset=offset)


# (run_pk, attempt, rank, minute of receipt, largest lead, largest offset or None, latest arrival)
ReadingRow = tuple[int, int, int, int, float, float | None, float]
ReadingKey = tuple[int, int, int]  # (run_pk, attempt, rank)


class WrittenReadings:
    """What this process committed of each (run, attempt, rank)'s readings: its minute and the largest lead and
    offset written in it, and the launch attempt whose records they were (its owner). A stored row's values only
    rise within its minute, and a row moves only to later minutes or, with its launch attempt, to the number the
    run gives that launch attempt when it is numbered again (services.storage.attempt_numbers); so while the same
    launch attempt holds the number, a reading of that minute no larger than what was committed would raise
    nothing: it is not sent (about two readings in three at a step a second). Another process's writes only raise
    the stored row, so what this one remembers stays a lower bound of it. Forgotten whole past `max_keys` keys, or
    when the database may have been replaced (`clear`): then every reading is sent again, as before."""

    def __init__(self, max_keys: int = 200_000) -> None:
        self._max_keys = max_keys
        self._rows: dict[ReadingKey, tuple[Hashable, int, float, float | None]] = {}
        self._lock = threading.Lock()  # the writer's threads share it

    def raising(self, rows: list[ReadingRow], owners: Mapping[ReadingKey, Hashable | None]) -> list[ReadingRow]:
        """The rows that may raise their stored row (`owners`: the launch attempt of each key's records, None when
        the group's records name several)."""
        known = self._rows
        out = []
        for row in rows:
            key = (row[0], row[1], row[2])
            seen = known.get(key)
            if (seen is None or owners.get(key) != seen[0] or row[3] != seen[1]  # (a kept owner is never None)
                    or row[4] > seen[2] or (row[5] is not None and (seen[3] is None or row[5] > seen[3]))):
                out.append(row)
        return out

    def committed(self, rows: Sequence[ReadingRow], owners: Mapping[ReadingKey, Hashable | None]) -> None:
        with self._lock:
            if len(self._rows) + len(rows) > self._max_keys:
                self._rows.clear()
            known = self._rows
            for run_pk, attempt, rank, window, lead, offset, _ in rows:
                key = (run_pk, attempt, rank)
                owner = owners.get(key)
                seen = known.get(key)
                if owner is None:
                    known.pop(key, None)
                elif seen is None or seen[0] != owner or window > seen[1]:
                    known[key] = (owner, window, lead, offset)
                elif window == seen[1]:
                    known[key] = (owner, window, max(lead, seen[2]),
                                  seen[3] if offset is None else offset if seen[3] is None else max(offset, seen[3]))

    def clear(self) -> None:
        with self._lock:
            self._rows.clear()


def record_readings(conn: Connection, readings: Sequence[tuple[dict[str, int], ClockReadings]],
                    trip: OneTrip | None = None, written: WrittenReadings | None = None,
                    owners: Mapping[ReadingKey, Hashable | None] | None = None) -> list[ReadingRow]:
    """Keep the readings of a group's requests, each with {run id: runs.id} of its project's runs: one statement per
    minute of receipt the group spans (usually one), rows in key order (concurrent writers wait, never deadlock).
    PostgreSQL, with `trip`: the statements are queued in it, sent with the group's last ones. With `written` and
    `owners` (WrittenReadings), the rows that cannot raise what this process committed are left out. Returns the
    rows sent (for `written.committed`, once the transaction commits)."""
    # key -> minute of receipt -> (largest lead, largest offset or None, latest arrival)
    merged: dict[tuple[int, int, int], dict[int, tuple[float, float | None, float]]] = {}
    for pk_of, r in readings:
        for (run_id, attempt, rank), lead in r.lead.items():
            windows = merged.setdefault((pk_of[run_id], attempt, rank), {})
            offset = r.offset.get((run_id, attempt, rank))
            seen = windows.get(r.window)
            if seen is not None:
                lead = max(lead, seen[0])
                offset = seen[1] if offset is None else offset if seen[1] is None else max(offset, seen[1])
            windows[r.window] = (lead, offset, max(r.received_at, seen[2]) if seen is not None else r.received_at)
    rounds: list[list[ReadingRow]] = []
    for key in sorted(merged):
        for n, window in enumerate(sorted(merged[key])):
            if n == len(rounds):
                rounds.append([])
            rounds[n].append((*key, window, *merged[key][window]))
    if written is not None and owners is not None:
        rounds = [kept for rows in rounds if (kept := written.raising(rows, owners))]
    if conn.dialect.name == "postgresql":
        mine = OneTrip() if trip is None else trip
        for rows in rounds:
            mine.add(_UPSERT_POSTGRES, (json_rows(rows),))
        if trip is None:
            mine.send(conn)
    else:
        for rows in rounds:
            conn.execute(_UPSERT_SQLITE, [dict(zip(_COLUMNS, row, strict=True)) for row in rows])
    return [row for rows in rounds for row in rows]


_COLUMNS = ("run_pk", "attempt", "rank", "window", "lead", "offset", "received")
# The same minute: the larger value; a later minute: the new one (and the minute before it, when adjacent, becomes
# the previous); an earlier minute (a request that took its time), or nothing larger: the row as it was. SET
# expressions read the row as it was. NULL-aware larger of two: {pick}(coalesce(a, b), coalesce(b, a)).
_VALUES_SQLITE = "VALUES (:run_pk, :attempt, :rank, :window, :lead, NULL, :offset, NULL, :received)"
# the rows as one JSON parameter (services.storage.db.json_rows), in key order; json, not jsonb: a lead or offset of
# -0.0 stays -0.0
_VALUES_POSTGRES = (
    "SELECT (r->>0)::int4, (r->>1)::int4, (r->>2)::int4, (r->>3)::int8, (r->>4)::float8, NULL::float8, "
    "(r->>5)::float8, NULL::float8, (r->>6)::float8 FROM json_array_elements(%s::json) WITH ORDINALITY AS v(r, n) "
    "ORDER BY n")
_UPSERT_TEMPLATE = (
    "INSERT INTO clock_readings AS c (run_pk, attempt, rank, window_index, lead_s, lead_prev_s, offset_s, "
    "offset_prev_s, received_at) {values} "
    "ON CONFLICT (run_pk, attempt, rank) DO UPDATE SET "
    "lead_s = CASE WHEN excluded.window_index = c.window_index THEN {pick}(c.lead_s, excluded.lead_s) "
    "WHEN excluded.window_index > c.window_index THEN excluded.lead_s ELSE c.lead_s END, "
    "lead_prev_s = CASE WHEN excluded.window_index = c.window_index + 1 THEN c.lead_s "
    "WHEN excluded.window_index > c.window_index + 1 THEN NULL ELSE c.lead_prev_s END, "
    "offset_s = CASE WHEN excluded.window_index = c.window_index "
    "THEN {pick}(coalesce(c.offset_s, excluded.offset_s), coalesce(excluded.offset_s, c.offset_s)) "
    "WHEN excluded.window_index > c.window_index THEN excluded.offset_s ELSE c.offset_s END, "
    "offset_prev_s = CASE WHEN excluded.window_index = c.window_index + 1 THEN c.offset_s "
    "WHEN excluded.window_index > c.window_index + 1 THEN NULL ELSE c.offset_prev_s END, "
    "window_index = {pick}(c.window_index, excluded.window_index), "
    "received_at = {pick}(c.received_at, excluded.received_at) "
    # only a reading that raises the row is written: at a step a second, most requests raise nothing (a rank's lead
    # and offset seldom grow within a minute), and an update that changes nothing still writes a row version
    "WHERE excluded.window_index > c.window_index OR (excluded.window_index = c.window_index AND "
    "(excluded.lead_s > c.lead_s OR excluded.offset_s > c.offset_s "
    "OR (excluded.offset_s IS NOT NULL AND c.offset_s IS NULL)))"
)
_UPSERT_POSTGRES = _UPSERT_TEMPLATE.format(values=_VALUES_POSTGRES, pick="greatest")
_UPSERT_SQLITE = text(_UPSERT_TEMPLATE.format(values=_VALUES_SQLITE, pick="max"))


def collector_offset(lead: float | None, lead_prev: float | None, offset: float | None,
                     offset_prev: float | None) -> float:
    """A rank's clock minus the collector's, from its readings (module docstring)."""
    said = [v for v in (offset, offset_prev) if v is not None]
    if said:
        value = max(said)
    else:
        leads = [v for v in (lead, lead_prev) if v is not None]
        value = max(max(leads), 0.0) if leads else 0.0
    return value if abs(value) >= DEADBAND_S else 0.0


def collector_offsets(conn: Connection, run_pk: int, attempt: int) -> dict[int, float]:
    """Each rank's clock offset from the collector's in the attempt (ranks with none measured are left out)."""
    rows = conn.execute(_READ_SQL, {"pk": run_pk, "a": attempt}).all()
    return {int(rank): collector_offset(*values) for rank, *values in rows}


_READ_SQL = text("SELECT rank, lead_s, lead_prev_s, offset_s, offset_prev_s FROM clock_readings "
                 "WHERE run_pk = :pk AND attempt = :a AND rank >= 0")


_LATEST_SQL = text("SELECT max(attempt) FROM clock_readings WHERE run_pk = :pk AND rank >= 0")
_HOSTS_SQL = text("SELECT rank, data FROM events WHERE run_pk = :pk AND kind = 'attempt_start' AND attempt = :a")


def host_collector_offsets(conn: Connection, run_pk: int) -> list[HostClock]:
    """Each host's clock minus the collector's in the run's latest measured attempt (the median of its ranks'),
    by host; ranks whose attempt_start named no host are left out."""
    attempt = conn.execute(_LATEST_SQL, {"pk": run_pk}).scalar()
    if attempt is None:
        return []
    offsets = collector_offsets(conn, run_pk, int(attempt))
    by_host: dict[str, list[float]] = {}
    for rank, data in conn.execute(_HOSTS_SQL, {"pk": run_pk, "a": int(attempt)}):
        host = (json.loads(data) if data else {}).get("host")
        if host is not None and int(rank) in offsets:
            by_host.setdefault(str(host), []).append(offsets[int(rank)])
    return [HostClock(host=h, offset_seconds=float(statistics.median(v)), attempt=int(attempt), ranks=len(v))
            for h, v in sorted(by_host.items())]


_RANK_SQL = text("SELECT lead_s, lead_prev_s, offset_s, offset_prev_s FROM clock_readings WHERE run_pk = :pk "
                 "AND rank = :r ORDER BY attempt DESC LIMIT 1")


def rank_collector_offset(conn: Connection, run_pk: int, rank: int) -> float | None:
    """The rank's clock minus the collector's in its latest measured attempt (None: never measured)."""
    row = conn.execute(_RANK_SQL, {"pk": run_pk, "r": rank}).first()
    return None if row is None else collector_offset(*row)
