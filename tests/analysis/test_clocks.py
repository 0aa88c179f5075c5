"""Clocks that disagree between hosts (issue 30, point 5) and absurd ones (issue 31, point 5): each host's clock
offset is measured from its ranks' step ends and taken out before painting, so the ledger is the truth the simulator
booked on the true clock, whatever the hosts' clocks said (docs/ledger.md, "Clocks")."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

import numpy as np
import pytest

from services.analysis.ledger import build_ledger
from services.analysis.run_data import RunData, run_data_from_events, steps_frame
from services.analysis.step_blocks import summarize_block, summarize_steps
from services.analysis.step_summary import merge_blocks
from services.schemas.ledger import Ledger
from services.simulate import START_TIME, SimConfig, SimResult, simulate
from services.storage.block_codec import block_from_bytes, block_to_bytes
from tests.analysis.test_ledger_matches_simulated_truth import assert_matches_truth
from tests.ledger_checks import assert_partition

# host node001's clock: ahead by 5 s and 60 s and 5 min, behind by 5 s, 30 s and 5 min
OFFSETS = (-300.0, -30.0, -5.0, 5.0, 60.0, 300.0)
YEAR_2000_JAN_2 = datetime.datetime(2000, 1, 2, tzinfo=datetime.UTC).timestamp()


def two_hosts(offset: float, **overrides: Any) -> SimResult:
    """16 ranks on two hosts of 8, synchronous 1 s steps (0.95 s of compute, then a 0.05 s all-reduce), a 1 s
    checkpoint every 20 steps; host node001's clock `offset` seconds ahead."""
    config = {"run_id": "skewed", "ranks": 16, "hours": 0.1, "step_s": 0.95, "comm_s": 0.05, "mtbf_s": None,
              "checkpoint_every": 20, "checkpoint_s": 1.0, "startup_s": 20.0, "seed": 1,
              "clock_offsets": {"node001": offset}, **overrides}
    return simulate(SimConfig(**config))


def summarised(data: RunData) -> RunData:
    """The same run as the collector reads it: its step rows reduced per block (services.analysis.step_blocks)."""
    return dataclasses.replace(data, steps=steps_frame(), step_summary=merge_blocks(summarize_steps(data.steps)))


def both_ways(sim: SimResult) -> list[Ledger]:
    """The run's ledger from every row and from its step blocks (the two must agree)."""
    data = run_data_from_events(sim.config.run_id, sim.events)
    return [build_ledger(data), build_ledger(summarised(data))]


def clocks_of(ledger: Ledger) -> dict[str, float]:
    return {c.host: c.offset_seconds for c in ledger.clocks}


@pytest.mark.parametrize("offset", OFFSETS)
def test_productive_is_the_truth_whatever_host_1s_clock_says(offset: float) -> None:
    """Before: a job step spanned from the first rank's start to the last rank's end, so the skew stretched steps
    across the hosts and over the checkpoints: productive +6.1 % (5 s either way), +9.2 % (60 s or 5 min ahead),
    +10.0 % (30 s or 5 min behind) over the truth."""
    sim = two_hosts(offset)
    for ledger in both_ways(sim):
        assert ledger.productive_gpu_seconds == pytest.approx(sim.truth.productive, rel=0.01)
        assert_matches_truth(ledger, sim.truth, sim.config)
        assert clocks_of(ledger) == pytest.approx({"node000": 0.0, "node001": offset}, abs=1e-3)


@pytest.mark.parametrize("offset", [-30.0, 60.0])
@pytest.mark.parametrize("seed", [2, 4])
def test_failures_restarts_and_kills_on_a_skewed_host_are_booked_as_on_true_clocks(offset: float, seed: int) -> None:
    """Attempts that fail (reported or SIGKILLed), two of them before their first step (their ranks take their
    host's offset from an attempt that measured it), restarts and heart-beats: every category is the truth's."""
    for killed in (False, True):
        sim = two_hosts(offset, hours=0.3, mtbf_s=100.0, seed=seed, killed=killed, heartbeat_s=5.0,
                        end="failed", max_failures=4)
        assert sim.truth.failures == 4
        stepped = {e["attempt"] for e in sim.events if e["kind"] == "steps"}
        assert len({e["attempt"] for e in sim.events if e["kind"] == "attempt_start"} - stepped) == 2
        for ledger in both_ways(sim):
            assert_matches_truth(ledger, sim.truth, sim.config)
            assert clocks_of(ledger) == pytest.approx({"node000": 0.0, "node001": offset}, abs=1e-3)


def test_a_running_run_on_a_skewed_host_ends_where_its_reference_clock_says() -> None:
    sim = two_hosts(60.0, end="running", heartbeat_s=5.0)
    truth = two_hosts(0.0, end="running", heartbeat_s=5.0)
    for skewed, straight in zip(both_ways(sim), both_ways(truth), strict=True):
        assert_matches_truth(skewed, sim.truth, sim.config)
        assert skewed.latest_time == pytest.approx(straight.latest_time)
        assert skewed.running_tail == straight.running_tail


