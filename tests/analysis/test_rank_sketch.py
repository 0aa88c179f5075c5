"""A long run's per-rank figures from fixed-size histograms (services.analysis.rank_sketch), checked against the
exact figures computed here from every value: counts and means exact, medians and p90s within the documented
relative error, the flag rule's evidence within its bounds, memory that does not grow with the run."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest

from services.analysis.medians import others_median
from services.analysis.rank_sketch import COMPUTE_ERROR, EXCESS_ERROR, HEAT_CHUNKS, RankSketch
from services.analysis.step_blocks import BLOCK_STEPS, StepBlock, summarize_block


def make_blocks(rng: np.random.Generator, ranks: int, steps: int, *, missing: float = 0.0, unknown: float = 0.0,
                slow_rank: int = 1, first_step: int = 0, attempt: int = 0) -> list[StepBlock]:
    """Blocks of a synthetic run: lognormal compute, one rank 30 % slower; `missing`: share of (rank, step) rows
    never sent; `unknown`: share whose collective time is unknown."""
    out = []
    for block in range(first_step // BLOCK_STEPS, (first_step + steps - 1) // BLOCK_STEPS + 1):
        numbers = np.arange(max(block * BLOCK_STEPS, first_step), min((block + 1) * BLOCK_STEPS, first_step + steps))
        rank = np.repeat(np.arange(ranks), len(numbers))
        step = np.tile(numbers, ranks)
        keep = rng.random(len(rank)) >= missing
        rank, step = rank[keep], step[keep]
        compute = rng.lognormal(0.0, 0.2, size=len(rank)) * np.where(rank == slow_rank, 1.3, 1.0)
        comm = rng.uniform(0.0, 0.1, size=len(rank))
        comm[rng.random(len(rank)) < unknown] = np.nan
        start = step * 3.0
        end = start + compute + np.nan_to_num(comm)
        out.append(summarize_block(attempt, block, rank, step, start, end, comm))
    return out


def exact_figures(blocks: list[StepBlock]) -> tuple[pd.DataFrame, pd.DataFrame, float]:
    """Per rank (steps, median, p90, mean), the flag rule's evidence (compared, slower, the two middle excesses,
    their exact median) and the yardstick, from every value."""
    rows = []
    for b in blocks:
        r, c = np.nonzero(~np.isnan(b.compute))
        rows.append(pd.DataFrame({"attempt": b.attempt, "rank": b.ranks[r], "step": b.steps[c],
                                  "compute": b.compute[r, c], "known": b.known[r, c]}))
    frame = pd.concat(rows, ignore_index=True)
    grouped = frame.groupby("rank")["compute"]
    stats = pd.DataFrame({"steps": grouped.size(), "median_s": grouped.median(), "p90_s": grouped.quantile(0.9),
                          "mean_s": grouped.mean()})
    known = frame[frame["known"]].reset_index(drop=True)
    group = known.groupby(["attempt", "step"]).ngroup().to_numpy()
    excess = known["compute"].to_numpy() - others_median(group, known["compute"].to_numpy())
    known = known.assign(excess=excess).dropna(subset=["excess"])

    def middles(values: pd.Series) -> pd.Series:
        ordered = np.sort(values.to_numpy())
        n = len(ordered)
        return pd.Series({"compared": n, "slower": int((ordered > 0).sum()), "lo": ordered[(n - 1) // 2],
                          "hi": ordered[n // 2], "median": float(np.median(ordered))})

    evidence = known.groupby("rank")["excess"].apply(middles).unstack()
    return stats, evidence, float(frame.loc[frame["known"], "compute"].median())


@pytest.mark.parametrize(("missing", "unknown"), [(0.0, 0.0), (0.05, 0.0), (0.0, 0.2), (0.1, 0.3)])
def test_sketch_figures_are_within_their_bounds_of_the_exact_ones(missing: float, unknown: float) -> None:
    rng = np.random.default_rng(7)
    blocks = make_blocks(rng, ranks=24, steps=1000, missing=missing, unknown=unknown)
    sketch = RankSketch()
    for b in blocks:
        sketch.add_block(b)
    figures = sketch.figures(np.linspace(0, 1000, 61))
    stats, evidence, reference = exact_figures(blocks)

    got = figures.stats.loc[stats.index]
    assert (got["steps"].to_numpy() == stats["steps"].to_numpy()).all()
    np.testing.assert_allclose(got["mean_s"], stats["mean_s"], rtol=1e-12)
    for column in ("median_s", "p90_s"):
        error = np.abs(got[column].to_numpy() / stats[column].to_numpy() - 1)
        assert error.max() <= COMPUTE_ERROR + 1e-12, column

    by_rank, yardstick = figures.consistency
    assert abs(yardstick / reference - 1) <= COMPUTE_ERROR + 1e-12
    by_rank = by_rank.loc[evidence.index]
    assert (by_rank["steps"].to_numpy() == evidence["compared"].to_numpy()).all()
    assert (by_rank["slower_steps"].to_numpy() == evidence["slower"].to_numpy()).all()
    # each of the two middle values within EXCESS_ERROR of itself: their mean within that share of the larger
    bound = EXCESS_ERROR * np.maximum(np.abs(evidence["lo"]), np.abs(evidence["hi"])).to_numpy()
    assert (np.abs(by_rank["median_excess"].to_numpy() - evidence["median"].to_numpy()) <= bound + 1e-12).all()
    assert figures.known_any


def test_a_rank_whose_steps_all_took_the_same_time_gets_it_exactly() -> None:
    compute = np.full((3, BLOCK_STEPS), 0.37)
    compute[1] = 0.5
    steps = np.arange(BLOCK_STEPS)
    rank, step = np.repeat(np.arange(3), BLOCK_STEPS), np.tile(steps, 3)
    block = summarize_block(0, 0, rank, step, step * 1.0, step * 1.0 + compute.reshape(-1),
                            np.zeros(len(rank)))
    sketch = RankSketch()
    sketch.add_block(block)
    stats = sketch.figures(np.linspace(0, BLOCK_STEPS, 11)).stats
    assert stats["median_s"].tolist() == pytest.approx([0.37, 0.5, 0.37], rel=1e-15)
    assert stats["p90_s"].tolist() == pytest.approx([0.37, 0.5, 0.37], rel=1e-15)


def test_figures_do_not_depend_on_the_order_blocks_arrive_in() -> None:
    rng = np.random.default_rng(3)
    blocks = make_blocks(rng, ranks=10, steps=900, missing=0.05, unknown=0.1)
    forward, shuffled = RankSketch(), RankSketch()
    for b in blocks:
        forward.add_block(b)
    for b in random.Random(3).sample(blocks, len(blocks)):
        shuffled.add_block(b)
    edges = np.linspace(0, 900, 61)
    one, other = forward.figures(edges), shuffled.figures(edges)
    for column in ("steps", "median_s", "p90_s"):
        assert one.stats[column].tolist() == other.stats[column].tolist()
    np.testing.assert_allclose(one.stats["mean_s"], other.stats["mean_s"], rtol=1e-12)
    pd.testing.assert_frame_equal(one.consistency[0], other.consistency[0])
    np.testing.assert_allclose(one.heat_mean, other.heat_mean, rtol=1e-5)


def test_ranks_that_join_later_attempts_are_added_to_the_sketch() -> None:
    rng = np.random.default_rng(5)
    sketch = RankSketch()
    first = make_blocks(rng, ranks=4, steps=300)
    second = make_blocks(rng, ranks=8, steps=300, first_step=250, attempt=1)
    for b in first + second:
        sketch.add_block(b)
    stats, _, _ = exact_figures(first + second)
    got = sketch.figures(np.linspace(0, 550, 61)).stats
    assert got.index.tolist() == list(range(8))
    assert got["steps"].tolist() == stats["steps"].tolist()
    assert (np.abs(got["median_s"] / stats["median_s"] - 1) <= COMPUTE_ERROR + 1e-12).all()


def test_heat_cells_are_exact_per_step_until_the_run_outgrows_the_chunks_then_means_of_whole_chunks() -> None:
    rng = np.random.default_rng(11)
    short = make_blocks(rng, ranks=5, steps=HEAT_CHUNKS)  # one step per chunk: each cell is its steps' mean
    sketch = RankSketch()
    for b in short:
        sketch.add_block(b)
    edges = np.linspace(0, HEAT_CHUNKS, 41)
    values = np.concatenate([b.compute for b in short], axis=1)
    steps = np.concatenate([b.steps for b in short])
    col = np.clip(np.searchsorted(edges, steps, side="right") - 1, 0, 39)
    expected = np.stack([values[:, col == c].mean(axis=1) for c in range(40)], axis=1)
    np.testing.assert_allclose(sketch.figures(edges).heat_mean, expected, rtol=1e-6)

    long = make_blocks(rng, ranks=5, steps=1000)
    sketch = RankSketch()
    for b in long:
        sketch.add_block(b)
    assert sketch.chunk_steps == 8  # 1000 steps in at most 128 chunks
    edges = np.linspace(0, 1000, 61)
    values = np.concatenate([b.compute for b in long], axis=1)
    steps = np.concatenate([b.steps for b in long])
    middle = (steps // 8 + 0.5) * 8 - 0.5  # each step drawn in the column of its chunk's middle step
    col = np.clip(np.searchsorted(edges, middle, side="right") - 1, 0, 59)
    expected = np.stack([values[:, col == c].mean(axis=1) for c in range(60)], axis=1)
    np.testing.assert_allclose(sketch.figures(edges).heat_mean, expected, rtol=1e-6)
    assert not np.isnan(expected).any()  # chunks shorter than columns: no empty column


def test_memory_does_not_grow_with_the_run() -> None:
    rng = np.random.default_rng(2)
    blocks = make_blocks(rng, ranks=32, steps=20 * BLOCK_STEPS)
    sketch = RankSketch()
    sizes = []
    for b in blocks:
        sketch.add_block(b)
        sizes.append(sketch.nbytes)
    kept_whole = sum(b.nbytes for b in blocks)
    assert sizes[-1] <= 1.3 * sizes[4]  # settles once the bins cover the values
    assert sizes[-1] < kept_whole / 5
    assert sizes[-1] / 32 < 6 * 1024  # per rank


def test_a_huge_spread_of_values_collapses_the_smallest_magnitudes_and_keeps_the_order() -> None:
    """Values from a microsecond to an hour: more bins than MAX_BINS at 1 %; the smallest share the lowest bin,
    medians of the larger values stay within the bound."""
    rng = np.random.default_rng(4)
    ranks, steps = 4, BLOCK_STEPS
    compute = np.exp(rng.uniform(np.log(1e-6), np.log(3600), size=(ranks, steps)))
    rank, step = np.repeat(np.arange(ranks), steps), np.tile(np.arange(steps), ranks)
    block = summarize_block(0, 0, rank, step, step * 1e4, step * 1e4 + compute.reshape(-1), np.zeros(ranks * steps))
    sketch = RankSketch()
    sketch.add_block(block)
    assert sketch.compute.pos.shape[1] == 2048
    got = sketch.figures(np.linspace(0, steps, 11)).stats["median_s"].to_numpy()
    exact = np.median(compute, axis=1)
    assert (np.abs(got / exact - 1) <= COMPUTE_ERROR + 1e-12).all()
