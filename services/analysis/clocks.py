"""Clocks that disagree between hosts: each host's clock offset, measured from the run's own step ends, and the
run's times put on one clock before the ledger paints them (docs/ledger.md, "Clocks").

A synchronous data-parallel step ends with an all-reduce that completes at the same true instant on every rank,
then the same optimizer update: every rank ends step s within milliseconds of the others. A host whose clock is
ahead by d reports all its ends d later. Per block of steps (services.analysis.step_blocks: an attempt's steps
[128 k, 128 (k + 1))), `block_clocks` finds:

- each rank's *deviation*: the median, over the steps it shares with the block's anchor (the rank with the most
  steps, lowest of equals), of its end minus the anchor's; its *spread*: the median distance of those differences
  from the deviation. A rank whose spread exceeds TOLERANCE_S does not keep time with the anchor (a loop that is
  not synchronous, steps timed on the host while the GPU runs behind): it gives no evidence;
- *clock groups*: the ranks with evidence, sorted by deviation, a new group wherever two neighbours are more than
  TOLERANCE_S apart; the ranks without evidence form one more group (deviation NaN, never corrected);
- per group, the first start and the last end of each step, and of its raw rows (duplicates included): the job
  step's span once each group's offset is taken out.

`decide` settles, per run and with the hosts the ranks' `attempt_start` events name, which clock is the reference
and which groups are corrected:

- the reference clock is an attempt's *reference rank*'s: in the attempt's block of the most ranks, the lowest
  rank of the group of the most ranks (of equals, the one holding the lowest rank: rank 0 runs on node rank 0,
  where `goodput launch` sends the run-level events from). A block without it (the ranks of one host alone
  reached a failure's last steps) takes its own largest group as reference, then moves onto the attempt's clock by
  the median difference of its ranks' offsets from the ones they had in the blocks with the reference rank;
- a group's offset is its deviation minus the reference's; it is corrected when none of its ranks runs on a host
  of the reference's ranks (one host has one clock: ranks of one host that end their steps apart are something
  else) and every one names its host, or when it is ABSURD_S or more (ranks of a synchronous step never end a
  minute apart, step after step: that is a clock, whatever the hosts say);
- a rank's offset in an attempt is the median of its blocks'; a rank without steps takes its host-mates' (in the
  attempt, else the host's in the nearest attempt that measured it), else none.

`on_one_clock` then takes every time a rank reported (its events, steps and collectives) as `time - offset`: the
reference clock's. Run-level events (no rank) are on the reference clock. Only the events decide: receipt times
never enter, so the ledger does not depend on how the events were batched or when they arrived.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from services.analysis.block_clocks import ABSURD_S, TOLERANCE_S, BlockClocks, block_clocks
from services.analysis.run_data import RunData
from services.analysis.step_blocks import BLOCK_STEPS, block_of
from services.analysis.step_summary import StepSummary
from services.schemas.clocks import HostClock

# -- the run's decision ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunClocks:
    """What `decide` settled: per block, each clock group's offset (seconds ahead of the reference clock) and, for
    the blocks with one, each rank's; per (attempt, rank), the offset its events carry; per host, its offset."""

    blocks: dict[tuple[int, int], np.ndarray]  # (attempt, block) -> offset per clock group
    in_blocks: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]  # (attempt, block) -> (ranks, their offsets)
    ranks: dict[tuple[int, int], float]  # (attempt, rank) -> the offset of its events
    hosts: tuple[HostClock, ...]

    @property
    def corrected(self) -> bool:
        return bool(self.in_blocks) or any(v != 0 for v in self.ranks.values())


SAMPLED_BLOCKS = 64  # blocks of an attempt whose offsets give a rank's offset for its events (evenly spread)


