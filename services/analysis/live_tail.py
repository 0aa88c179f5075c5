"""What live detection reads of a run's last steps, kept when retention deletes the rows it reads them from.

`services.storage.live` reads, with a few index lookups on the raw rows, each rank's last step of the current
attempt, the furthest rank's last steps and the collectives of the step each rank is in. Retention deletes those
rows; a pruned run would then show no last step, no step time, and every rank back at its resume step (issue 31).
So retention stores them first as the run's `LiveTail` (services.derive.retention), and live detection reads
them from it where the rows are gone (`with_tail`): a pruned run's live answer is the one it had before the
prune. Rows received since (the run goes on) count over the tail where they are further along.

Pure: a LiveState in, a LiveState out.
"""

from __future__ import annotations

from dataclasses import replace

from pydantic import BaseModel

from services.analysis.live import LiveState, RankState


class RankTail(BaseModel):
    rank: int
    last_step: int | None
    last_step_end: float | None
    collectives_done: int  # collectives completed in the step after last_step
    last_collective_end: float | None


class LiveTail(BaseModel):
    """The step-row part of one attempt's LiveState (the rest is read from events, which retention keeps)."""

    attempt: int | None
    ranks: list[RankTail]
    leader_step_ends: list[float]
    leader_step_seconds: list[float]


def tail_of(state: LiveState) -> LiveTail:
    ranks = [RankTail(rank=r.rank, last_step=r.last_step, last_step_end=r.last_step_end,
                      collectives_done=r.collectives_done, last_collective_end=r.last_collective_end)
             for r in state.ranks if r.last_step is not None or r.collectives_done]
    return LiveTail(attempt=state.attempt, ranks=ranks, leader_step_ends=list(state.leader_step_ends),
                    leader_step_seconds=list(state.leader_step_seconds))


def with_tail(state: LiveState, tail: LiveTail) -> LiveState:
    """`state` (read from the rows left) with the tail of the same attempt where the rows are gone: a rank's last
    step from whichever is further (with its collectives), the furthest rank's recent steps from the tail before
    the first one the rows still have."""
    if tail.attempt is None or tail.attempt != state.attempt:
        return state  # a later attempt started since the prune: its rows are all there
    kept = {t.rank: t for t in tail.ranks}
    ranks = tuple(_rank(r, kept.get(r.rank)) for r in state.ranks)
    ends, seconds = list(state.leader_step_ends), list(state.leader_step_seconds)
    first = ends[0] if ends else float("inf")
    older = [(e, s) for e, s in zip(tail.leader_step_ends, tail.leader_step_seconds, strict=True) if e < first]
    window = max(len(tail.leader_step_ends), len(ends))
    ends, seconds = [e for e, _ in older] + ends, [s for _, s in older] + seconds
    return replace(state, ranks=ranks, leader_step_ends=tuple(ends[-window:]),
                   leader_step_seconds=tuple(seconds[-window:]))


def _rank(rank: RankState, tail: RankTail | None) -> RankState:
    if tail is None:
        return rank
    if rank.last_step is not None and (tail.last_step is None or rank.last_step > tail.last_step):
        return rank  # its rows received since are further along
    if rank.last_step == tail.last_step and rank.collectives_done > tail.collectives_done:
        return rank
    return replace(rank, last_step=tail.last_step, last_step_end=tail.last_step_end,
                   collectives_done=tail.collectives_done, last_collective_end=tail.last_collective_end)
