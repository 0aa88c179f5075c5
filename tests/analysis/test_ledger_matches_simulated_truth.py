"""Property: for any simulated job, the ledger equals the truth the simulator booked while simulating."""

from __future__ import annotations

import dataclasses
import os
import random
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.analysis.ledger import build_ledger
from services.analysis.run_data import run_data_from_events
from services.schemas.ledger import Ledger
from services.simulate import START_TIME, SimConfig, Truth, simulate
from tests.ledger_checks import assert_partition


def assert_matches_truth(ledger: Ledger, truth: Truth, truth_config: SimConfig | None = None) -> None:
    got = ledger.model_dump(mode="json")
    want = truth.as_dict()
    # Times are epoch floats (one ulp ~ 2.4e-7 s in 2026): every step's duration and time inside collectives is
    # a difference of two of them, so per-step costs summed over many steps (straggler) can drift by a couple
    # of ulps per step and GPU; the tolerance is that, or 1e-7 of the allocation, whichever is larger.
    gpus = (truth_config.gpus or truth_config.ranks) if truth_config is not None else 1
    steps = want["steps"]["kept"] + want["steps"]["reworked"]
    ulps = 2 * float(np.spacing(START_TIME + 1e7)) * steps * gpus
    scale = max(want["allocated_gpu_seconds"], 1.0)
    tol = max(1e-7 * scale, ulps)
    assert got["allocated_gpu_seconds"] == pytest.approx(want["allocated_gpu_seconds"], rel=1e-9)
    assert got["productive_gpu_seconds"] == pytest.approx(want["productive_gpu_seconds"], abs=tol)
    for key, value in want["waste_gpu_seconds"].items():
        assert got["waste_gpu_seconds"][key] == pytest.approx(value, abs=tol), key
    assert got["queue_seconds"] == pytest.approx(want["queue_seconds"])
    assert got["at_risk_gpu_seconds"] == pytest.approx(want["at_risk_gpu_seconds"], abs=tol)
    assert got["restarts"] == want["restarts"]
    assert got["failures"] == want["failures"]
    assert got["status"] == want["status"]
    assert got["steps"]["kept"] == want["steps"]["kept"]
    assert got["steps"]["reworked"] == want["steps"]["reworked"]
    assert [a["resume_step"] for a in got["attempts"]] == want["resume_steps"][: len(got["attempts"])]
    by_rank_got, by_rank_want = got["straggler_gpu_seconds_by_rank"], want["straggler_gpu_seconds_by_rank"]
    assert sum(by_rank_got.values()) == pytest.approx(got["waste_gpu_seconds"]["straggler"], abs=tol)
    # Which rank was slowest is exact only where ranks differ by more than epoch-second float resolution
    # (~1e-7 s): jitter-only near-ties may go either way, a deliberately slow rank never does.
    c = truth_config
    if (c is not None and c.straggler_rank is not None and c.straggler_factor > 1 + 2 * c.jitter + 0.01
            and (c.jitter == 0 or c.straggler_prob >= 1)):
        rank = str(c.straggler_rank)
        assert by_rank_got.get(rank, 0.0) == pytest.approx(by_rank_want.get(rank, 0.0), abs=tol)
    assert_partition(got)


