"""Live hang detection: is a running run still making progress, and if not, which ranks hold it up?

Pure: a small `LiveState` (what services.storage.live reads with a few index lookups: the one way a run's events
become one, so the tests judge what the collector reads) and the server's clock reading `now` in, a `LiveStatus`
out; `live_run` makes it the API's typed answer (services.schemas.live.LiveRun). Nothing here reads a clock.

Rules (docs/ledger.md, "Live hang detection"):

- progress = the latest of: a step end on any rank of the current attempt, a checkpoint start or end, a phase's
  start or end (an evaluation; entering or leaving init_process_group), the attempt's start or resume (before its
  first step), the previous attempt's end (between attempts);
- threshold = max(floor_s, step_factor x the recent median seconds between step ends of the leading rank)
  (floor_s alone before there are two steps); at least startup_floor_s before the attempt's first step and
  checkpoint_floor_s while a checkpoint write or a phase is in progress, so a slow load, save or evaluation is not
  called a hang;
- hung = the run is running, now - progress > threshold, and not every rank that reported in the current
  attempt ended it `completed` (a finished job waiting for its run_end is not hung);
- suspects (named only when hung): ranks that have not reached the point the furthest rank reached (the step
  in progress, then the number of collectives started or completed in it), ranks whose latest heartbeat or step
  end is older than silent_after_heartbeats x heartbeat_interval_s while other ranks do heart-beat (a SIGSTOPped
  or wedged process stops heart-beating; a rank that ends steps sends no heartbeat, ingest_client), ranks that
  ended their attempt while the others did not, and ranks of the world that never reported in this attempt.
  Listed strongest first: ranks silent or behind while other ranks on their host report (a process to look at);
  then the ranks of a host none of whose ranks reports (the node is down, or its node relay's events have not
  reached the collector yet: the two look alike here); then the ranks that never reported. A silent rank counts
  against its host only when a host-mate was last heard from more than 1.5 heartbeat intervals after it: events
  of one node arrive together, so when they are late, each rank's last heartbeat is its last one before the same
  moment, and their ages differ by up to one interval (its heart-beating neighbours are not evidence that it
  stopped).

Costs follow what the run reported, never what it claimed: `LiveState.ranks` holds only the ranks that sent
something in the attempt; the others of the claimed world size are counted (`never_reported`), never built one
by one. The answer lists at most `max_suspects` suspects (in that order, each group by rank) and `max_rank_rows`
rank rows (the listed suspects, then the ranks that reported, then the others), and says how many there were
(`suspects_total`, `ranks_total`).
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from services.schemas.live import LiveRun, RankLive, Suspect

RUNNING = "running"


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveConfig:
    floor_s: float = 30.0
    step_factor: float = 10.0
    startup_floor_s: float = 300.0
    checkpoint_floor_s: float = 300.0
    heartbeat_interval_s: float = 5.0
    silent_after_heartbeats: float = 3.0
    recent_steps: int = 32
    max_suspects: int = 64  # suspects listed in one answer (the rest are counted)
    max_rank_rows: int = 128  # rank rows listed in one answer (the rest are counted)

    def __post_init__(self) -> None:
        for name in ("floor_s", "step_factor", "heartbeat_interval_s", "silent_after_heartbeats"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("startup_floor_s", "checkpoint_floor_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.recent_steps < 2:
            raise ValueError(f"recent_steps must be at least 2, got {self.recent_steps}")
        for name in ("max_suspects", "max_rank_rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")

    @property
    def silent_after_s(self) -> float:
        return self.silent_after_heartbeats * self.heartbeat_interval_s

    @property
    def heartbeat_lookback_s(self) -> float:
        """How far back a reading of the run looks for heartbeats: 4 silence periods, at least a minute."""
        return max(60.0, 4 * self.silent_after_s)


@dataclass(frozen=True, slots=True, kw_only=True)
class RankState:
    """What is known of one rank in the current attempt (its answer row: services.schemas.live.RankLive)."""

    rank: int
    host: str | None = None  # the host its attempt_start named
    clock_offset_s: float = 0.0  # its clock minus the collector's; its times here are on the collector's clock
    reported: bool = True  # False: in the world, but no attempt_start from it yet
    last_step: int | None = None  # last completed step
    last_step_end: float | None = None
    collectives_done: int = 0  # collectives completed in the step after last_step
    last_collective_end: float | None = None
    heartbeat_time: float | None = None  # latest heartbeat seen (None: none within the lookback)
    heartbeat_step: int | None = None  # the step in progress when it was sent
    heartbeat_collectives: int | None = None  # collectives started in that step
    ended: str | None = None  # attempt_end reason, if the rank sent one
    start_time: float | None = None  # its attempt_start


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveState:
    """`ranks`: the ranks that sent anything in the attempt (attempt_start, attempt_end, a heartbeat), by rank;
    the other ranks of `world_size` never reported and are only counted."""

    run_id: str
    status: str
    attempt: int | None = None
    world_size: int = 0
    attempt_start: float | None = None
    resume_step: int | None = None
    ranks: tuple[RankState, ...] = ()
    leader_step_ends: tuple[float, ...] = ()  # recent step ends of the furthest rank, ascending
    leader_step_seconds: tuple[float, ...] = ()  # and those steps' durations
    checkpoint_start: float | None = None  # latest of the attempt
    checkpoint_end: float | None = None
    phase_start: float | None = None  # latest of the attempt, any phase
    phase_end: float | None = None
    previous_attempt_end: float | None = None
    attempt_end_time: float | None = None  # latest attempt_end of the current attempt
    first_time: float | None = None
    latest_time: float | None = None
    clock_offset_s: float = 0.0  # the run's reference clock minus the collector's (services.analysis.clocks)


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveStatus:
    run_id: str
    status: str
    attempt: int | None
    world_size: int
    server_time: float
    last_progress_time: float | None
    last_step: int | None
    pending_step: int | None
    seconds_since_progress: float | None
    median_step_seconds: float | None
    threshold_seconds: float
    threshold_basis: str  # steps | floor | startup | checkpoint | phase
    hung: bool
    suspects: tuple[Suspect, ...]  # at most LiveConfig.max_suspects of them
    ranks: tuple[RankLive, ...] = field(default=())  # at most LiveConfig.max_rank_rows rows, by rank (or none)
    suspects_total: int = 0  # every suspect, listed or not
    ranks_total: int = 0  # ranks of the world (claimed world size, or beyond it the highest rank that reported)
    never_reported: int = 0  # of them, ranks that sent nothing in this attempt
    clock_offset_s: float = 0.0  # the run's reference clock minus the collector's

    @property
    def hung_for_seconds(self) -> float | None:
        if not self.hung or self.seconds_since_progress is None:
            return None
        return self.seconds_since_progress - self.threshold_seconds

    @property
    def suspects_truncated(self) -> int | None:
        """The number of suspects when the list is cut, else None (the name /v1/live has used since it cut)."""
        return self.suspects_total if self.suspects_total > len(self.suspects) else None

    @property
    def ranks_truncated(self) -> bool:
        return self.ranks_total > len(self.ranks)


def live_run(status: LiveStatus, *, project: str, version: int, latest_time: float | None,
             at_risk_gpu_seconds: float, allocated_gpus: int, with_ranks: bool = True,
             max_suspects: int | None = None) -> LiveRun:
    """The API's live answer of a run: its verdict `status` and what the caller knows of the run beside (project,
    version, latest event time, at-risk GPU-seconds and allocated GPUs from its ledger). Without ranks (the fleet
    list; detect_hang(..., with_ranks=False) builds none) the rank rows are left out; `max_suspects` cuts the
    suspects further."""
    suspects = status.suspects if max_suspects is None else status.suspects[:max_suspects]
    since = status.seconds_since_progress
    return LiveRun(  # validated once here; the suspects and rank rows are models already (not validated again)
        run_id=status.run_id, project=project, status=status.status, attempt=status.attempt,
        world_size=status.world_size, allocated_gpus=allocated_gpus, version=version,
        server_time=status.server_time, latest_time=latest_time,
        # never negative: a clock ahead of the collector's dates its latest event after now
        seconds_since_last_event=max(status.server_time - latest_time, 0.0) if latest_time is not None else None,
        last_progress_time=status.last_progress_time, last_step=status.last_step, pending_step=status.pending_step,
        seconds_since_progress=since, median_step_seconds=status.median_step_seconds,
        threshold_seconds=status.threshold_seconds, threshold_basis=status.threshold_basis, hung=status.hung,
        hung_for_seconds=status.hung_for_seconds, suspects=list(suspects), suspect_ranks=[s.rank for s in suspects],
        suspects_truncated=status.suspects_total if status.suspects_total > len(suspects) else None,
        suspects_total=status.suspects_total, never_reported=status.never_reported, ranks_total=status.ranks_total,
        ranks_truncated=status.ranks_truncated if with_ranks else None,
        at_risk_gpu_seconds=at_risk_gpu_seconds, possibly_hung=status.hung,
        stall_threshold_seconds=status.threshold_seconds, ranks=list(status.ranks) if with_ranks else None,
        clock_offset_seconds=status.clock_offset_s,
    )


def median_step_seconds(state: LiveState) -> float | None:
    """Median seconds between consecutive step ends of the furthest rank (its step durations with one step)."""
    ends = np.asarray(state.leader_step_ends, dtype=np.float64)
    if len(ends) >= 2:
        gaps = np.diff(np.sort(ends))
        gaps = gaps[gaps >= 0]
        if len(gaps):
            return float(np.median(gaps))
    if state.leader_step_seconds:
        return float(statistics.median(state.leader_step_seconds))
    return None


def hang_threshold(state: LiveState, config: LiveConfig) -> tuple[float, str]:
    """(seconds without progress after which the run is hung, what set it)."""
    usual = median_step_seconds(state)
    threshold, basis = config.floor_s, "floor"
    if usual is not None and config.step_factor * usual > threshold:
        threshold, basis = config.step_factor * usual, "steps"
    if _between_attempts(state) or not _has_step(state):
        if config.startup_floor_s > threshold:
            threshold, basis = config.startup_floor_s, "startup"
    elif _checkpoint_in_progress(state) and config.checkpoint_floor_s > threshold:
        threshold, basis = config.checkpoint_floor_s, "checkpoint"
    elif _in_progress(state.phase_start, state.phase_end, state) and config.checkpoint_floor_s > threshold:
        threshold, basis = config.checkpoint_floor_s, "phase"
    return threshold, basis


def last_progress_time(state: LiveState) -> float | None:
    ends = [r.last_step_end for r in state.ranks if r.last_step_end is not None]
    candidates = [*ends, state.checkpoint_start, state.checkpoint_end, state.phase_start, state.phase_end,
                  state.previous_attempt_end]
    if not ends:  # before the first step: the attempt's start counts as progress
        candidates += [state.attempt_start, *(r.start_time for r in state.ranks)]
    if _between_attempts(state):
        candidates += [state.attempt_end_time]
    values = [c for c in candidates if c is not None]
    if not values and state.first_time is not None:
        return state.first_time  # only launcher events so far
    return max(values) if values else None


def detect_hang(state: LiveState, now: float, config: LiveConfig | None = None, *,
                with_ranks: bool = True) -> LiveStatus:
    """The run's live status at the server time `now`; `with_ranks=False` leaves the rank rows out (the fleet
    list, the metrics and the preemption ranking show none: no row is built)."""
    config = config or LiveConfig()
    threshold, basis = hang_threshold(state, config)
    progress = last_progress_time(state)
    # never negative: a time a client reports is on the collector's clock here, up to a request's transit
    since = max(now - progress, 0.0) if progress is not None else None
    hung = bool(state.status == RUNNING and since is not None and since > threshold and not _completed(state))
    steps = [r.last_step for r in state.ranks if r.last_step is not None]
    last_step = max(steps) if steps else None
    positions = {r.rank: _position(r, state) for r in state.ranks if r.reported}
    front = max(positions.values()) if positions else None
    # Heartbeats are a relative signal: when no rank sent one recently (old clients, the simulator, or the
    # collector lost them all), silence names nobody.
    beating = any(r.heartbeat_time is not None for r in state.ranks)
    known = {r.rank: _judge(r, positions.get(r.rank), front, now, config, beating) for r in state.ranks}
    world = max(state.world_size, max(known, default=-1) + 1)
    silent_ranks = world - len(known)  # in the world, sent nothing: counted, never built one by one
    never_reported = silent_ranks + sum(1 for r in state.ranks if not r.reported)
    suspects, suspects_total = _suspects(known, silent_ranks, config, now) if hung else ((), 0)
    rows = _listed_rows(known, [s.rank for s in suspects], world, config.max_rank_rows, now) if with_ranks else ()
    return LiveStatus(
        run_id=state.run_id, status=state.status, attempt=state.attempt, world_size=state.world_size,
        server_time=now, last_progress_time=progress, last_step=last_step,
        pending_step=front[0] if front is not None else None, seconds_since_progress=since,
        median_step_seconds=median_step_seconds(state), threshold_seconds=threshold, threshold_basis=basis,
        hung=hung, suspects=suspects, ranks=rows, suspects_total=suspects_total, ranks_total=world,
        never_reported=never_reported, clock_offset_s=state.clock_offset_s,
    )


# -- per rank -------------------------------------------------------------------------------------------


def _position(rank: RankState, state: LiveState) -> tuple[int, int]:
    """(step in progress, collectives started or completed in it): how far the rank got."""
    base = rank.last_step if rank.last_step is not None else (state.resume_step or 0)
    pending = base + 1
    done = rank.collectives_done
    if rank.heartbeat_step is not None and rank.heartbeat_step > pending:
        pending, done = rank.heartbeat_step, 0
    if rank.heartbeat_step == pending and rank.heartbeat_collectives is not None:
        done = max(done, rank.heartbeat_collectives)
    return pending, done


@dataclass(frozen=True, slots=True)
class _Judged:
    """A rank that reported, as detection judged it. Every such rank is judged (thousands in a wide run); its
    answer row (`_row`) is built only when it is listed."""

    state: RankState
    position: tuple[int, int] | None  # (step in progress, collectives in it)
    silent: bool
    behind: bool


def _judge(rank: RankState, position: tuple[int, int] | None, front: tuple[int, int] | None, now: float,
           config: LiveConfig, beating: bool) -> _Judged:
    seen = _seen(rank)
    silent = beating and rank.reported and (seen is None or now - seen > config.silent_after_s)
    if rank.heartbeat_time is None and rank.start_time is not None and now - rank.start_time <= config.silent_after_s:
        silent = False  # just started: its first heartbeat is not due yet
    behind = position is not None and front is not None and position < front
    return _Judged(state=rank, position=position, silent=bool(silent and rank.ended is None), behind=bool(behind))


def _heartbeat_age(rank: RankState, now: float) -> float | None:
    # never negative: a clock ahead of the collector's by less than the deadband of its measure dates it after now
    return max(now - rank.heartbeat_time, 0.0) if rank.heartbeat_time is not None else None


def _row(judged: _Judged, now: float) -> RankLive:
    rank, position = judged.state, judged.position
    return RankLive(
        rank=rank.rank, host=rank.host, reported=rank.reported, last_step=rank.last_step,
        last_step_end=rank.last_step_end,
        pending_step=position[0] if position else None,
        collectives_in_pending_step=position[1] if position else None,
        last_heartbeat_time=rank.heartbeat_time, heartbeat_age_seconds=_heartbeat_age(rank, now),
        silent=judged.silent, behind=judged.behind, ended=rank.ended, clock_offset_seconds=rank.clock_offset_s,
    )


def _unreported_row(rank: int) -> RankLive:
    """The row of a rank of the world that sent nothing in the attempt."""
    return RankLive(rank=rank, reported=False, last_step=None, last_step_end=None, pending_step=None,
                    collectives_in_pending_step=None, last_heartbeat_time=None, heartbeat_age_seconds=None,
                    silent=False, behind=False, ended=None)


def _silent_ranks(known: dict[int, _Judged]) -> Iterator[int]:
    """Ranks 0, 1, ... that sent nothing, lowest first (the caller stops early: never the whole world)."""
    rank = 0
    while True:
        if rank not in known:
            yield rank
        rank += 1


def _seen(rank: RankState) -> float | None:
    """When the rank was last heard from: its latest heartbeat or step end (a rank that steps sends no heartbeat:
    ingest_client), else its attempt's start."""
    heard = _last_word(rank)
    return heard if heard is not None else rank.start_time


