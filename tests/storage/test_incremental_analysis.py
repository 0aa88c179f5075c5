"""The ledger and views built from the step blocks kept up to date as rows arrive (services/storage/step_blocks.py)
equal the ones built from every stored row, on random runs whose events arrive in random order and batches.

Builds go through a SummaryCache (the decoded blocks and control events of a run kept in the process, as the
collector's analysis cache does) kept across the comparisons of a run, with folds done through it and, as another
collector process would, without it: a block or events changing after they were cached must be read again.

Tolerance: relative 1e-11 (absolute 1e-9) on every float; the heat map's cells, which are rounded to 6 decimals,
to 1.1e-6. The two builds add the same terms in other orders (per block, then across blocks; a matrix product for
the heat map), which moves a sum of n terms by at most about n ulps: for the largest sums here (~1e6 GPU-seconds
of ~1e4 terms) that is ~1e-12 relative. Everything else (counts, steps, ranks, categories, flags) is equal.
"""

from __future__ import annotations

import itertools
import json
import math
import random
from typing import Any

import pandas as pd
import pytest

from services.analysis.ledger import build_ledger
from services.analysis.views import _rank_figures_of_blocks, build_run_views
from services.collector.batch import parse_batch
from services.simulate import SimConfig, simulate
from services.storage.load import load_run_data
from services.storage.runs import get_run
from services.storage.step_blocks import fold_step_blocks, load_summarised_run_data
from services.storage.summary_cache import SummaryCache
from services.storage.write import write_batches

REL, ABS, HEAT_ABS = 1e-11, 1e-9, 1.1e-6


def assert_same(full: Any, incremental: Any, path: str = "") -> None:
    if isinstance(full, dict):
        assert set(full) == set(incremental), path
        for key in full:
            assert_same(full[key], incremental[key], f"{path}.{key}")
    elif isinstance(full, list):
        assert len(full) == len(incremental), path
        for i, (a, b) in enumerate(zip(full, incremental, strict=True)):
            assert_same(a, b, f"{path}[{i}]")
    elif isinstance(full, float) and isinstance(incremental, float):
        tolerance = HEAT_ABS if ".heatmap.z" in path else ABS
        assert math.isclose(full, incremental, rel_tol=REL, abs_tol=tolerance), (path, full, incremental)
    else:
        assert full == incremental, (path, full, incremental)


def with_replays(events: list[dict[str, Any]], rng: random.Random) -> list[dict[str, Any]]:
    """Some compact step records sent again regrouped (a spool replay): their rows stored twice under new ids,
    a few of them with a later start (the earliest copy counts)."""
    out = list(events)
    for i, e in enumerate(events):
        if e["kind"] == "steps" and len(e["step"]) >= 2 and rng.random() < 0.3:
            cut = rng.randrange(1, len(e["step"]))
            for part, sl in (("a", slice(0, cut)), ("b", slice(cut, None))):
                copy = {k: (v[sl] if isinstance(v, list) else v) for k, v in e.items()}
                if rng.random() < 0.3:  # later start, same end: never the copy that counts
                    copy["start"] = [s + 0.25 * (end - s) for s, end in zip(copy["start"], copy["end"], strict=True)]
                copy["event_id"] = f"replay-{i}-{part}"
                out.append(copy)
    return out


def store(engine: Any, events: list[dict[str, Any]], rng: random.Random, fold_share: float,
          cache: SummaryCache | None = None) -> None:
    """The events in random batches; after some of them the changed blocks are summarised, as the analyst does
    (half of the time through `cache`, else as another process would)."""
    i = 0
    while i < len(events):
        n = rng.randint(1, 40)
        records = parse_batch(json.dumps({"events": events[i:i + n]}).encode(), max_events=10**6, max_rows=10**8)
        (result,) = write_batches(engine, [records])
        assert result.conflict is None
        i += n
        if rng.random() < fold_share:
            with engine.connect() as conn:
                run = get_run(conn, events[0]["run_id"])
            fold_step_blocks(engine, run.pk, cache if rng.random() < 0.5 else None)


def compare(engine: Any, run_id: str, cache: SummaryCache | None = None) -> None:
    with engine.connect() as conn:
        run = get_run(conn, run_id)
        full_data = load_run_data(conn, run)
    summarised = load_summarised_run_data(engine, run, cache)
    full, incremental = build_ledger(full_data), build_ledger(summarised)
    assert_same(full.model_dump(mode="json"), incremental.model_dump(mode="json"), "ledger")
    assert_same(build_run_views(full_data, full, version=1).model_dump(mode="json"),
                build_run_views(summarised, incremental, version=1).model_dump(mode="json"), "views")
    if cache is not None:  # the events read through the cache are the run's
        key = ["kind", "time", "attempt", "rank", "step"]
        full_events, cached_events = (frame.sort_values(key, kind="stable").reset_index(drop=True).astype(str)
                                      for frame in (full_data.events, summarised.events))
        pd.testing.assert_frame_equal(full_events, cached_events)


