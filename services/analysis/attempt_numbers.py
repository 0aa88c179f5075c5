"""A run's attempt numbers from what its launches reported (docs/events.md, "Attempt numbers").

Every process says which launch it belongs to (`launch`: an id unique to one torchrun agent, `goodput launch` or
process, the same for all of its rounds) and numbers its own rounds (`attempt`). What a run's attempts are is then
decided here, from every launch's attempts, never from a spool on one host:

- a *launch attempt* is (launch, attempt number within it); its start is the earliest time its processes reported
  (an `attempt_start`, else any record);
- the launch attempts of one round of a multi-node job (one launch per node) are one attempt: launch attempts of
  distinct launches, of the same world size, with disjoint ranks, that started within `SAME_ROUND_S` of each other
  join one attempt while its ranks do not fill its world; where several could, the one whose launches numbered the
  round alike, then the nearest in time;
- attempts are numbered in the order they started (within a launch, in its own order): each takes its launches'
  number, or one more than the previous attempt's when that is not larger (a launch relaunched elsewhere numbers
  from 0 again); so where the launches' numbers already increase with time (one host, one spool) they are kept;
- records without a launch (clients before it, hand-written events) keep their numbers: they are one launch, `""`,
  whose numbers are the run's, and the others are numbered around them.

Pure: the result depends only on the set of launch attempts, not on the order their records arrived in.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

# Workers of one round start within a second or two of each other on every node (torchrun starts them as the
# round's rendezvous completes); a relaunch comes after a failure was detected and the job rescheduled.
SAME_ROUND_S = 60.0
LEGACY = ""  # the launch of records that name none

LaunchAttemptKey = tuple[str, int]  # (launch, attempt number within the launch)


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchAttempt:
    """What the records of one (launch, attempt) said about it so far."""

    launch: str
    attempt: int
    start: float
    world_size: int | None = None
    rank_lo: int | None = None
    rank_hi: int | None = None

    @property
    def key(self) -> LaunchAttemptKey:
        return self.launch, self.attempt

    def covers(self, other: LaunchAttempt) -> bool:
        """Whether `other` (of the same key) adds nothing to this: no earlier start, no new rank or world size."""
        if other.start < self.start:
            return False
        if self.launch == LEGACY:  # numbered as sent: only its start matters
            return True
        if other.world_size is not None and self.world_size is None:
            return False
        return other.rank_lo is None or (self.rank_lo is not None and self.rank_hi is not None
                                         and self.rank_lo <= other.rank_lo and other.rank_hi is not None
                                         and other.rank_hi <= self.rank_hi)

    def merged(self, other: LaunchAttempt) -> LaunchAttempt:
        return LaunchAttempt(
            launch=self.launch, attempt=self.attempt, start=min(self.start, other.start),
            world_size=self.world_size if self.world_size is not None else other.world_size,
            rank_lo=_least(self.rank_lo, other.rank_lo), rank_hi=_most(self.rank_hi, other.rank_hi))


def number_attempts(attempts: Iterable[LaunchAttempt], *,
                    same_round_s: float = SAME_ROUND_S) -> dict[LaunchAttemptKey, int]:
    """The run's attempt number of every launch attempt (module docstring)."""
    items = list(attempts)
    starts = _starts_in_launch_order(items)
    legacy = [a for a in items if a.launch == LEGACY]
    rounds = _rounds(sorted((a for a in items if a.launch != LEGACY),
                            key=lambda a: (starts[a.key], a.launch, a.attempt)), starts, same_round_s)
    fixed = {a.attempt for a in legacy}
    units: list[tuple[float, int, str, int, list[LaunchAttempt]]] = [
        (starts[a.key], 0, a.launch, a.attempt, [a]) for a in legacy]
    units += [(r.first, 1, r.members[0].launch, r.members[0].attempt, r.members) for r in rounds]
    numbers: dict[LaunchAttemptKey, int] = {}
    top = -1
    for _, tagged, _, _, members in sorted(units, key=lambda u: u[:4]):
        if not tagged:
            number = members[0].attempt
        else:
            number = max(max(m.attempt for m in members), top + 1)
            while number in fixed:
                number += 1
        top = max(top, number)
        for member in members:
            numbers[member.key] = number
    return numbers


def _starts_in_launch_order(items: list[LaunchAttempt]) -> dict[LaunchAttemptKey, float]:
    """Each launch attempt's start, made non-decreasing in its launch's own order (a launch's rounds follow each
    other, whatever its clock said)."""
    by_launch: dict[str, list[LaunchAttempt]] = defaultdict(list)
    for a in items:
        by_launch[a.launch].append(a)
    out: dict[LaunchAttemptKey, float] = {}
    for members in by_launch.values():
        latest = float("-inf")
        for a in sorted(members, key=lambda a: a.attempt):
            latest = max(latest, a.start)
            out[a.key] = latest
    return out


@dataclass(slots=True)
class _Round:
    """One attempt being assembled from the launch attempts of its nodes."""

    first: float
    members: list[LaunchAttempt]
    launches: set[str] = field(default_factory=set)
    numbers: set[int] = field(default_factory=set)
    world_size: int | None = None
    covered: int = 0  # ranks of its members' intervals
    los: list[int] = field(default_factory=list)  # its members' rank intervals, sorted, disjoint
    his: list[int] = field(default_factory=list)

    def add(self, a: LaunchAttempt) -> None:
        self.members.append(a)
        self.launches.add(a.launch)
        self.numbers.add(a.attempt)
        if self.world_size is None:
            self.world_size = a.world_size
        if a.rank_lo is not None and a.rank_hi is not None:
            at = bisect.bisect_left(self.los, a.rank_lo)
            self.los.insert(at, a.rank_lo)
            self.his.insert(at, a.rank_hi)
            self.covered += a.rank_hi - a.rank_lo + 1

    def takes(self, a: LaunchAttempt) -> bool:
        if a.launch in self.launches:
            return False
        if a.world_size is not None and self.world_size is not None and a.world_size != self.world_size:
            return False
        if a.rank_lo is None or a.rank_hi is None:
            return self.world_size is None or self.covered < self.world_size
        world = self.world_size if self.world_size is not None else a.world_size
        if world is not None and self.covered + (a.rank_hi - a.rank_lo + 1) > world:
            return False
        at = bisect.bisect_left(self.los, a.rank_lo)
        if at > 0 and self.his[at - 1] >= a.rank_lo:
            return False
        return not (at < len(self.los) and self.los[at] <= a.rank_hi)


def _rounds(ordered: list[LaunchAttempt], starts: dict[LaunchAttemptKey, float],
            same_round_s: float) -> list[_Round]:
    rounds: list[_Round] = []
    for a in ordered:
        start = starts[a.key]
        best: _Round | None = None
        best_rank: tuple[int, float] | None = None
        for candidate in reversed(rounds):  # made in order of their first start
            if start - candidate.first > same_round_s:
                break
            if candidate.takes(a):
                rank = (0 if a.attempt in candidate.numbers else 1, start - candidate.first)
                if best_rank is None or rank < best_rank:
                    best, best_rank = candidate, rank
        if best is None:
            best = _Round(first=start, members=[])
            rounds.append(best)
        best.add(a)
    return rounds


def _least(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def _most(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)
