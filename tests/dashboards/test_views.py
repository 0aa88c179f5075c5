"""The dashboard's read models (services.analysis.views) agree with the ledger and stay small."""

from __future__ import annotations

import itertools
import json

import pytest

from services.analysis.ledger import build_ledger
from services.analysis.run_data import run_data_from_events
from services.analysis.views import MAX_POINTS_PER_ATTEMPT, build_run_views
from services.simulate import SimConfig, simulate


def views_of(config: SimConfig, **kwargs):
    result = simulate(config)
    data = run_data_from_events(config.run_id, result.events)
    ledger = build_ledger(data)
    return build_run_views(data, ledger, version=1, **kwargs).model_dump(mode="json"), ledger  # the JSON served


def test_painted_timeline_adds_up_to_the_ledger_per_category() -> None:
    views, ledger = views_of(SimConfig(run_id="t", ranks=8, hours=0.2, mtbf_s=300, hang_at_step=150, seed=4))
    gpus = views["timeline"]["allocations"][0]["gpus"]
    seconds: dict[str, float] = {}
    for s in views["timeline"]["segments"]:
        seconds[s["category"]] = seconds.get(s["category"], 0.0) + (s["end"] - s["start"]) * gpus
    waste = ledger.waste_gpu_seconds
    for category in ("startup", "checkpoint", "rework", "hang", "idle"):
        assert seconds.get(category, 0.0) == pytest.approx(getattr(waste, category), rel=1e-6, abs=1e-3), category
    kept = ledger.productive_gpu_seconds + waste.straggler  # straggler is carved out of kept steps
    assert seconds["productive"] == pytest.approx(kept, rel=1e-6)


def test_restart_rows_carry_the_ledgers_attempt_costs() -> None:
    views, ledger = views_of(SimConfig(run_id="t", ranks=4, hours=0.2, mtbf_s=300, seed=7))
    attempts = ledger.attempts
    assert len(views["restarts"]) == ledger.restarts > 0
    for row, prev, cur in zip(views["restarts"], attempts, attempts[1:], strict=False):
        assert row["attempt"] == cur.attempt
        assert row["resume_step"] == cur.resume_step
        assert row["rework_gpu_seconds"] == prev.gpu_seconds.get("rework", 0.0)
        assert row["hang_gpu_seconds"] == prev.gpu_seconds.get("hang", 0.0)
        assert row["startup_gpu_seconds"] == cur.gpu_seconds.get("startup", 0.0)


def test_step_progress_is_downsampled_but_keeps_both_ends() -> None:
    views, _ = views_of(SimConfig(run_id="t", ranks=2, hours=2.0, step_s=1.0, mtbf_s=None, collectives=False))
    (progress,) = views["timeline"]["progress"]
    assert progress["steps_total"] == 7200
    assert len(progress["step"]) <= MAX_POINTS_PER_ATTEMPT
    assert progress["step"][0] == 1 and progress["step"][-1] == 7200
    assert progress["rework_after_step"] is None
    assert len(json.dumps(views)) < 400_000


def test_timeline_pieces_are_binned_when_there_are_too_many() -> None:
    views, _ = views_of(SimConfig(run_id="t", ranks=2, hours=0.5, checkpoint_every=5, checkpoint_s=1.0,
                                  mtbf_s=None), max_segments=100)
    segments = views["timeline"]["segments"]
    assert len(segments) <= 100
    assert all(a["end"] <= b["start"] + 1e-6 for a, b in itertools.pairwise(segments))


def test_straggler_rank_is_found_and_its_compute_excludes_collectives() -> None:
    views, ledger = views_of(SimConfig(run_id="t", ranks=8, hours=0.05, mtbf_s=None, straggler_rank=3,
                                       straggler_factor=1.5))
    ranks = views["ranks"]
    assert ranks["straggler_ranks"] == [3]
    by_rank = {r["rank"]: r for r in ranks["rows"]}
    assert by_rank[3]["median_compute_s"] == pytest.approx(1.5)
    assert by_rank[0]["median_compute_s"] == pytest.approx(1.0)
    assert by_rank[3]["straggler_gpu_seconds"] == pytest.approx(ledger.straggler_gpu_seconds_by_rank[3])
    assert by_rank[3]["host"] == "node000"


def test_heat_map_groups_ranks_and_keeps_the_slowest() -> None:
    views, _ = views_of(SimConfig(run_id="t", ranks=40, hours=0.02, mtbf_s=None, straggler_rank=17),
                        heat_rows=10, heat_cols=8)
    heat = views["ranks"]["heatmap"]
    assert heat["ranks_per_row"] == 4 and len(heat["z"]) == 10 and len(heat["z"][0]) == 8
    assert heat["rank_labels"][4] == "16-19"
    hottest = max(range(10), key=lambda i: max(v for v in heat["z"][i] if v is not None))
    assert hottest == 4


