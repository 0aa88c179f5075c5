"""The ledger laid out on the wall clock (services.analysis.usage): a time range cut out of a run gives exactly the GPU
time spent inside it, category by category, against runs whose intervals the test writes down by hand."""

from __future__ import annotations

import numpy as np
import pytest

from services.analysis.ledger import build_ledger
from services.analysis.provisional import LiveHang, provisional_ledger
from services.analysis.run_data import run_data_from_events
from services.analysis.usage import (
    bucket_width,
    clip_usage,
    pieces_of,
    usage_in_bins,
    usage_matrix,
    usage_of_pieces,
    usage_windows,
    with_interval,
)
from services.schemas.ledger import Ledger
from services.schemas.usage import USAGE_KEYS, Usage
from services.simulate import SimConfig, simulate
from tests.analysis.scenarios import T0, ev, per_rank, steps
from tests.ledger_checks import ledger_of_events

GPUS, WORLD = 8, 6  # two allocated GPUs are never used: idle all along
HOUR = 3600.0


def three_hours() -> list[dict]:  # type: ignore[type-arg]
    """8 GPUs allocated 0-3 h, world 6. Attempt 0: startup 0-600, steps 1-50 at 600-3600 (60 s each), checkpoint of
    step 50 at 3600-3900, steps 51-100 at 3900-6900, stuck until it fails at 7500 (hang). Attempt 1 resumes from
    step 50 (so steps 51-100 of attempt 0 are rework): startup 7500-7800, steps 51-100 at 7800-10800."""
    w = WORLD
    out = [ev("allocation_start", 0, gpus=GPUS), ev("allocation_end", 10800)]
    out += [ev("attempt_start", 0, attempt=0, rank=r, world_size=w, host=f"h{r // 4}") for r in range(w)]
    out += per_rank("resume", 0, w, attempt=0, step=0)
    out += steps(0, w, 1, 50, 600, dt=60.0)
    out += per_rank("checkpoint_start", 3600, w, attempt=0, step=50)
    out += per_rank("checkpoint_end", 3900, w, attempt=0, step=50, ok=True)
    out += steps(0, w, 51, 100, 3900, dt=60.0)
    out += per_rank("attempt_end", 7500, w, attempt=0, reason="failed")
    out += [ev("attempt_start", 7500, attempt=1, rank=r, world_size=w, host=f"h{r // 4}") for r in range(w)]
    out += per_rank("resume", 7500, w, attempt=1, step=50)
    out += steps(1, w, 51, 100, 7800, dt=60.0)
    out += per_rank("attempt_end", 10800, w, attempt=1, reason="completed")
    out.append(ev("run_end", 10800, status="finished"))
    return out


def expected(**gpu_seconds: float) -> dict[str, float]:
    return {key: gpu_seconds.get(key, 0.0) for key in USAGE_KEYS}


def window(ledger: Ledger, start_s: float, end_s: float) -> dict[str, float]:
    assert ledger.usage is not None
    return clip_usage(ledger.usage, T0 + start_s, T0 + end_s)


@pytest.fixture(scope="module")
def run() -> Ledger:
    return ledger_of_events(three_hours())


def test_each_hour_of_the_run_holds_exactly_the_gpu_time_spent_in_it(run: Ledger) -> None:
    w, spare = WORLD, GPUS - WORLD
    assert window(run, 0, HOUR) == pytest.approx(expected(startup=600 * w, productive=3000 * w, idle=HOUR * spare))
    assert window(run, HOUR, 2 * HOUR) == pytest.approx(expected(
        checkpoint=300 * w, rework=3000 * w, hang=300 * w, idle=HOUR * spare))
    assert window(run, 2 * HOUR, 3 * HOUR) == pytest.approx(expected(
        hang=300 * w, startup=300 * w, productive=3000 * w, idle=HOUR * spare))


def test_an_hour_never_holds_more_than_its_gpus_times_an_hour(run: Ledger) -> None:
    for start in np.arange(-1800.0, 10800.0, 450.0):
        assert sum(window(run, start, start + HOUR).values()) <= GPUS * HOUR * (1 + 1e-12)