def decide(blocks: Iterable[BlockClocks], events: pd.DataFrame) -> RunClocks:
    host_of = _hosts(events)
    by_attempt: dict[int, list[BlockClocks]] = {}
    for b in blocks:
        by_attempt.setdefault(b.attempt, []).append(b)
    offsets: dict[tuple[int, int], np.ndarray] = {}
    ranks: dict[tuple[int, int], float] = {}
    decided: dict[tuple[int, bytes, bytes, int], np.ndarray] = {}
    for attempt, mine in by_attempt.items():
        reference = _reference_rank(mine)
        anchored, others = [], []
        for b in mine:
            at = int(np.searchsorted(b.ranks, reference)) if reference is not None else len(b.ranks)
            group = int(b.group[at]) if at < len(b.ranks) and b.ranks[at] == reference else -1
            if group >= 0 and np.isfinite(b.deviation[group]):
                offsets[(b.attempt, b.block)] = _block_offsets(b, host_of, decided, group)
                anchored.append(b)
            else:
                others.append(b)
        measured = _rank_offsets(attempt, anchored, offsets) if anchored else {}
        for b in others:  # the reference rank sent nothing here (a failure's last step): anchored by shared ranks
            offsets[(b.attempt, b.block)] = _anchored(b, _block_offsets(b, host_of, decided, None), measured)
        ranks.update(measured)
    in_blocks = {key: (b.ranks, offsets[key][b.group]) for b in (x for m in by_attempt.values() for x in m)
                 if (key := (b.attempt, b.block)) in offsets and offsets[key].any()}
    hosts = _host_clocks(ranks, host_of)
    for key in host_of.keys() - ranks.keys():  # ranks without steps: their host's
        attempt, _ = key
        found = _host_offset(hosts, host_of[key], attempt)
        if found is not None:
            ranks[key] = found
    shown = tuple(HostClock(host=h, offset_seconds=v[-1][1], attempt=v[-1][0], ranks=v[-1][2])
                  for h, v in sorted(hosts.items()))
    return RunClocks(blocks=offsets, in_blocks=in_blocks, ranks=ranks, hosts=shown)


def _reference_rank(blocks: list[BlockClocks]) -> int | None:
    """The rank whose clock is the attempt's reference: in the block with the most ranks (the earliest of equals),
    the lowest rank of the clock group of the most ranks (of equals, the one holding the lowest rank)."""
    fullest = max(blocks, key=lambda b: (len(b.ranks), -b.block))
    candidates = np.flatnonzero(np.isfinite(fullest.deviation)).tolist()
    if not candidates:
        return None
    sizes = np.bincount(fullest.group, minlength=len(fullest.deviation))
    lowest = {g: int(fullest.ranks[np.argmax(fullest.group == g)]) for g in candidates}
    return lowest[max(candidates, key=lambda g: (int(sizes[g]), -lowest[g]))]


def _anchored(b: BlockClocks, local: np.ndarray, measured: dict[tuple[int, int], float]) -> np.ndarray:
    """A block without the reference rank, its offsets from its own reference moved onto the attempt's: by the
    median, over its ranks measured in the blocks that have the reference rank, of the difference."""
    evidence = np.isfinite(b.deviation)[b.group]
    known = [(measured[(b.attempt, int(r))], float(local[g])) for r, g in zip(b.ranks[evidence].tolist(),
                                                                              b.group[evidence].tolist(), strict=True)
             if (b.attempt, int(r)) in measured]
    if not known:
        return local
    shift = float(np.median([m - v for m, v in known]))
    return local + shift if abs(shift) >= TOLERANCE_S else local


def _rank_offsets(attempt: int, blocks: list[BlockClocks],
                  offsets: dict[tuple[int, int], np.ndarray]) -> dict[tuple[int, int], float]:
    """Each rank's offset in the attempt: the median of its blocks' (of at most SAMPLED_BLOCKS of them, evenly
    spread), over the blocks where its step ends gave evidence."""
    ordered = sorted(blocks, key=lambda b: b.block)
    picked = [ordered[i] for i in np.unique(np.linspace(0, len(ordered) - 1, min(len(ordered), SAMPLED_BLOCKS))
                                            .round().astype(np.int64))]
    ranks = np.unique(np.concatenate([b.ranks for b in picked]))
    values = np.full((len(picked), len(ranks)), np.nan)
    for row, b in enumerate(picked):
        evidence = np.isfinite(b.deviation)[b.group]
        values[row, np.searchsorted(ranks, b.ranks[evidence])] = offsets[(b.attempt, b.block)][b.group[evidence]]
    measured = ~np.isnan(values).all(axis=0)
    median = np.nanmedian(values[:, measured], axis=0) if measured.any() else np.zeros(0)
    return {(attempt, int(r)): float(v) for r, v in zip(ranks[measured].tolist(), median.tolist(), strict=True)}