def test_clocks_within_the_tolerance_are_left_as_they_are() -> None:
    """A 20 ms offset is below what step ends can tell from a loop's own jitter (50 ms): not corrected, and the
    stretch it leaves is 20 ms a checkpoint."""
    sim = two_hosts(0.02)
    for ledger in both_ways(sim):
        assert clocks_of(ledger) == {"node000": 0.0, "node001": 0.0}
        assert ledger.productive_gpu_seconds == pytest.approx(sim.truth.productive, rel=0.005)


def test_ranks_of_one_host_that_end_their_steps_apart_are_not_a_clock() -> None:
    """Two ranks on host h; rank 1 ends every step 0.3 s after rank 0 (a loop that is not synchronous): one host
    has one clock, so nothing is moved and the job steps span to rank 1's ends, as before."""
    events: list[dict[str, Any]] = []
    for rank in (0, 1):
        events.append({"event_id": f"s{rank}", "run_id": "r", "kind": "attempt_start", "time": 100.0 + START_TIME,
                       "attempt": 0, "rank": rank, "world_size": 2, "host": "h"})
        events.append({"event_id": f"st{rank}", "run_id": "r", "kind": "steps", "time": START_TIME + 200.0,
                       "attempt": 0, "rank": rank, "step": list(range(1, 11)),
                       "start": [START_TIME + 100.0 + 10 * k for k in range(10)],
                       "end": [START_TIME + 101.0 + 10 * k + 0.3 * rank for k in range(10)]})
        events.append({"event_id": f"e{rank}", "run_id": "r", "kind": "attempt_end", "time": START_TIME + 200.0,
                       "attempt": 0, "rank": rank, "reason": "completed"})
    data = run_data_from_events("r", events)
    for ledger in (build_ledger(data), build_ledger(summarised(data))):
        assert clocks_of(ledger) == {"h": 0.0}
        assert ledger.productive_gpu_seconds == pytest.approx(10 * 1.3 * 2)


def test_a_rank_whose_clock_was_reset_to_2000_keeps_a_two_minute_run_two_minutes_long() -> None:
    """Issue 31: one rank reset to 2000-01-02 gave a 2-minute run without allocation events 3.4e9 allocated
    GPU-s (its attempt spanned 26 years). Each rank on its own host; the run with true clocks is the truth."""
    def run(offset: float) -> list[dict[str, Any]]:
        sim = simulate(SimConfig(run_id="reset", ranks=4, ranks_per_host=1, hours=100 / 3600, step_s=1.0,
                                 mtbf_s=None, startup_s=10.0, checkpoint_every=50, checkpoint_s=2.0, seed=3,
                                 clock_offsets={"node003": offset}))
        return [e for e in sim.events if not e["kind"].startswith(("allocation_", "run_submitted"))]

    skew = YEAR_2000_JAN_2 - START_TIME
    truth = build_ledger(run_data_from_events("reset", run(0.0)))
    data = run_data_from_events("reset", run(skew))
    for ledger in (build_ledger(data), build_ledger(summarised(data))):
        assert_partition(ledger)
        assert ledger.allocated_gpu_seconds == pytest.approx(truth.allocated_gpu_seconds, rel=1e-9)
        assert ledger.allocated_gpu_seconds < 4 * 200
        assert ledger.productive_gpu_seconds == pytest.approx(truth.productive_gpu_seconds, rel=1e-6)
        assert dict(ledger.waste_gpu_seconds.items()) == pytest.approx(dict(truth.waste_gpu_seconds.items()),
                                                                       abs=1e-4)
        assert ledger.first_time == pytest.approx(truth.first_time)
        assert clocks_of(ledger)["node003"] == pytest.approx(skew, abs=1e-3)


def test_a_rank_15_minutes_ahead_no_longer_hides_a_hang_and_its_restart() -> None:
    """Issue 31: one rank 15 min ahead hid a failure (a 600 s hang and a restart): goodput 0.988 instead of 0.176,
    hang and rework 0. Its clock is measured in both attempts and taken out."""
    sim = simulate(SimConfig(run_id="hidden", ranks=4, ranks_per_host=1, hours=200 / 3600, step_s=1.0, mtbf_s=None,
                             startup_s=10.0, checkpoint_every=50, checkpoint_s=2.0, hang_at_step=120, hang_s=600.0,
                             seed=4, clock_offsets={"node002": 900.0}))
    for ledger in both_ways(sim):
        assert_matches_truth(ledger, sim.truth, sim.config)
        assert ledger.waste_gpu_seconds.hang == pytest.approx(4 * 600.0)  # the hang, to the collective timeout
        assert ledger.waste_gpu_seconds.rework == pytest.approx(4 * 19.95)  # steps 101-119 of attempt 0, redone
        assert ledger.goodput == pytest.approx(sim.truth.productive / sim.truth.allocated)
        assert ledger.goodput is not None and ledger.goodput < 0.3