def _last_word(rank: RankState) -> float | None:
    """Its latest heartbeat or step end, whichever is later (None: neither)."""
    heard = [t for t in (rank.heartbeat_time, rank.last_step_end) if t is not None]
    return max(heard) if heard else None


@dataclass(slots=True)
class _Host:
    reported: int = 0  # its ranks that reported
    silent: int = 0  # of them, the silent ones
    newest: float | None = None  # the latest moment any of them was heard from


def _hosts(judged: Iterable[_Judged]) -> dict[str, _Host]:
    out: dict[str, _Host] = {}
    for j in judged:
        if j.state.host is not None and j.state.reported:
            host = out.setdefault(j.state.host, _Host())
            host.reported += 1
            host.silent += int(j.silent)
            seen = _seen(j.state)
            if seen is not None and (host.newest is None or seen > host.newest):
                host.newest = seen
    return out


# How much newer than a silent rank's own heartbeat a host-mate's must be to count against it: one interval for
# the ranks' heartbeat phases (a node's late events cut them at one moment), half of one for timer jitter.
_AHEAD_INTERVALS = 1.5


def _unheard_for(rank: RankState, now: float) -> str:
    """How long a silent rank has sent nothing: since its latest heartbeat or step end."""
    heard = _last_word(rank)
    if heard is None:
        return "no heartbeat seen recently"
    what = "no heartbeat" if heard == rank.heartbeat_time else "no heartbeat or step end"
    return f"{what} for {max(now - heard, 0.0):.0f} s"