def _hosts(events: pd.DataFrame) -> dict[tuple[int, int], str]:
    """{(attempt, rank): host} from the attempt_start events (the latest one of each pair)."""
    starts = events[(events["kind"] == "attempt_start") & events["host"].notna() & events["attempt"].notna()
                    & events["rank"].notna()].sort_values("time", kind="stable")
    return {(int(a), int(r)): str(h) for a, r, h in zip(starts["attempt"].to_numpy(np.float64),
                                                        starts["rank"].to_numpy(np.float64), starts["host"],
                                                        strict=True)}


def _block_offsets(b: BlockClocks, host_of: dict[tuple[int, int], str],
                  decided: dict[tuple[int, bytes, bytes, int], np.ndarray], reference: int | None) -> np.ndarray:
    """Each group's offset from the reference group's clock (0 where it is not corrected); `reference`: the group of
    the attempt's reference rank, None: the block's own (the group of the most ranks). Which group is the reference
    and which run on other hosts depends only on the groups' ranks: decided once per grouping (`decided`), the same
    block after block."""
    candidates = np.isfinite(b.deviation)
    if candidates.sum() < 2:
        return np.zeros(len(b.deviation))
    key = (b.attempt, b.ranks.tobytes(), b.group.tobytes(), -1 if reference is None else reference)
    found = decided.get(key)
    if found is None:
        found = decided[key] = _grouping(b, host_of, reference)
    chosen, apart = int(found[0]), found[1:].astype(bool)
    offset = np.where(candidates, b.deviation - b.deviation[chosen], 0.0)
    return np.where(apart | (np.abs(offset) >= ABSURD_S), offset, 0.0)


def _grouping(b: BlockClocks, host_of: dict[tuple[int, int], str], reference: int | None) -> np.ndarray:
    """[the reference group, then per group 1 where none of its ranks runs on a host of the reference's ranks and
    each names its host, else 0]."""
    candidates = np.flatnonzero(np.isfinite(b.deviation)).tolist()
    sizes = np.bincount(b.group, minlength=len(b.deviation))
    members = {g: b.ranks[b.group == g].tolist() for g in candidates}
    if reference is None:
        reference = max(candidates, key=lambda g: (int(sizes[g]), -members[g][0]))  # members: ascending ranks
    reference_hosts = {host_of.get((b.attempt, r)) for r in members[reference]}
    apart = np.zeros(len(b.deviation))
    for g in candidates:
        named = {host_of.get((b.attempt, r)) for r in members[g]}
        apart[g] = g != reference and None not in named and not named & reference_hosts
    return np.concatenate([[float(reference)], apart])


def _host_clocks(ranks: dict[tuple[int, int], float],
                 host_of: dict[tuple[int, int], str]) -> dict[str, list[tuple[int, float, int]]]:
    """Per host, (attempt, median offset of its measured ranks, their number) of every attempt it was measured in,
    by attempt."""
    by: dict[tuple[str, int], list[float]] = {}
    for (attempt, rank), offset in ranks.items():
        host = host_of.get((attempt, rank))
        if host is not None:
            by.setdefault((host, attempt), []).append(offset)
    out: dict[str, list[tuple[int, float, int]]] = {}
    for (host, attempt), values in sorted(by.items()):
        out.setdefault(host, []).append((attempt, float(np.median(values)), len(values)))
    return out


def _host_offset(hosts: dict[str, list[tuple[int, float, int]]], host: str, attempt: int) -> float | None:
    """The host's offset in the attempt nearest `attempt` that measured it (the earlier of two as near)."""
    found = hosts.get(host)
    if not found:
        return None
    return min(found, key=lambda m: (abs(m[0] - attempt), m[0]))[1]


# -- the run's times on one clock ----------------------------------------------------------------------------


