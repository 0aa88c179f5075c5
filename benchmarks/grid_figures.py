"""A live run's per-rank figures from its ragged compute grid, as the analyst builds them every round, against the
same figures rank by rank with the straggler evidence through pandas (how they were computed before, and how the
rows path still computes them), in one run.

    python -m benchmarks.grid_figures [--ranks 256] [--steps 150,600,1200] [--repeat 7]

The grid: ranks x job steps of compute, the last two steps not reported yet by a third of the ranks and the last one
by every seventh (a live run between two records of its ranks), every value known (collective timings sent). Timed
in this process's CPU, median of `--repeat`, each way in alternation: the run page's median, p90 and mean per rank
and the flag rule's per-rank evidence (services.analysis.grid_figures), which tests/analysis/test_grid_figures.py
shows equal to the bit.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import pandas as pd

from benchmarks._common import machine
from services.analysis.grid_figures import grid_consistency, row_figures
from services.analysis.stragglers import rank_consistency


def live_grid(ranks: int, steps: int, seed: int = 1) -> np.ndarray:
    values = np.random.default_rng(seed).lognormal(-1.0, 0.1, (ranks, steps))
    values[::3, -2:] = np.nan
    values[1::7, -1] = np.nan
    return values


def by_rows(values: np.ndarray) -> None:
    """Rank by rank, and the known values as a frame through `rank_consistency`."""
    present = ~np.isnan(values)
    mine = [values[i][present[i]] for i in range(len(values))]
    np.array([np.median(v) for v in mine]), np.array([np.quantile(v, 0.9) for v in mine])
    np.array([v.mean() for v in mine])
    rows, cols = np.nonzero(present)
    rank_consistency(pd.DataFrame({"attempt": np.zeros(len(cols), np.int64), "rank": rows.astype(np.int64),
                                   "step": cols.astype(np.int64), "compute": values[rows, cols]}))


def by_grid(values: np.ndarray) -> None:
    present = ~np.isnan(values)
    row_figures(values, present)
    grid_consistency(np.arange(len(values)), values, present)


def cpu_ms(way: Callable[[np.ndarray], None], values: np.ndarray) -> float:
    started = time.process_time()
    way(values)
    return (time.process_time() - started) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=256)
    parser.add_argument("--steps", default="150,600,1200", help="job steps of the grid, comma-separated")
    parser.add_argument("--repeat", type=int, default=7)
    ns = parser.parse_args()
    print(f"{machine()}; {ns.ranks} ranks, the last steps ragged; CPU ms, median of {ns.repeat}")
    print(f"{'steps':>6} {'rank by rank':>13} {'grid':>8} {'grid / rank by rank':>20}")
    for steps in (int(s) for s in ns.steps.split(",")):
        values = live_grid(ns.ranks, steps)
        rows_ms: list[float] = []
        grid_ms: list[float] = []
        for _ in range(ns.repeat):  # alternating, so the machine's drift moves both
            rows_ms.append(cpu_ms(by_rows, values))
            grid_ms.append(cpu_ms(by_grid, values))
        old, new = statistics.median(rows_ms), statistics.median(grid_ms)
        print(f"{steps:>6} {old:>13.1f} {new:>8.1f} {new / old:>20.2f}")


if __name__ == "__main__":
    main()