def _silence(j: _Judged, hosts: dict[str, _Host], now: float, config: LiveConfig) -> tuple[str, bool]:
    """(the reason naming a silent rank, whether the evidence is its host's as a whole rather than its own)."""
    reason = _unheard_for(j.state, now)
    name = j.state.host
    host = hosts.get(name) if name is not None else None
    if host is None or host.reported < 2:  # alone on its host, or the host is unknown: nothing to compare it with
        return reason, False
    others = host.reported - 1
    if host.silent == host.reported:
        return (f"{reason}, nor from the {others} other rank{'s' if others > 1 else ''} on host {name} (the node "
                "is down, or its events have not reached the collector yet)"), True
    seen = _seen(j.state)
    if seen is None or host.newest is None or host.newest - seen > _AHEAD_INTERVALS * config.heartbeat_interval_s:
        return f"{reason} while other ranks on host {name} do", False
    return (f"{reason}; the {others} other rank{'s' if others > 1 else ''} on host {name} were last heard from at "
            f"most {host.newest - seen:.1f} s later (the node's events are late, or have not reached the collector "
            "yet)"), True


def _suspects(known: dict[int, _Judged], silent_ranks: int, config: LiveConfig,
              now: float) -> tuple[tuple[Suspect, ...], int]:
    """(the first `config.max_suspects` suspects, strongest evidence first, each group by rank; how many in all)."""
    judged = list(known.values())
    ended_all = bool(judged) and silent_ranks == 0 and all(j.state.ended is not None for j in judged)
    front_step = max((j.position[0] for j in judged if j.position is not None), default=None)
    hosts = _hosts(judged)
    limit = config.max_suspects
    own: list[tuple[RankState, list[str]]] = []  # evidence against the rank itself
    host_wide: list[tuple[RankState, list[str]]] = []  # its host silent or late as a whole: the node, or the way to us
    for j in sorted(judged, key=lambda j: j.state.rank):
        rank = j.state
        reasons = []
        whole_host = False
        if not rank.reported:
            reasons.append("never reported in this attempt")
        if j.behind and j.position is not None:
            reasons.append(f"behind: in step {j.position[0]} after {j.position[1]} "
                           f"collective(s); the furthest rank is in step {front_step}")
        if j.silent:
            reason, whole_host = _silence(j, hosts, now, config)
            reasons.append(reason)
        if rank.ended is not None and not ended_all:
            reasons.append(f"ended its attempt ({rank.ended}) while the others did not")
        if reasons:
            (host_wide if whole_host else own).append((rank, reasons))
    total = len(own) + len(host_wide) + silent_ranks
    listed = [Suspect(rank=r.rank, host=r.host, reasons=tuple(why)) for r, why in (own + host_wide)[:limit]]
    silent = itertools.islice(_silent_ranks(known), min(silent_ranks, limit - len(listed)))
    listed += [Suspect(rank=rank, reasons=("never reported in this attempt",)) for rank in silent]
    # only the listed suspects become models (at most `limit`), validated once here
    return tuple(listed), total


