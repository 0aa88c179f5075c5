"""Read a running run's LiveState with a handful of index lookups, never a scan of its steps.

Per run: the current attempt and its ranks (``events (run_pk, kind, time)``, attempt_start rows), each rank's
last step (two probes of ``steps (run_pk, attempt, rank, step)`` per rank, in one statement), the furthest
rank's last few steps, the collectives of the last two steps (``collectives (run_pk, attempt, step)``), the
heartbeats of the last `lookback_s` seconds and the checkpoint, phase, resume and attempt_end times (all on the events
index). The cost grows with the number of ranks, not with the length of the run.

Every time a rank reported is read on the collector's clock: taken back by the rank's clock offset from the
collector's (services.storage.clock_readings), so that a host whose clock is off neither hides a hang nor makes
one up. `LiveState.clock_offset_s` is the offset of the run's own time base (its reference clock) from the
collector's, for the provisional hang.
A pruned run's step rows are gone: what was read of them is stored when they go
(services.analysis.live_tail) and read from there.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from sqlalchemy import Connection, bindparam, text

from services.analysis.clocks import reference_offset
from services.analysis.live import LiveState, RankState
from services.analysis.live_tail import LiveTail, tail_of, with_tail
from services.storage.clock_readings import collector_offsets
from services.storage.run_products import load_product
from services.storage.runs import RunRow
from services.storage.step_columns import column_rows

LIVE_TAIL = "live-tail"  # the run_products row of a pruned run's LiveTail

_ATTEMPT_SQL = text("SELECT max(attempt) FROM events WHERE run_pk = :pk AND kind = 'attempt_start'")
_STARTS_SQL = text(
    "SELECT e.rank, e.time, e.data, "
    "(SELECT s.step FROM steps s WHERE s.run_pk = e.run_pk AND s.attempt = e.attempt AND s.rank = e.rank "
    " ORDER BY s.step DESC LIMIT 1), "
    "(SELECT s.end_time FROM steps s WHERE s.run_pk = e.run_pk AND s.attempt = e.attempt AND s.rank = e.rank "
    " ORDER BY s.step DESC LIMIT 1) "
    "FROM events e WHERE e.run_pk = :pk AND e.kind = 'attempt_start' AND e.attempt = :a"
)
_RECENT_SQL = text(
    "SELECT step, start_time, end_time FROM steps WHERE run_pk = :pk AND attempt = :a AND rank = :r "
    "ORDER BY step DESC LIMIT :n"
)


def _recent_steps(conn: Connection, args: dict[str, Any], rank: int, n: int) -> list[tuple[int, float, float]]:
    rows = [(int(s), float(t0), float(t1)) for s, t0, t1 in conn.execute(_RECENT_SQL, {**args, "r": rank, "n": n})]
    return recent_steps_of(conn, args["pk"], args["a"], rank, n, rows)


def recent_steps_of(conn: Connection, run_pk: int, attempt: int, rank: int, n: int,
                    rows: list[tuple[int, float, float]]) -> list[tuple[int, float, float]]:
    """The rank's last `n` (step, start, end), in step order, from its last `n` rows in `steps` (`rows`), and from its
    last block rows when `steps` holds fewer (it keeps only the rank's current block: services.storage.step_columns)."""
    if len(rows) < n:
        moved = column_rows(conn, run_pk, attempt=attempt, ranks=[rank], last_blocks=2)
        rows = rows + list(zip(moved.rows.step.tolist(), moved.rows.start.tolist(), moved.rows.end.tolist(),
                               strict=True))
    return sorted(rows, key=lambda row: row[0])[-n:]


_COLLECTIVES_SQL = text(
    "SELECT rank, step, count(DISTINCT start_time), max(end_time) FROM collectives "
    "WHERE run_pk = :pk AND attempt = :a AND step >= :lo AND step <= :hi GROUP BY rank, step"
)
# per rank only when some rank's clock is off the collector's (its times are taken back one by one); -1: any rank
_KIND_TIMES_SQL = text(
    "SELECT kind, -1, max(time) FROM events WHERE run_pk = :pk AND attempt = :a AND kind IN :kinds GROUP BY kind"
).bindparams(bindparam("kinds", expanding=True))
_KIND_TIMES_BY_RANK_SQL = text(
    "SELECT kind, rank, max(time) FROM events WHERE run_pk = :pk AND attempt = :a AND kind IN :kinds "
    "GROUP BY kind, rank"
).bindparams(bindparam("kinds", expanding=True))
_ENDS_SQL = text("SELECT rank, time, data FROM events WHERE run_pk = :pk AND kind = 'attempt_end' AND attempt = :a")
_PREVIOUS_END_SQL = text(
    "SELECT -1, max(time) FROM events WHERE run_pk = :pk AND kind = 'attempt_end' AND attempt < :a")
_PREVIOUS_END_BY_RANK_SQL = text(
    "SELECT rank, max(time) FROM events WHERE run_pk = :pk AND kind = 'attempt_end' AND attempt < :a GROUP BY rank")
_RESUME_SQL = text(
    "SELECT max(step) FROM events WHERE run_pk = :pk AND kind = 'resume' AND attempt = :a")
# the latest heartbeat of each rank, chosen in the database: a 256-rank run sends ~3,000 in the lookback, and
# fetching and parsing them all was most of /v1/live's time
_HEARTBEATS_SQL = text(
    "SELECT rank, time, step, data FROM ("
    " SELECT rank, time, step, data, row_number() OVER (PARTITION BY rank ORDER BY time DESC) AS newest"
    " FROM events WHERE run_pk = :pk AND kind = 'heartbeat' AND time >= :since AND attempt = :a"
    " AND rank IS NOT NULL) latest WHERE newest = 1"
)


@dataclass(slots=True)
class _Started:
    """A rank that sent attempt_start in the attempt: its earliest start and its last step, if any."""

    start_time: float
    host: str | None = None
    last_step: int | None = None
    last_step_end: float | None = None


Fetched = Sequence[Sequence[Any]]  # a statement's rows, as fetched


@dataclass(slots=True)
class LiveReads:
    """What is read of one run's current attempt, as the database returned it (the statements above, or
    services.storage.live_batch's for many runs at once); `LiveReads.state` makes the LiveState of it."""

    attempt: int
    offsets: dict[int, float]
    starts: Fetched  # (rank, time, data, last step, its end)
    ends: Fetched = ()  # (rank, time, data)
    recent: list[tuple[int, float, float]] = field(default_factory=list)  # the leader's last steps, in step order
    collectives: Fetched = ()  # (rank, step, distinct starts, last end)
    beats: Fetched = ()  # (rank, time, step, data): each rank's newest since `since`
    kinds: Fetched = ()  # (kind, rank or -1, latest time)
    previous: Fetched = ()  # (rank or -1, latest attempt_end of an earlier attempt)
    resume: Any = None

    def local(self, rank: Any, t: Any) -> float:
        """A time the rank reported, on the collector's clock."""
        return float(t) - self.offsets.get(int(rank) if rank is not None else -1, 0.0)

    def ranks(self) -> tuple[dict[int, _Started], int]:
        """The ranks that sent attempt_start, and the largest world size they claimed."""
        ranks: dict[int, _Started] = {}
        world = 0
        for rank, t, data, last_step, last_end in self.starts:
            fields = json.loads(data) if data else {}
            world = max(world, int(fields.get("world_size") or 0))
            mine = ranks.setdefault(int(rank), _Started(start_time=self.local(rank, t)))
            mine.start_time = min(mine.start_time, self.local(rank, t))
            if fields.get("host") is not None:
                mine.host = str(fields["host"])
            if last_step is not None:
                mine.last_step, mine.last_step_end = int(last_step), self.local(rank, last_end)
        return ranks, world

    def front(self) -> tuple[int, int, int] | None:
        """(the furthest rank, the lowest and highest step whose collectives are read), None before any step."""
        stepped = {int(rank): int(step) for rank, _, _, step, _ in self.starts if step is not None}
        if not stepped:
            return None
        leader = max(stepped, key=lambda r: (stepped[r], -r))
        front = max(stepped.values())
        return leader, max(min(stepped.values()) + 1, front - 1), front + 1

    def since(self, now: float, lookback_s: float) -> float:
        """Where the heartbeats are read from: the lookback on the collector's clock (by a clock behind, heartbeats
        of the last minute are dated earlier)."""
        return now - lookback_s + (min(0.0, *self.offsets.values()) if self.offsets else 0.0)

    @property
    def skewed(self) -> bool:
        """Some rank's clock is off the collector's: the latest times are read per rank (each taken back)."""
        return any(self.offsets.values())

    def state(self, run: RunRow, *, now: float, lookback_s: float) -> LiveState:
        local = self.local
        ranks, world = self.ranks()
        ended: dict[int, str] = {}
        end_time = None
        for rank, t, data in self.ends:
            ended[int(rank)] = str((json.loads(data) if data else {}).get("reason") or "unknown")
            end_time = max(end_time or local(rank, t), local(rank, t))
        front = self.front()
        leader_ends = tuple(local(front[0], e) for _, _, e in self.recent) if front else ()
        leader_secs = tuple(float(e) - float(s) for _, s, e in self.recent) if front else ()
        done = {(int(rank), int(step)): (int(n), local(rank, last)) for rank, step, n, last in self.collectives}
        beats: dict[int, tuple[float, int | None, int | None]] = {}
        since = self.since(now, lookback_s)
        for rank, t, step, data in self.beats:
            if float(t) < since or local(rank, t) < now - lookback_s:
                continue
            n = (json.loads(data) if data else {}).get("collectives")
            beats[int(rank)] = (local(rank, t), None if step is None else int(step), None if n is None else int(n))
        kinds: dict[str, float] = {}
        for kind, rank, t in self.kinds:
            kinds[kind] = max(kinds.get(kind, -math.inf), local(rank, t))
        previous = max((local(rank, t) for rank, t in self.previous if t is not None), default=None)
        out = []
        span = max(world, max(ranks, default=-1) + 1)
        # only the ranks that sent something: the others of a claimed world are counted by detect_hang, never built
        for rank in sorted({r for r in (*ranks, *ended, *beats) if 0 <= r < span}):
            info = ranks.get(rank)
            last_step = info.last_step if info else None
            coll = done.get((rank, (last_step or 0) + 1), (0, None))
            beat = beats.get(rank)
            out.append(RankState(
                rank=rank, host=info.host if info else None, clock_offset_s=self.offsets.get(rank, 0.0),
                reported=info is not None, last_step=last_step,
                last_step_end=info.last_step_end if info else None,
                collectives_done=coll[0], last_collective_end=coll[1],
                heartbeat_time=beat[0] if beat else None, heartbeat_step=beat[1] if beat else None,
                heartbeat_collectives=beat[2] if beat else None, ended=ended.get(rank),
                start_time=info.start_time if info else None,
            ))
        return LiveState(
            run_id=run.run_id, status=run.status, attempt=self.attempt, world_size=world or len(ranks),
            attempt_start=min((v.start_time for v in ranks.values()), default=None),
            resume_step=int(self.resume) if self.resume is not None else None, ranks=tuple(out),
            leader_step_ends=leader_ends, leader_step_seconds=leader_secs,
            checkpoint_start=_float(kinds.get("checkpoint_start")),
            checkpoint_end=_float(kinds.get("checkpoint_end")),
            phase_start=_float(kinds.get("phase_start")), phase_end=_float(kinds.get("phase_end")),
            previous_attempt_end=_float(previous), attempt_end_time=_float(end_time),
            first_time=run.first_time, latest_time=run.last_time,
            clock_offset_s=reference_offset(self.offsets),
        )


CHECKPOINT_KINDS = ("checkpoint_start", "checkpoint_end", "phase_start", "phase_end")


def no_attempt(run: RunRow) -> LiveState:
    """The state of a run none of whose ranks has started an attempt."""
    return LiveState(run_id=run.run_id, status=run.status, first_time=run.first_time, latest_time=run.last_time)


def load_live_state(conn: Connection, run: RunRow, *, now: float, lookback_s: float = 60.0,
                    recent_steps: int = 32) -> LiveState:
    attempt = conn.execute(_ATTEMPT_SQL, {"pk": run.pk}).scalar()
    if attempt is None:
        return no_attempt(run)
    args = {"pk": run.pk, "a": int(attempt)}
    reads = LiveReads(int(attempt), collector_offsets(conn, run.pk, int(attempt)),
                      conn.execute(_STARTS_SQL, args).all())
    reads.ends = conn.execute(_ENDS_SQL, args).all()
    front = reads.front()
    if front is not None:
        leader, lo, hi = front
        reads.recent = _recent_steps(conn, args, leader, recent_steps + 1)
        reads.collectives = conn.execute(_COLLECTIVES_SQL, {**args, "lo": lo, "hi": hi}).all()
    reads.beats = conn.execute(_HEARTBEATS_SQL, {**args, "since": reads.since(now, lookback_s)}).all()
    skewed = reads.skewed
    reads.kinds = conn.execute(_KIND_TIMES_BY_RANK_SQL if skewed else _KIND_TIMES_SQL,
                               {**args, "kinds": list(CHECKPOINT_KINDS)}).all()
    reads.previous = conn.execute(_PREVIOUS_END_BY_RANK_SQL if skewed else _PREVIOUS_END_SQL, args).all()
    reads.resume = conn.execute(_RESUME_SQL, args).scalar()
    state = reads.state(run, now=now, lookback_s=lookback_s)
    return state if run.detail_pruned_at is None else with_stored_tail(state, load_product(conn, run.pk, LIVE_TAIL))


def live_tail(conn: Connection, run: RunRow, *, now: float) -> LiveTail:
    """What retention stores of the run before deleting its rows (services.analysis.live_tail)."""
    return tail_of(load_live_state(conn, run, now=now))


def with_stored_tail(state: LiveState, stored: tuple[int, str] | None) -> LiveState:
    """A pruned run's state with the live tail stored when its rows went (`stored`: its run_products row), where
    they are gone."""
    if stored is None:  # pruned before the tail was stored
        return state
    try:
        tail = LiveTail.model_validate_json(stored[1])
    except ValidationError:  # stored by another version of goodput: the rows left are what there is
        return state
    return with_tail(state, tail)


def _float(value: Any) -> float | None:
    return None if value is None else float(value)