CONFIGS: list[dict[str, Any]] = [
    dict(ranks=4, hours=0.05, mtbf_s=60, straggler_rank=1, jitter=0.05, end="failed", checkpoint_every=37),
    dict(ranks=3, hours=0.04, mtbf_s=45, comm_inline=False, straggler_rank=2, end="running", killed=True),
    dict(ranks=6, hours=0.05, mtbf_s=None, straggler_rank=0, straggler_prob=0.4, jitter=0.1, end="finished"),
    dict(ranks=2, hours=0.06, mtbf_s=50, comm_inline=False, collectives=True, end="finished", checkpoint_every=50),
    dict(ranks=5, hours=0.03, mtbf_s=40, collectives=False, end="running", records_per_rank=7),
]


@pytest.mark.parametrize("case", range(len(CONFIGS)))
def test_the_ledger_and_views_from_step_blocks_equal_a_full_recomputation(engine, case: int) -> None:
    rng = random.Random(1000 + case)
    settings: dict[str, Any] = {"records_per_rank": rng.choice([3, 11, 40]), **CONFIGS[case]}
    config = SimConfig(run_id=f"inc-{case}", seed=case, **settings)
    events = with_replays(simulate(config).events, rng)
    rng.shuffle(events)
    cache = SummaryCache()
    cuts = sorted(rng.sample(range(1, len(events)), 3))
    for lo, hi in itertools.pairwise([0, *cuts, len(events)]):
        store(engine, events[lo:hi], rng, fold_share=0.3, cache=cache)
        compare(engine, config.run_id, cache)  # mid-stream (a live run), then at the end
    compare(engine, config.run_id)  # without a cache


def test_the_usual_shape_takes_the_per_block_path(engine) -> None:
    """Every rank in every step with its collective time known: the run page's per-rank figures are read block by
    block (views._rank_figures_of_blocks), and still equal the full recomputation."""
    events = simulate(SimConfig(run_id="usual", ranks=4, hours=0.05, mtbf_s=None, seed=3, straggler_rank=2,
                                records_per_rank=9)).events
    rng = random.Random(3)
    cache = SummaryCache()
    store(engine, events, rng, fold_share=0.3, cache=cache)
    with engine.connect() as conn:
        run = get_run(conn, "usual")
    data = load_summarised_run_data(engine, run, cache)
    assert data.step_summary is not None
    assert _rank_figures_of_blocks(data.step_summary, 64, 200) is not None
    compare(engine, "usual", cache)


def test_a_block_summarised_before_its_rows_all_arrived_is_summarised_again(engine) -> None:
    events = simulate(SimConfig(run_id="late", ranks=3, hours=0.02, mtbf_s=None, seed=7,
                                records_per_rank=5)).events
    steps = [e for e in events if e["kind"] == "steps"]
    others = [e for e in events if e["kind"] != "steps"]
    rng = random.Random(7)
    store(engine, others + steps[:-3], rng, fold_share=1.0)
    with engine.connect() as conn:
        run = get_run(conn, "late")
    fold_step_blocks(engine, run.pk)
    assert fold_step_blocks(engine, run.pk) == 0  # nothing changed since
    store(engine, steps[-3:], rng, fold_share=0.0)
    assert fold_step_blocks(engine, run.pk) >= 1
    compare(engine, "late")


def test_a_block_or_events_changed_after_they_were_cached_are_read_again(engine) -> None:
    """A build through the cache, then rows for blocks it holds and new control events, summarised by another
    process (not through this cache) or by the build itself: the next build reads them."""
    events = simulate(SimConfig(run_id="cached", ranks=3, hours=0.03, mtbf_s=40, seed=11, records_per_rank=6,
                                end="failed")).events
    steps = [e for e in events if e["kind"] == "steps"]
    others = [e for e in events if e["kind"] != "steps"]
    rng = random.Random(11)
    cache = SummaryCache()
    store(engine, others[: len(others) // 2] + steps[:-4], rng, fold_share=0.0)
    compare(engine, "cached", cache)  # everything read, then kept
    store(engine, steps[-4:-2], rng, fold_share=0.0)
    with engine.connect() as conn:
        run = get_run(conn, "cached")
    assert fold_step_blocks(engine, run.pk) >= 1  # another process: the cache holds the older summaries
    compare(engine, "cached", cache)
    store(engine, others[len(others) // 2:] + steps[-2:], rng, fold_share=0.0)
    compare(engine, "cached", cache)  # folded by the build itself, new events read by id
    compare(engine, "cached", cache)  # nothing changed: all from the cache