def _listed_rows(known: dict[int, _Judged], suspects: list[int], world: int, limit: int,
                 now: float) -> tuple[RankLive, ...]:
    """At most `limit` rank rows, by rank: the listed suspects', then the ranks that reported, then the others.
    Only these rows become models (validated once here)."""
    chosen: dict[int, _Judged | None] = {}
    for rank in itertools.chain(suspects, sorted(known)):
        if len(chosen) >= limit:
            break
        chosen.setdefault(rank, known.get(rank))
    for rank in _silent_ranks(known):
        if len(chosen) >= limit or rank >= world:
            break
        chosen.setdefault(rank, None)
    return tuple(_row(j, now) if j is not None else _unreported_row(rank) for rank, j in sorted(chosen.items()))


def _has_step(state: LiveState) -> bool:
    return any(r.last_step_end is not None for r in state.ranks)


def _completed(state: LiveState) -> bool:
    """Every rank that reported in the current attempt ended it `completed`: the job finished its work (a
    missing run_end is the launcher's or the script's to send), it is not hung."""
    reported = [r for r in state.ranks if r.reported]
    return bool(reported) and all(r.ended == "completed" for r in reported)


def _between_attempts(state: LiveState) -> bool:
    return bool(state.ranks) and all(r.ended is not None for r in state.ranks if r.reported)


def _checkpoint_in_progress(state: LiveState) -> bool:
    return _in_progress(state.checkpoint_start, state.checkpoint_end, state)


def _in_progress(start: float | None, end: float | None, state: LiveState) -> bool:
    """A checkpoint write or a phase begun after the last step and not ended since."""
    if start is None:
        return False
    ends = [r.last_step_end for r in state.ranks if r.last_step_end is not None]
    after_steps = not ends or start >= max(ends)
    return after_steps and (end is None or end < start)