def test_a_range_that_cuts_through_intervals_takes_only_their_share(run: Ledger) -> None:
    # 3750-4050: the second half of the checkpoint write, the first 150 s of the steps later thrown away
    assert window(run, 3750, 4050) == pytest.approx(expected(checkpoint=150 * WORLD, rework=150 * WORLD,
                                                             idle=300 * (GPUS - WORLD)))
    # the hang alone: attempt 0's last step ended at 6900, it failed at 7500
    assert window(run, 6900, 7500) == pytest.approx(expected(hang=600 * WORLD, idle=600 * (GPUS - WORLD)))


def test_the_whole_life_and_the_buckets_add_up_to_the_ledger(run: Ledger) -> None:
    assert run.usage is not None
    whole = clip_usage(run.usage, None, None)
    assert whole["productive"] == pytest.approx(run.productive_gpu_seconds)
    for key, value in run.waste_gpu_seconds.items():
        assert whole[key] == pytest.approx(value)
    edges = T0 + np.arange(-900.0, 12000.0, 900.0)
    bins = usage_in_bins(run.usage, edges)
    assert bins.sum() == pytest.approx(run.allocated_gpu_seconds)
    hang = bins[:, USAGE_KEYS.index("hang")]
    assert set(np.flatnonzero(hang)) == {8, 9}  # 6900-7500 only: the buckets 6300-7200 and 7200-8100


def test_outside_the_run_there_is_nothing(run: Ledger) -> None:
    assert sum(window(run, -HOUR, 0).values()) == 0.0
    assert sum(window(run, 10800, 10800 + HOUR).values()) == 0.0


def test_straggler_time_stays_inside_the_steps_that_waited() -> None:
    result = simulate(SimConfig(run_id="slow", ranks=8, hours=0.1, mtbf_s=None, straggler_rank=3,
                                straggler_factor=1.5, jitter=0.02, seed=1))
    ledger = build_ledger(run_data_from_events("slow", result.events))
    assert ledger.usage is not None and ledger.waste_gpu_seconds.straggler > 0
    whole = clip_usage(ledger.usage, None, None)
    assert whole["straggler"] == pytest.approx(ledger.waste_gpu_seconds.straggler, rel=1e-9)
    assert whole["productive"] == pytest.approx(ledger.productive_gpu_seconds, rel=1e-9)
    matrix = usage_matrix(ledger.usage)
    straggle, kept = matrix[:, USAGE_KEYS.index("straggler")], matrix[:, USAGE_KEYS.index("productive")]
    assert (matrix >= -1e-9).all()
    assert (straggle[(kept + straggle) <= 0] == 0).all()  # only carved out of kept-step time


def test_a_long_run_is_binned_without_losing_gpu_time() -> None:
    n = 5000
    start = 1_000.0 + np.arange(n) * 10.0
    values = np.zeros((n, len(USAGE_KEYS)))
    values[:, 0] = 10.0 * 4 * (1 + np.arange(n) % 3)  # rates that differ piece to piece: nothing merges
    usage = usage_of_pieces(start, start + 10.0, values, max_pieces=100)
    assert len(usage.start) <= 100 and usage.bin_s is not None
    assert clip_usage(usage, None, None)["productive"] == pytest.approx(values.sum())
    aligned = usage.bin_s
    lo = np.ceil(start[0] / aligned) * aligned
    exact = values[(start >= lo) & (start + 10.0 <= lo + aligned), 0].sum()
    assert clip_usage(usage, lo, lo + aligned)["productive"] == pytest.approx(exact)


def test_a_hung_runs_provisional_hang_is_placed_after_its_last_progress() -> None:
    w = 4
    events = [ev("allocation_start", 0, gpus=w)]
    events += [ev("attempt_start", 0, attempt=0, rank=r, world_size=w) for r in range(w)]
    events += per_rank("resume", 0, w, attempt=0, step=0)
    events += steps(0, w, 1, 100, 10)  # 10-110, then silence
    ledger = ledger_of_events(events)
    assert ledger.status == "running" and ledger.running_tail is not None
    hung = provisional_ledger(ledger, LiveHang(since=T0 + 110), now=T0 + 1110)
    assert hung.usage is not None
    assert clip_usage(hung.usage, None, None)["hang"] == pytest.approx(hung.waste_gpu_seconds.hang)
    assert clip_usage(hung.usage, T0 + 110, T0 + 1110) == pytest.approx(expected(hang=1000 * w))
    assert clip_usage(hung.usage, T0, T0 + 110) == pytest.approx(expected(startup=10 * w, productive=100 * w))