def on_one_clock(data: RunData) -> tuple[RunData, tuple[HostClock, ...]]:
    """The run's data with every rank's times on the reference clock, and each measured host's offset."""
    summary = data.step_summary
    if summary is not None:
        clocks = decide(summary.clocks, data.events)
        if not clocks.corrected:
            return data, clocks.hosts
        return replace(data, events=_corrected_events(data.events, clocks),
                       step_summary=_corrected_summary(summary, clocks)), clocks.hosts
    if data.steps.empty:
        return data, ()
    blocks = clocks_of_rows(data.steps)
    clocks = decide(blocks, data.events)
    if not clocks.corrected:
        return data, clocks.hosts
    return replace(data, events=_corrected_events(data.events, clocks),
                   steps=_corrected_rows(data.steps, clocks),
                   collectives=_corrected_rows(data.collectives, clocks)), clocks.hosts


def clocks_of_rows(steps: pd.DataFrame) -> list[BlockClocks]:
    """Every block's clocks from a run's step rows (STEP_COLUMNS, duplicates included; deduped as
    `summarize_block` does: of copies of one (attempt, rank, step), the earliest (start, end))."""
    attempt = steps["attempt"].to_numpy(np.int64)
    rank = steps["rank"].to_numpy(np.int64)
    step = steps["step"].to_numpy(np.int64)
    start, end = steps["start"].to_numpy(np.float64), steps["end"].to_numpy(np.float64)
    attempt, block, rank, step, start, end = _by_block(attempt, block_of(step), rank, step, start, end)
    cut = np.flatnonzero(np.r_[True, (attempt[1:] != attempt[:-1]) | (block[1:] != block[:-1]), True])
    out = []
    for lo, hi in itertools.pairwise(cut):
        r, s, t0, t1 = rank[lo:hi], step[lo:hi], start[lo:hi], end[lo:hi]
        new_rank = np.r_[True, r[1:] != r[:-1]]
        first = new_rank | np.r_[True, s[1:] != s[:-1]]
        # np.unique's results without its sorts: the block's rows come by rank, and its steps are BLOCK_STEPS apart
        ranks, raw_row = r[new_rank], np.cumsum(new_rank) - 1
        steps_, col = _steps_of_block(int(block[lo]), s[first])
        out.append(block_clocks(int(attempt[lo]), int(block[lo]), ranks, raw_row[first], steps_, col,
                                t0[first], t1[first], raw_row, t0, t1))
    return out


def _by_block(attempt: np.ndarray, block: np.ndarray, rank: np.ndarray, step: np.ndarray, start: np.ndarray,
              end: np.ndarray) -> tuple[np.ndarray, ...]:
    """The columns in np.lexsort((end, start, step, rank, block, attempt)) order. Rows as storage hands them over
    (sorted by (attempt, rank, step), one per step) take it from a stable sort by (attempt, block) alone."""
    order = np.lexsort((block, attempt))
    a, b, r, s = attempt[order], block[order], rank[order], step[order]
    same_block = (a[1:] == a[:-1]) & (b[1:] == b[:-1])
    if not bool(np.all(~same_block | (r[1:] > r[:-1]) | ((r[1:] == r[:-1]) & (s[1:] > s[:-1])))):
        order = np.lexsort((end, start, step, rank, block, attempt))
        a, b, r, s = attempt[order], block[order], rank[order], step[order]
    return a, b, r, s, start[order], end[order]


