"""Consecutive compact records of one process go to the collector as one record.

The spooler builds records every flush interval (0.2 s), so that a SIGKILL loses little; at a step a second each
step is then its own `steps` record, and the collector's cost is per record (validation, its `events` row: the
idempotency key, its block mark), not per row. When a batch is sent, every run of `steps` records (or of
`collectives` records) of the same run, attempt, rank and launch that follow one another in the spool goes as one
record of their rows, in spool order, up to ``MAX_ROWS_PER_RECORD`` rows. The process's heartbeats and client stats
between them (the spooler's tick writes them among the steps) do not end a run: they go right after the merged
record. The collector reads them by their time, not by their place in a batch; every other record keeps its place
between the runs.

The merged record's id is its first record's id and how many records it holds (``<first id>+<n>``): the same
spool frames always give the same record, so a batch sent again as first sent is absorbed as a duplicate. A batch
read again with a different extent (a process that died while its request was in flight, its spool replayed by
the next) can merge differently: its rows then arrive under another id and are stored again, which counts
nothing twice (the analysis keeps one row per (attempt, rank, step); docs/events.md). The flusher sends a batch
that failed in flight again with the extent it was first sent with, so a live process never regroups.

A record that is not exactly what the client's builder writes (another field, columns of unequal length, a run
longer than the row limit) is sent as it is. Spools and quarantined batches keep the records as built: what is
refused, quarantined and sent again is always the spooled records.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ingest_client.common.events import MAX_ROWS_PER_RECORD

_MAX_EVENT_ID_CHARS = 128  # the collector's limit (docs/events.md)
_KEYS = ("run_id", "attempt", "rank", "launch")
# per kind: the columns every record has, and those it may leave out (a missing one is None in the merged rows)
_COLUMNS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "steps": (("step", "start", "end"), ("loss", "lr", "comm")),
    "collectives": (("step", "op", "start", "end"), ()),
}
_MARKS = tuple((kind, f'"kind":"{kind}"'.encode()) for kind in _COLUMNS)  # as spool.encode_record writes it
_PASSABLE_KINDS = ("heartbeat", "client_stats")
_PASSABLE = tuple(f'"kind":"{kind}"'.encode() for kind in _PASSABLE_KINDS)
_HEAD = frozenset({"event_id", "run_id", "kind", "time", "attempt", "rank", "launch"})


def coalesce(payloads: Sequence[bytes]) -> list[bytes]:
    """The records to send for ``payloads`` (JSON records in spool order): consecutive compact records of one kind
    and one process merged, everything else as it is."""
    out: list[bytes] = []
    run: list[tuple[bytes, dict[str, Any]]] = []
    passed: list[bytes] = []  # heartbeats and client stats of the run's process, after it
    rows = 0
    for payload in payloads:
        record = _compact(payload)
        if record is not None and run and _same_stream(run[0][1], record) and (
                rows + len(record["step"]) <= MAX_ROWS_PER_RECORD):
            run.append((payload, record))
            rows += len(record["step"])
            continue
        if record is None and run and _passable(payload, run[0][1]):
            passed.append(payload)
            continue
        _emit(run, out)
        out.extend(passed)
        run, passed, rows = [], [], 0
        if record is None:
            out.append(payload)
        else:
            run, rows = [(payload, record)], len(record["step"])
    _emit(run, out)
    out.extend(passed)
    return out


def _compact(payload: bytes) -> dict[str, Any] | None:
    """The record when it is a compact record the builder wrote (so that merging it is exact), else None."""
    kind = next((k for k, mark in _MARKS if mark in payload), None)
    if kind is None:
        return None
    try:
        record = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(record, dict) or record.get("kind") != kind or not isinstance(record.get("event_id"), str):
        return None
    required, optional = _COLUMNS[kind]
    if not set(record) <= _HEAD | set(required) | set(optional) or not isinstance(record.get("time"), float | int):
        return None
    if not all(isinstance(record.get(c), list) for c in required):
        return None
    n = len(record["step"])
    columns = [record.get(c) for c in required + optional]
    if n == 0 or any(c is not None and (not isinstance(c, list) or len(c) != n) for c in columns):
        return None
    return record


def _passable(payload: bytes, first: dict[str, Any]) -> bool:
    """A heartbeat or client stats record of the same process as ``first``."""
    if not any(mark in payload for mark in _PASSABLE):
        return False
    try:
        record = json.loads(payload)
    except ValueError:
        return False
    return isinstance(record, dict) and record.get("kind") in _PASSABLE_KINDS and all(
        first.get(k) == record.get(k) for k in _KEYS)


def _same_stream(first: dict[str, Any], record: dict[str, Any]) -> bool:
    return first["kind"] == record["kind"] and all(first.get(k) == record.get(k) for k in _KEYS)


def _emit(run: list[tuple[bytes, dict[str, Any]]], out: list[bytes]) -> None:
    if len(run) == 1:
        out.append(run[0][0])  # alone: the spooled bytes, its own id
    elif run:
        merged = _merged([record for _, record in run])
        if len(merged["event_id"]) <= _MAX_EVENT_ID_CHARS:
            out.append(json.dumps(merged, separators=(",", ":"), allow_nan=False).encode())
        else:
            out.extend(payload for payload, _ in run)


def _merged(records: list[dict[str, Any]]) -> dict[str, Any]:
    first = records[0]
    merged: dict[str, Any] = {k: first[k] for k in ("kind", *_KEYS) if k in first}
    merged["event_id"] = f"{first['event_id']}+{len(records)}"
    merged["time"] = max(r["time"] for r in records)
    required, optional = _COLUMNS[first["kind"]]
    for column in required:
        merged[column] = [v for r in records for v in r[column]]
    for column in optional:
        if any(column in r for r in records):
            merged[column] = [v for r in records for v in (r.get(column) or [None] * len(r["step"]))]
    return merged