def test_gpus_added_over_a_range_become_a_piece_of_their_own() -> None:
    usage = Usage(start=[0.0], end=[10.0], gpu_seconds={"productive": [40.0]})
    grown = with_interval(usage, 5.0, 20.0, {"idle": 2.0})
    assert grown.start == [0.0, 5.0, 10.0] and grown.end == [5.0, 10.0, 20.0]
    assert clip_usage(grown, None, None) == pytest.approx(expected(productive=40.0, idle=30.0))
    assert clip_usage(grown, 0.0, 5.0) == pytest.approx(expected(productive=20.0))


@pytest.mark.parametrize(("span_s", "width"), [(3600.0, 300.0), (86400.0, 1800.0), (7 * 86400.0, 6 * 3600.0)])
def test_chart_buckets_are_round_widths(span_s: float, width: float) -> None:
    assert bucket_width(span_s, 48) == width


def per_key_bins(usage: Usage, edges: np.ndarray) -> np.ndarray:
    """The bins as usage_in_bins computed them one key at a time before the fleet page needed them fast: the
    reference its one-pass form must equal to the bit."""
    start, end, values = np.asarray(usage.start), np.asarray(usage.end), usage_matrix(usage)
    x = np.column_stack([start, end]).reshape(-1)
    cum = np.cumsum(values, axis=0)
    before = np.vstack([np.zeros((1, values.shape[1])), cum[:-1]])
    finite = np.clip(edges, x[0], x[-1])
    out = np.empty((len(edges) - 1, values.shape[1]))
    for j in range(values.shape[1]):
        out[:, j] = np.diff(np.interp(finite, x, np.column_stack([before[:, j], cum[:, j]]).reshape(-1)))
    return out


def random_usage(rng: np.random.Generator) -> Usage:
    n = int(rng.integers(1, 60))
    lengths = rng.uniform(0.1, 500.0, n) * (rng.random(n) < 0.8)  # some pieces touch, some leave gaps
    gaps = rng.uniform(0.0, 200.0, n) * (rng.random(n) < 0.5)
    start = T0 + rng.uniform(-3000, 3000) + np.cumsum(gaps + np.r_[0.0, lengths[:-1]])
    values = rng.uniform(0.0, 1e4, (n, len(USAGE_KEYS))) * (rng.random(len(USAGE_KEYS)) < 0.5)  # zero keys too
    return usage_of_pieces(start, start + lengths, values)


@pytest.mark.parametrize("seed", range(20))
def test_the_fleet_windows_cut_of_all_runs_at_once_equals_the_per_key_cut_of_each_to_the_bit(seed: int) -> None:
    rng = np.random.default_rng(seed)
    usages = [random_usage(rng) for _ in range(int(rng.integers(1, 40)))]  # some without pieces
    last = max((u.end[-1] for u in usages if u.end), default=T0)
    since = None if seed % 3 == 0 else float(rng.uniform(T0 - 3100, last))
    until = float(rng.uniform(since if since is not None else T0, last + 1000))
    edges = np.sort(rng.uniform(T0 - 3500, last + 500, int(rng.integers(2, 50))))
    if seed % 4 == 1:  # points on the pieces' own ends take the knot's value
        ends = [e for u in usages for e in u.end]
        edges = np.sort(np.r_[edges, rng.choice(ends, min(len(ends), 5), replace=False)])
    sums, bins = usage_windows([pieces_of(u) for u in usages], since, until, edges)
    assert bins.shape == (len(usages), len(edges) - 1, len(USAGE_KEYS))
    for r, usage in enumerate(usages):
        assert dict(zip(USAGE_KEYS, sums[r].tolist(), strict=True)) == clip_usage(usage, since, until)
        reference = per_key_bins(usage, edges) if usage.start else usage_in_bins(usage, edges)
        assert bins[r].tobytes() == reference.tobytes()
        assert usage_in_bins(usage, edges).tobytes() == reference.tobytes()