configs = st.builds(
    SimConfig,
    ranks=st.integers(1, 12),
    gpus=st.one_of(st.none(), st.integers(1, 16)),
    hours=st.floats(0.01, 0.15),
    step_s=st.floats(0.2, 3.0),
    comm_s=st.floats(0.0, 0.2),
    mtbf_s=st.one_of(st.none(), st.floats(60.0, 2000.0)),
    checkpoint_every=st.integers(1, 200),
    checkpoint_s=st.floats(0.5, 30.0),
    startup_s=st.floats(1.0, 120.0),
    relaunch_s=st.floats(0.0, 20.0),
    detect_s=st.floats(0.0, 120.0),
    hang_at_step=st.one_of(st.none(), st.integers(1, 300)),
    hang_s=st.floats(10.0, 900.0),
    straggler_rank=st.one_of(st.none(), st.just(0)),
    straggler_factor=st.floats(1.0, 3.0),
    straggler_prob=st.floats(0.0, 1.0),
    jitter=st.floats(0.0, 0.3),
    queue_s=st.floats(0.0, 600.0),
    end=st.sampled_from(["finished", "failed", "running"]),
    max_failures=st.integers(1, 8),
    collectives=st.booleans(),
    comm_inline=st.booleans(),
    seed=st.integers(0, 2**31),
    records_per_rank=st.integers(1, 500),
    killed=st.booleans(),
    heartbeat_s=st.one_of(st.none(), st.floats(2.0, 60.0)),
)


@settings(max_examples=int(os.environ.get("GOODPUT_HYPOTHESIS_EXAMPLES", "60")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(config=configs)
def test_ledger_equals_the_simulators_truth(config: SimConfig) -> None:
    if config.gpus is not None and config.gpus < 1:
        return
    result = simulate(config)
    ledger = build_ledger(run_data_from_events(config.run_id, result.events))
    assert_matches_truth(ledger, result.truth, config)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), mtbf=st.floats(100.0, 1000.0))
def test_shuffled_and_replayed_events_give_the_same_ledger(seed: int, mtbf: float) -> None:
    result = simulate(SimConfig(hours=0.1, mtbf_s=mtbf, seed=seed, straggler_rank=1, jitter=0.1))
    baseline = build_ledger(run_data_from_events(result.config.run_id, result.events)).model_dump(mode="json")
    events = result.events[:]
    rng = random.Random(seed)
    rng.shuffle(events)
    # a replay regroups steps under new ids: split some compact records in two
    replayed: list[dict[str, Any]] = []
    for e in events[: len(events) // 3]:
        if e["kind"] == "steps" and len(e["step"]) > 1:
            half = len(e["step"]) // 2
            columns = [k for k in ("step", "start", "end", "loss", "lr", "comm") if k in e]
            replayed.append({**e, "event_id": e["event_id"] + "/a", **{k: e[k][:half] for k in columns}})
    again = build_ledger(run_data_from_events(result.config.run_id, events + replayed)).model_dump(mode="json")
    assert again == baseline


@pytest.mark.parametrize("heartbeat_s", [None, 5.0])
@pytest.mark.parametrize("end", ["finished", "failed"])
def test_killed_attempts_book_hang_to_their_last_event_and_the_rest_as_the_restarts_startup(
    heartbeat_s: float | None, end: str
) -> None:
    # hang_s not a multiple of the interval: ranks heart-beat from an interval after their last step, and a beat
    # landing on the teardown itself would leave nothing to move
    config = SimConfig(ranks=4, hours=0.1, mtbf_s=300.0, detect_s=40.0, hang_at_step=30, hang_s=118.0, seed=1,
                       killed=True, heartbeat_s=heartbeat_s, end=end, max_failures=3)
    result = simulate(config)
    assert not [e for e in result.events if e["kind"] == "attempt_end" and e["reason"] == "failed"]
    assert result.truth.failures == 3
    ledger = build_ledger(run_data_from_events(config.run_id, result.events))
    assert_matches_truth(ledger, result.truth, config)
    killed, reported = result.truth.waste, simulate(dataclasses.replace(config, killed=False)).truth.waste
    # the same job reporting its failures: detection moved from hang to the restart's startup, nothing else
    moved = reported["hang"] - killed["hang"]
    assert killed["startup"] - reported["startup"] == pytest.approx(moved)
    restarts = 3 if end == "finished" else 2  # a run that failed for good keeps its last failure's hang
    if heartbeat_s is None:
        assert moved > 0 and (end == "failed" or killed["hang"] == 0)
    else:  # heart-beating while stuck: hang up to the last beat, less than one interval per restart moved
        assert 0 < moved < restarts * heartbeat_s * config.ranks