def _steps_of_block(block: int, step: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(step, return_inverse=True) of steps of one block, in O(rows): a step is its offset in the block."""
    base = block * BLOCK_STEPS
    offset = step - base
    present = np.zeros(BLOCK_STEPS, dtype=bool)
    present[offset] = True
    return base + np.flatnonzero(present), (np.cumsum(present) - 1)[offset]


def _offsets_of(attempt: np.ndarray, rank: np.ndarray, clocks: RunClocks) -> np.ndarray:
    keys = zip(attempt.tolist(), rank.tolist(), strict=True)
    return np.array([clocks.ranks.get((int(a), int(r)), 0.0) for a, r in keys], dtype=np.float64)


def _corrected_events(events: pd.DataFrame, clocks: RunClocks) -> pd.DataFrame:
    owned = (events["attempt"].notna() & events["rank"].notna()).to_numpy()
    if not owned.any():
        return events
    offset = np.zeros(len(events))
    offset[owned] = _offsets_of(events["attempt"].to_numpy(np.float64)[owned],
                                events["rank"].to_numpy(np.float64)[owned], clocks)
    return events.assign(time=events["time"].to_numpy(np.float64) - offset)


def _corrected_rows(rows: pd.DataFrame, clocks: RunClocks) -> pd.DataFrame:
    """Step or collective rows, each moved by its rank's group offset in its block."""
    if rows.empty:
        return rows
    attempt, rank = rows["attempt"].to_numpy(np.int64), rows["rank"].to_numpy(np.int64)
    block = block_of(rows["step"].to_numpy(np.int64))
    offset = np.zeros(len(rows))
    order = np.lexsort((block, attempt))
    cut = np.flatnonzero(np.r_[True, (attempt[order][1:] != attempt[order][:-1])
                               | (block[order][1:] != block[order][:-1]), True])
    for lo, hi in itertools.pairwise(cut):
        sel = order[lo:hi]
        found = clocks.in_blocks.get((int(attempt[sel[0]]), int(block[sel[0]])))
        if found is not None:
            ranks, values = found
            at = np.clip(np.searchsorted(ranks, rank[sel]), 0, len(ranks) - 1)
            offset[sel] = np.where(ranks[at] == rank[sel], values[at], 0.0)
    return rows.assign(start=rows["start"].to_numpy(np.float64) - offset,
                       end=rows["end"].to_numpy(np.float64) - offset)


def _corrected_summary(summary: StepSummary, clocks: RunClocks) -> StepSummary:
    """The summary's job steps and raw extremes on the reference clock."""
    fixed: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []
    raw_first, raw_last = np.inf, -np.inf
    for b in summary.clocks:
        offsets = clocks.blocks.get((b.attempt, b.block), np.zeros(len(b.deviation)))
        raw_first = min(raw_first, float(np.min(b.raw_first_start - offsets)))
        raw_last = max(raw_last, float(np.max(b.raw_last_end - offsets)))
        if offsets.any():
            fixed.append((b.attempt, b.steps, *corrected_spans(b, offsets)))
    job = summary.job_steps
    if fixed:
        index = pd.MultiIndex.from_arrays([job["attempt"].to_numpy(np.int64), job["step"].to_numpy(np.int64)])
        keys = pd.MultiIndex.from_arrays([np.concatenate([np.full(len(s), a, dtype=np.int64)
                                                          for a, s, _, _ in fixed]),
                                          np.concatenate([s for _, s, _, _ in fixed])])
        at = index.get_indexer(keys)
        start, end = job["start"].to_numpy(np.float64).copy(), job["end"].to_numpy(np.float64).copy()
        start[at] = np.concatenate([f[2] for f in fixed])
        end[at] = np.concatenate([f[3] for f in fixed])
        job = job.assign(start=start, end=end)
    return replace(summary, job_steps=job, raw_first_start=raw_first if np.isfinite(raw_first) else None,
                   raw_last_end=raw_last if np.isfinite(raw_last) else None)


def corrected_spans(b: BlockClocks, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each step's first start and last end over the block's groups, each group's offset taken out."""
    # every step has a rank, so some group's value: no all-NaN column
    return np.nanmin(b.start - offsets[:, None], axis=0), np.nanmax(b.end - offsets[:, None], axis=0)


# -- the collector's view (live detection) -------------------------------------------------------------------

LIVE_TOLERANCE_S = 1.0  # collector offsets within this of each other are one clock (services.storage.clock_readings)


def reference_offset(offsets: dict[int, float]) -> float:
    """The offset of the run's reference clock from the collector's, from its ranks' offsets from the collector's
    (rank -> seconds ahead): the clock the most ranks share (of equals, the one of the lowest rank), as `decide`
    picks the reference; 0 when none was measured. Live detection books a provisional hang on the run's own
    clock with it."""
    if not offsets:
        return 0.0
    ranks = sorted(offsets, key=lambda r: (offsets[r], r))
    values = np.array([offsets[r] for r in ranks])
    ids = np.cumsum(np.r_[True, np.diff(values) > LIVE_TOLERANCE_S]) - 1
    groups = range(int(ids[-1]) + 1)
    best = max(groups, key=lambda g: (int((ids == g).sum()), -min(r for r, i in zip(ranks, ids, strict=True)
                                                                    if i == g)))
    return float(np.median(values[ids == best]))
