"""The LiveStates of many runs with one statement per kind of lookup for them all: what services.storage.live reads
of one run (its current attempt, its ranks' attempt_start rows with each rank's last step, the furthest rank's last
steps, the collectives of the last steps, the heartbeats of the lookback, the checkpoint, phase, resume and
attempt_end times, the clock offsets, a pruned run's stored live tail), read for every run of a list at once and
made into each run's LiveState by the same code (services.storage.live.LiveReads), so the verdicts are the same.

A fleet list judges every running run: ~10 index lookups each, one run after another, were most of
/v1/fleet/window's time on PostgreSQL (benchmarks.fleet_listing). The runs' keys travel as a VALUES list of bound
parameters joined to the indexed tables, so each statement still probes the same indexes, once per run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, text

from services.analysis.live import LiveState
from services.storage.clock_readings import collector_offset
from services.storage.live import (
    CHECKPOINT_KINDS,
    LIVE_TAIL,
    LiveReads,
    no_attempt,
    recent_steps_of,
    with_stored_tail,
)
from services.storage.runs import RunRow

CHUNK_RUNS = 200  # runs per statement: keeps the bound parameters well under SQLite's and psycopg's limits

_ATTEMPTS = ("SELECT w.pk, max(e.attempt) FROM w JOIN events e ON e.run_pk = w.pk AND e.kind = 'attempt_start' "
             "GROUP BY w.pk")
_OFFSETS = ("SELECT w.pk, c.rank, c.lead_s, c.lead_prev_s, c.offset_s, c.offset_prev_s FROM w JOIN clock_readings c "
            "ON c.run_pk = w.pk AND c.attempt = w.a AND c.rank >= 0")
_STARTS = (
    "SELECT w.pk, e.rank, e.time, e.data, "
    "(SELECT s.step FROM steps s WHERE s.run_pk = e.run_pk AND s.attempt = e.attempt AND s.rank = e.rank "
    " ORDER BY s.step DESC LIMIT 1), "
    "(SELECT s.end_time FROM steps s WHERE s.run_pk = e.run_pk AND s.attempt = e.attempt AND s.rank = e.rank "
    " ORDER BY s.step DESC LIMIT 1) "
    "FROM w JOIN events e ON e.run_pk = w.pk AND e.kind = 'attempt_start' AND e.attempt = w.a")
_ENDS = "SELECT w.pk, e.rank, e.time, e.data FROM w JOIN events e ON e.run_pk = w.pk AND e.kind = 'attempt_end' " \
        "AND e.attempt = w.a"
_RECENT = (  # w: (pk, a, r, n) = the run's furthest rank and how many of its last steps
    "SELECT pk, step, start_time, end_time FROM (SELECT w.pk, w.n, s.step, s.start_time, s.end_time, "
    "row_number() OVER (PARTITION BY w.pk ORDER BY s.step DESC) AS k FROM w JOIN steps s "
    "ON s.run_pk = w.pk AND s.attempt = w.a AND s.rank = w.r) last WHERE k <= n")
_COLLECTIVES = (  # w: (pk, a, lo, hi)
    "SELECT w.pk, c.rank, c.step, count(DISTINCT c.start_time), max(c.end_time) FROM w JOIN collectives c "
    "ON c.run_pk = w.pk AND c.attempt = w.a AND c.step >= w.lo AND c.step <= w.hi GROUP BY w.pk, c.rank, c.step")
_HEARTBEATS = (  # w: (pk, a, since)
    "SELECT pk, rank, time, step, data FROM (SELECT w.pk, e.rank, e.time, e.step, e.data, "
    "row_number() OVER (PARTITION BY w.pk, e.rank ORDER BY e.time DESC) AS newest FROM w JOIN events e "
    "ON e.run_pk = w.pk AND e.kind = 'heartbeat' AND e.time >= w.since AND e.attempt = w.a "
    "AND e.rank IS NOT NULL) latest WHERE newest = 1")
# per rank always: a run whose clocks are all the collector's has offsets 0, so its latest of the ranks' is the same
_KIND_TIMES = ("SELECT w.pk, e.kind, e.rank, max(e.time) FROM w JOIN events e ON e.run_pk = w.pk AND e.attempt = w.a "
               "AND e.kind IN ({kinds}) GROUP BY w.pk, e.kind, e.rank"
               ).format(kinds=", ".join(f"'{k}'" for k in CHECKPOINT_KINDS))
_PREVIOUS_ENDS = ("SELECT w.pk, e.rank, max(e.time) FROM w JOIN events e ON e.run_pk = w.pk AND "
                  "e.kind = 'attempt_end' AND e.attempt < w.a GROUP BY w.pk, e.rank")
_RESUMES = ("SELECT w.pk, max(e.step) FROM w JOIN events e ON e.run_pk = w.pk AND e.kind = 'resume' "
            "AND e.attempt = w.a GROUP BY w.pk")
_TAILS = ("SELECT w.pk, p.version, p.product_json FROM w JOIN run_products p ON p.run_pk = w.pk "
          "AND p.product = :product")

_ByRun = dict[int, list[tuple[Any, ...]]]  # a statement's rows by run key, the key left out
_TYPES = {"pk": "BIGINT", "a": "BIGINT", "r": "BIGINT", "n": "BIGINT", "lo": "BIGINT", "hi": "BIGINT",
          "since": "DOUBLE PRECISION"}


def _rows(conn: Connection, sql: str, keys: Sequence[dict[str, Any]], **params: Any) -> _ByRun:
    """`sql`'s rows by run key (the first column), `keys` (one dict of the same columns per run) bound as the
    table `w` it reads."""
    out: _ByRun = {}
    for at in range(0, len(keys), CHUNK_RUNS):
        chunk = keys[at:at + CHUNK_RUNS]
        columns = list(chunk[0])
        bound = {f"{c}{i}": row[c] for i, row in enumerate(chunk) for c in columns}
        values = ", ".join("(" + ", ".join(f"CAST(:{c}{i} AS {_TYPES[c]})" for c in columns) + ")"
                           for i in range(len(chunk)))
        statement = text(f"WITH w({', '.join(columns)}) AS (VALUES {values}) {sql}")
        for pk, *rest in conn.execute(statement, {**bound, **params}):
            out.setdefault(int(pk), []).append(tuple(rest))
    return out


def load_live_states(conn: Connection, runs: Sequence[RunRow], *, now: float, lookback_s: float = 60.0,
                     recent_steps: int = 32) -> dict[int, LiveState]:
    """Each run's LiveState by key, the same as services.storage.live.load_live_state's, read for all at once."""
    if not runs:
        return {}
    attempts = {pk: int(rows[0][0]) for pk, rows in _rows(conn, _ATTEMPTS, [{"pk": r.pk} for r in runs]).items()
                if rows[0][0] is not None}
    keys = [{"pk": pk, "a": a} for pk, a in attempts.items()]
    offsets = {pk: {int(rank): collector_offset(*values) for rank, *values in rows}
               for pk, rows in _rows(conn, _OFFSETS, keys).items()} if keys else {}
    starts = _rows(conn, _STARTS, keys) if keys else {}
    reads = {pk: LiveReads(a, offsets.get(pk, {}), starts.get(pk, [])) for pk, a in attempts.items()}
    fronts = {pk: front for pk, r in reads.items() if (front := r.front()) is not None}
    _read_steps(conn, reads, fronts, recent_steps + 1)
    ends = _rows(conn, _ENDS, keys) if keys else {}
    beats = _rows(conn, _HEARTBEATS, [{**k, "since": reads[k["pk"]].since(now, lookback_s)} for k in keys]) \
        if keys else {}
    kinds = _rows(conn, _KIND_TIMES, keys) if keys else {}
    previous = _rows(conn, _PREVIOUS_ENDS, keys) if keys else {}
    resumes = _rows(conn, _RESUMES, keys) if keys else {}
    pruned = [{"pk": r.pk} for r in runs if r.detail_pruned_at is not None and r.pk in attempts]
    tails = _rows(conn, _TAILS, pruned, product=LIVE_TAIL) if pruned else {}
    out = {}
    for run in runs:
        one = reads.get(run.pk)
        if one is None:
            out[run.pk] = no_attempt(run)
            continue
        one.ends, one.beats = ends.get(run.pk, []), beats.get(run.pk, [])
        one.kinds, one.previous = kinds.get(run.pk, []), previous.get(run.pk, [])
        one.resume = resumes.get(run.pk, [(None,)])[0][0]
        state = one.state(run, now=now, lookback_s=lookback_s)
        if run.detail_pruned_at is not None:
            stored = tails.get(run.pk)
            state = with_stored_tail(state, (int(stored[0][0]), str(stored[0][1])) if stored else None)
        out[run.pk] = state
    return out


def _read_steps(conn: Connection, reads: dict[int, LiveReads], fronts: dict[int, tuple[int, int, int]],
                n: int) -> None:
    """The furthest rank's last `n` steps and the collectives of the last steps of every run that has stepped."""
    if not fronts:
        return
    recent = _rows(conn, _RECENT, [{"pk": pk, "a": reads[pk].attempt, "r": f[0], "n": n} for pk, f in fronts.items()])
    collectives = _rows(conn, _COLLECTIVES, [{"pk": pk, "a": reads[pk].attempt, "lo": f[1], "hi": f[2]}
                                             for pk, f in fronts.items()])
    for pk, (leader, _, _) in fronts.items():
        one = reads[pk]
        rows = [(int(s), float(t0), float(t1)) for s, t0, t1 in recent.get(pk, [])]
        # fewer than `n` in `steps` (it keeps the rank's current block only): the rest from its block rows, per run
        one.recent = recent_steps_of(conn, pk, one.attempt, leader, n, rows)
        one.collectives = collectives.get(pk, [])
