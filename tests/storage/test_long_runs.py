"""A long run's closed step blocks are folded into a fixed-size sketch (services.analysis.rank_sketch) instead of
being kept whole, so what a collector process holds for a live run does not grow with its length.

Compared with the full recomputation from every stored row: the ledger equal (it never reads per-rank values);
the run page equal except the per-rank medians and p90s (within the sketch's bounds) and the heat map's cells
(means over whole chunks); the same through a cache kept across the run's growth, without a cache,
and after rows arrive late for a sealed block.
"""

from __future__ import annotations

import math
import random
from typing import Any

from services.analysis.ledger import build_ledger
from services.analysis.rank_sketch import COMPUTE_ERROR
from services.analysis.views import build_run_views
from services.reports.content import build_report
from services.reports.html import report_html
from services.simulate import SimConfig, simulate
from services.storage.load import load_run_data
from services.storage.runs import get_run
from services.storage.step_blocks import load_summarised_run_data
from services.storage.summary_cache import SummaryCache
from tests.storage.test_incremental_analysis import assert_same, store

EXACT = 512  # (rank, step) values kept whole before a run is long: a few blocks of these runs


def compare_long(engine: Any, run_id: str, cache: SummaryCache | None = None) -> dict[str, Any]:
    with engine.connect() as conn:
        run = get_run(conn, run_id)
        full_data = load_run_data(conn, run)
    summarised = load_summarised_run_data(engine, run, cache, exact_values=EXACT)
    assert summarised.step_summary is not None and summarised.step_summary.sealed is not None
    full, incremental = build_ledger(full_data), build_ledger(summarised)
    assert_same(full.model_dump(mode="json"), incremental.model_dump(mode="json"), "ledger")
    exact = build_run_views(full_data, full, version=1).model_dump(mode="json")
    sketched = build_run_views(summarised, incremental, version=1).model_dump(mode="json")
    exact_ranks, sketched_ranks = exact.pop("ranks"), sketched.pop("ranks")
    # A failed attempt whose blocks went into the sketch no longer says which rank completed which step: its hung
    # ranks come from the heartbeats alone (services/analysis/failures.py), a subset of what the rows say.
    for rows in ("failures", "restarts"):
        exact_rows = exact["timeline"][rows] if rows == "failures" else exact[rows]
        sketched_rows = sketched["timeline"][rows] if rows == "failures" else sketched[rows]
        for a, b in zip(exact_rows, sketched_rows, strict=True):
            if a.get("cause") and b.get("cause"):
                assert set(b["cause"].pop("hung_ranks")) <= set(a["cause"].pop("hung_ranks")), (a, b)
    assert_same(exact, sketched, "views")
    assert exact_ranks["figures_within"] is None
    assert sketched_ranks["figures_within"] == COMPUTE_ERROR
    for a, b in zip(exact_ranks["rows"], sketched_ranks["rows"], strict=True):
        assert (a["rank"], a["host"], a["steps"], a["is_straggler"]) == (b["rank"], b["host"], b["steps"],
                                                                         b["is_straggler"])
        assert math.isclose(a["mean_compute_s"], b["mean_compute_s"], rel_tol=1e-11)
        assert math.isclose(a["straggler_gpu_seconds"], b["straggler_gpu_seconds"], rel_tol=1e-11, abs_tol=1e-9)
        for key in ("median_compute_s", "p90_compute_s"):
            assert abs(b[key] / a[key] - 1) <= COMPUTE_ERROR + 1e-12, (key, a, b)
    assert exact_ranks["straggler_ranks"] == sketched_ranks["straggler_ranks"]
    assert abs(sketched_ranks["median_compute_s"] / exact_ranks["median_compute_s"] - 1) <= COMPUTE_ERROR + 1e-12
    heat_a, heat_b = exact_ranks["heatmap"], sketched_ranks["heatmap"]
    assert {k: v for k, v in heat_a.items() if k != "z"} == {k: v for k, v in heat_b.items() if k != "z"}
    # cells are means over whole chunks drawn at their middle step (tested to the digit in
    # tests/analysis/test_rank_sketch.py): here, the same grid and each row's level
    assert [len(row) for row in heat_a["z"]] == [len(row) for row in heat_b["z"]]
    for row_a, row_b in zip(heat_a["z"], heat_b["z"], strict=True):
        level_a = sum(v for v in row_a if v is not None) / sum(v is not None for v in row_a)
        level_b = sum(v for v in row_b if v is not None) / sum(v is not None for v in row_b)
        assert abs(level_b / level_a - 1) < 0.05
    return sketched_ranks


def long_run(run_id: str, seed: int, **settings: Any) -> list[dict[str, Any]]:
    config = SimConfig(run_id=run_id, seed=seed, **{"ranks": 4, "hours": 0.25, "mtbf_s": 300, "straggler_rank": 2,
                                                    "jitter": 0.1, "checkpoint_every": 200, "records_per_rank": 25,
                                                    **settings})
    return simulate(config).events