def test_a_rank_20_hours_ahead_gives_a_10_step_run_its_20_productive_gpu_seconds() -> None:
    """Issue 31: a rank 20 h ahead gave a 10-step run of 2 ranks 144,020 productive GPU-s."""
    sim = simulate(SimConfig(run_id="ahead", ranks=2, ranks_per_host=1, hours=10 / 3600, step_s=1.0, comm_s=0.0,
                             mtbf_s=None, startup_s=5.0, checkpoint_every=100, seed=6,
                             clock_offsets={"node001": 20 * 3600.0}))
    for ledger in both_ways(sim):
        assert ledger.productive_gpu_seconds == pytest.approx(20.0)
        assert_matches_truth(ledger, sim.truth, sim.config)


def test_no_figure_is_negative_nor_beyond_the_allocation_whatever_the_clocks() -> None:
    """Hosts ahead and behind by minutes to decades at once, with failures: the partition holds, every category is
    the truth's."""
    offsets = {"node000": 0.0, "node001": -45.0, "node002": 7 * 86400.0, "node003": YEAR_2000_JAN_2 - START_TIME}
    sim = simulate(SimConfig(run_id="wild", ranks=16, ranks_per_host=4, hours=0.2, mtbf_s=200.0, seed=8,
                             checkpoint_every=30, checkpoint_s=2.0, end="failed", max_failures=3,
                             clock_offsets=offsets, heartbeat_s=5.0))
    for ledger in both_ways(sim):
        assert_matches_truth(ledger, sim.truth, sim.config)
        assert all(v >= 0 for v in ledger.waste_gpu_seconds.model_dump().values())
        assert ledger.productive_gpu_seconds <= ledger.allocated_gpu_seconds
        assert clocks_of(ledger) == pytest.approx(offsets, abs=1e-3)


def test_a_block_of_two_clocks_reads_back_from_its_bytes() -> None:
    rng = np.random.default_rng(1)
    rank = np.repeat(np.arange(6), 40)
    step = np.tile(np.arange(40) + 128, 6)
    end = START_TIME + np.tile(np.arange(40, dtype=np.float64), 6) + rng.uniform(0, 1e-3, 240) + (rank >= 3) * 7.5
    block = summarize_block(0, 1, rank, step, end - 0.9, end, np.full(240, 0.05))
    assert len(block.clocks.deviation) == 2
    back = block_from_bytes(block_to_bytes(block)).clocks
    for f in dataclasses.fields(block.clocks):
        np.testing.assert_array_equal(getattr(back, f.name), getattr(block.clocks, f.name), err_msg=f.name)


def test_a_host_off_by_a_second_or_more_is_a_finding_naming_it_and_its_ntp() -> None:
    from services.analysis.advice import AdviceInput
    from services.reports.advice import run_advice
    from services.schemas.clocks import HostClock

    def clock_advice(ledger: Ledger, collector: tuple[HostClock, ...] = ()) -> list[str]:
        advice = run_advice(AdviceInput(ledger=ledger, collector_clocks=collector))
        return [r.wording for r in advice.recommendations if r.code == "clock_offset"]

    (ahead,) = clock_advice(both_ways(two_hosts(60.0))[1])
    assert ahead.startswith("Host node001's clock is 1 min 00 s ahead of the run's reference clock (node000)")
    assert "Check NTP on node001" in ahead
    (behind,) = clock_advice(both_ways(two_hosts(-5.0))[1])
    assert "node001's clock is 5.0 s behind the run's reference clock" in behind
    in_step = both_ways(two_hosts(0.0))[1]
    assert clock_advice(in_step) == []
    assert clock_advice(in_step, (HostClock(host="node000", offset_seconds=0.4, attempt=0, ranks=8),)) == []
    (collector,) = clock_advice(in_step, (HostClock(host="node000", offset_seconds=-7200.0, attempt=0, ranks=8),))
    assert collector.startswith("Host node000's clock is 2 h 00 min behind the collector's")


def test_a_block_that_only_the_skewed_hosts_ranks_reached_is_put_on_the_attempts_clock() -> None:
    """Steps from 128 on (a block of their own) reported by host node001's ranks alone, as when host node000's
    ranks died before sending them: the block has no rank of the reference clock, and is anchored by the offsets its
    ranks had in the rest of the attempt. The same run on true clocks is the truth."""
    def cut(offset: float) -> list[dict[str, Any]]:
        events = two_hosts(offset, hours=131 / 3600, checkpoint_every=200).events
        out = []
        for e in events:
            if e["kind"] == "steps" and e["rank"] < 8:
                keep = [i for i, s in enumerate(e["step"]) if s < 128]
                e = {**e, **{k: [e[k][i] for i in keep] for k in ("step", "start", "end", "loss", "lr", "comm")}}
            out.append(e)
        return out

    truth = build_ledger(run_data_from_events("skewed", cut(0.0)))
    data = run_data_from_events("skewed", cut(300.0))
    for ledger in (build_ledger(data), build_ledger(summarised(data))):
        assert ledger.steps.furthest == 138
        assert ledger.productive_gpu_seconds == pytest.approx(truth.productive_gpu_seconds, rel=1e-9)
        assert dict(ledger.waste_gpu_seconds.items()) == pytest.approx(dict(truth.waste_gpu_seconds.items()),
                                                                       abs=1e-3)
        assert ledger.latest_time == pytest.approx(truth.latest_time, abs=1e-3)
