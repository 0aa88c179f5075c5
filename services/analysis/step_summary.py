"""A run's step blocks merged (services.analysis.step_blocks): what the analysis reads of its steps, whole blocks and
a long run's sealed ones (services.analysis.rank_sketch) together, and the run's compute as one matrix."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from services.analysis.block_clocks import BlockClocks
from services.analysis.rank_sketch import RankSketch
from services.analysis.step_blocks import STRAGGLE_COLUMNS, BlockSteps, StepBlock


@dataclass(frozen=True, slots=True, kw_only=True)
class StepSummary:
    """A run's blocks merged: what the analysis reads of its steps (module docstring).

    A long run's closed blocks can be folded into `sealed` (services.analysis.rank_sketch): then `blocks` holds
    the others whole, and the run page's per-rank figures are those of `sealed` with `blocks` added."""

    job_steps: pd.DataFrame  # attempt, step, start, end, ranks: attempts.build_job_steps of the deduped rows
    straggle: pd.DataFrame  # attempt, step, slowest, median, rank, known: per job step, over known compute
    attempt_ranks: dict[int, int]  # ranks that reported a step, per attempt
    raw_first_start: float | None
    raw_last_end: float | None
    blocks: tuple[StepBlock, ...]
    sealed: RankSketch | None = None
    clocks: tuple[BlockClocks, ...] = ()  # every block's clock groups, whole and sealed, by (attempt, block)

    @property
    def empty(self) -> bool:
        return not self.blocks and self.sealed is None


def merge_blocks(blocks: Sequence[StepBlock], sealed: RankSketch | None = None,
                 sealed_steps: Sequence[BlockSteps] = ()) -> StepSummary:
    """The run's summary from its blocks; `sealed`: a sketch of other blocks, whose per-step figures are
    `sealed_steps`."""
    whole = tuple(sorted(blocks, key=lambda b: (b.attempt, b.block)))
    ordered: tuple[StepBlock | BlockSteps, ...] = tuple(sorted((*whole, *sealed_steps),
                                                               key=lambda b: (b.attempt, b.block)))
    if not ordered:
        job = pd.DataFrame({"attempt": pd.Series([], dtype=np.int64), "step": pd.Series([], dtype=np.int64),
                            "start": pd.Series([], dtype=float), "end": pd.Series([], dtype=float),
                            "ranks": pd.Series([], dtype=np.int64)})
        straggle = pd.DataFrame({c: pd.Series([], dtype=np.int64 if c in ("attempt", "step", "rank", "known")
                                              else float) for c in ("attempt", "step", *STRAGGLE_COLUMNS)})
        return StepSummary(job_steps=job, straggle=straggle, attempt_ranks={}, raw_first_start=None,
                           raw_last_end=None, blocks=())
    attempt = np.concatenate([np.full(len(b.steps), b.attempt, dtype=np.int64) for b in ordered])
    step = np.concatenate([b.steps for b in ordered])

    def cat(name: str) -> np.ndarray:
        return np.concatenate([getattr(b, name) for b in ordered])

    job = pd.DataFrame({"attempt": attempt, "step": step, "start": cat("start"), "end": cat("end"),
                        "ranks": cat("ranks_per_step")})
    straggle = pd.DataFrame({"attempt": attempt, "step": step, "slowest": cat("slowest"), "median": cat("median"),
                             "rank": cat("slowest_rank"), "known": cat("known_ranks")})
    by_attempt: dict[int, list[np.ndarray]] = {}
    for b in ordered:
        by_attempt.setdefault(b.attempt, []).append(b.ranks)
    return StepSummary(
        job_steps=job, straggle=straggle,
        attempt_ranks={a: len(np.unique(np.concatenate(r))) for a, r in by_attempt.items()},
        raw_first_start=min(b.raw_first_start for b in ordered),
        raw_last_end=max(b.raw_last_end for b in ordered), blocks=whole, sealed=sealed,
        clocks=tuple(b.clocks for b in ordered))


@dataclass(frozen=True, slots=True)
class ComputeGrid:
    """Every (rank, job step) compute of a run as one matrix: ranks x job steps (columns in the order of
    `StepSummary.job_steps`), NaN where a rank has no row."""

    ranks: np.ndarray
    attempt: np.ndarray  # per column
    step: np.ndarray  # per column
    compute: np.ndarray
    known: np.ndarray


def compute_grid(summary: StepSummary) -> ComputeGrid:
    blocks = summary.blocks
    ranks = np.unique(np.concatenate([b.ranks for b in blocks])) if blocks else np.zeros(0, dtype=np.int64)
    widths = [len(b.steps) for b in blocks]
    compute = np.full((len(ranks), sum(widths)), np.nan)
    known = np.zeros((len(ranks), sum(widths)), dtype=bool)
    at = 0
    for b, width in zip(blocks, widths, strict=True):
        if len(b.ranks) == len(ranks):  # the usual case: every rank in every block
            compute[:, at:at + width] = b.compute
            known[:, at:at + width] = b.known
        else:
            rows = np.searchsorted(ranks, b.ranks)
            compute[rows, at:at + width] = b.compute
            known[rows, at:at + width] = b.known
        at += width
    return ComputeGrid(ranks=ranks, attempt=summary.job_steps["attempt"].to_numpy(np.int64),
                       step=summary.job_steps["step"].to_numpy(np.int64), compute=compute, known=known)