def test_a_long_runs_page_matches_the_full_recomputation_within_the_sketchs_bounds(engine) -> None:
    rng = random.Random(21)
    events = long_run("long", 21, end="running")
    rng.shuffle(events)
    cache = SummaryCache()
    cuts = sorted(rng.sample(range(len(events) // 2, len(events)), 3))
    stored = 0
    for cut in [*cuts, len(events)]:
        store(engine, events[stored:cut], rng, fold_share=0.3, cache=cache)
        stored = cut
        compare_long(engine, "long", cache)  # through the cache kept as the run grows
    figures = compare_long(engine, "long")  # and without one
    assert figures["straggler_ranks"] == [2]


def test_rows_arriving_late_for_a_sealed_block_fold_the_run_again(engine) -> None:
    events = long_run("late-sealed", 5, mtbf_s=None)
    steps = [e for e in events if e["kind"] == "steps"]
    early = [e for e in steps if e["step"][0] < 256]  # records of the first blocks
    rng = random.Random(5)
    held_back = early[3:6]
    cache = SummaryCache()
    store(engine, [e for e in events if not any(e is h for h in held_back)], rng, fold_share=0.2, cache=cache)
    compare_long(engine, "late-sealed", cache)
    with engine.connect() as conn:
        run = get_run(conn, "late-sealed")
    sealed = cache.sealed(run.pk)
    assert sealed is not None and (0, 0) in sealed.changes
    store(engine, held_back, rng, fold_share=0.0)  # a spool sent after a collector outage
    compare_long(engine, "late-sealed", cache)
    refolded = cache.sealed(run.pk)
    assert refolded is not None and refolded is not sealed


def test_what_a_process_keeps_of_a_live_run_stops_growing_once_it_is_long(engine) -> None:
    """The cache's bytes for a run kept whole grow with every block; sealed, they are the sketch (flat), at most
    two open blocks and the per-step figures the ledger reads (64 B per step, whatever the ranks)."""
    events = long_run("growing", 9, mtbf_s=None, ranks=16)
    steps = sorted((e for e in events if e["kind"] == "steps"), key=lambda e: e["step"][0])
    others = [e for e in events if e["kind"] != "steps"]
    rng = random.Random(9)
    whole, sealed = SummaryCache(), SummaryCache()
    store(engine, others, rng, fold_share=0.0)
    with engine.connect() as conn:
        run = get_run(conn, "growing")
    sizes: list[tuple[int, int, int, int | None]] = []
    for at in range(0, len(steps), 40):
        store(engine, steps[at:at + 40], rng, fold_share=0.0)
        load_summarised_run_data(engine, run, whole, exact_values=10**9)
        data = load_summarised_run_data(engine, run, sealed, exact_values=EXACT)
        assert data.step_summary is not None
        kept = sealed.sealed(run.pk)
        if kept is not None:
            assert len(data.step_summary.blocks) <= 2  # the open blocks, whole
        last_step = int(data.step_summary.job_steps["step"].max())
        sizes.append((last_step, _blocks_bytes(whole, run.pk), _blocks_bytes(sealed, run.pk),
                      kept.sketch.nbytes if kept is not None else None))
    assert sizes[-1][0] >= 800
    quarter = next(s for s in sizes if s[0] >= sizes[-1][0] / 4)
    assert sizes[-1][1] > 3 * quarter[1], sizes  # kept whole: grows with the run
    sketch_sizes = [s[3] for s in sizes if s[3] is not None]
    assert len(sketch_sizes) >= 5 and max(sketch_sizes) <= 1.2 * sketch_sizes[0], sizes  # sealed: flat
    assert sizes[-1][2] < sizes[-1][1] / 2, sizes
    compare_long(engine, "growing", sealed)


def _blocks_bytes(cache: SummaryCache, run_pk: int) -> int:
    """What the cache holds of the run's steps: its bytes less the run's control events (the same either way)."""
    events = cache.events(run_pk)
    return cache.nbytes - (events.nbytes if events is not None else 0)


def test_a_long_runs_report_says_its_median_compute_is_within_the_sketchs_bound(engine) -> None:
    store(engine, long_run("long-report", 13, mtbf_s=None), random.Random(13), fold_share=0.5)
    with engine.connect() as conn:
        run = get_run(conn, "long-report")
        full_data = load_run_data(conn, run)
    summarised = load_summarised_run_data(engine, run, exact_values=EXACT)
    reports = {}
    for name, data in (("exact", full_data), ("sketched", summarised)):
        ledger = build_ledger(data)
        reports[name] = build_report(ledger, build_run_views(data, ledger, version=1), generated_at=0.0)
    exact, sketched = reports["exact"], reports["sketched"]
    assert exact.median_compute_within is None and sketched.median_compute_within == COMPUTE_ERROR
    assert [r.rank for r in sketched.stragglers] == [r.rank for r in exact.stragglers] == [2]
    for a, b in zip(exact.stragglers, sketched.stragglers, strict=True):
        assert math.isclose(a.straggler_gpu_seconds, b.straggler_gpu_seconds, rel_tol=1e-11)
        assert a.median_compute_seconds is not None and b.median_compute_seconds is not None
        assert abs(b.median_compute_seconds / a.median_compute_seconds - 1) <= COMPUTE_ERROR + 1e-12
    note = "A long run: median compute per step within 0.5%"
    assert note in report_html(sketched) and note not in report_html(exact)
