"""The provisional hang overlay (services.analysis.provisional) on small hand-built running runs: the identity
stays exact, the hang grows with the clock, and it disappears once the attempt has ended."""

from __future__ import annotations

from typing import Any

import pytest

from services.analysis.ledger import build_ledger
from services.analysis.provisional import LiveHang, provisional_ledger
from services.analysis.run_data import run_data_from_events
from services.analysis.run_figures import (
    ListedFigures,
    RunFigures,
    figures_of,
    listed_figures,
    provisional_figures,
    usage_bytes,
    usage_from_bytes,
)
from services.schemas.ledger import Ledger
from tests.analysis.scenarios import T0, ev, per_rank, steps
from tests.ledger_checks import assert_partition
from tests.live_database import LiveDatabase

W = 2


def hung_run(gpus: int = W, *, until: float = 40.0) -> list[dict[str, Any]]:
    """World 2, allocation open from 0. Steps 1-20 from 5 to 25, then no progress; the ranks' other events
    (client stats) go on until `until`."""
    out = [ev("allocation_start", 0, gpus=gpus)]
    out += [ev("attempt_start", 0, attempt=0, rank=r, world_size=W, host="h0") for r in range(W)]
    out += per_rank("resume", 0, W, attempt=0, step=0)
    out += steps(0, W, 1, 20, 5)
    out += per_rank("client_stats", until, W, attempt=0)
    return out


def ledger_of(events: list[dict[str, Any]]) -> Ledger:
    return build_ledger(run_data_from_events("s1", events))


def test_the_time_since_the_last_step_moves_from_idle_to_hang_and_the_allocation_grows_to_now() -> None:
    stored = ledger_of(hung_run())
    assert stored.waste_gpu_seconds.idle == pytest.approx(15 * W)  # 25 -> 40, nothing claims it yet
    assert stored.running_tail is not None
    assert stored.running_tail.model_dump() == {"since": T0 + 25, "until": T0 + 40, "gpus": W, "allocated_gpus": W,
                                                "grows": True}
    now = T0 + 100
    out = provisional_ledger(stored, LiveHang(since=T0 + 25), now)
    assert_partition(out)
    assert out.waste_gpu_seconds.hang == pytest.approx(75 * W)  # 25 -> 100
    assert out.waste_gpu_seconds.idle == pytest.approx(0.0)
    assert out.allocated_gpu_seconds == pytest.approx(100 * W)
    assert out.productive_gpu_seconds == stored.productive_gpu_seconds == pytest.approx(20 * W)
    assert out.goodput == pytest.approx(0.2)
    assert out.provisional is not None and out.provisional.model_dump() == pytest.approx({
        "hang_gpu_seconds": 75 * W, "since": T0 + 25, "as_of": now, "from_idle_gpu_seconds": 15 * W,
        "added_allocated_gpu_seconds": 60 * W})
    assert out.attempts[-1].gpu_seconds["hang"] == pytest.approx(75 * W)
    assert out.allocations[-1].end == now
    assert stored.provisional is None and stored.waste_gpu_seconds.hang == 0.0  # the input is unchanged


def test_the_provisional_hang_grows_with_the_clock_by_the_jobs_gpus() -> None:
    stored = ledger_of(hung_run())
    hang = LiveHang(since=T0 + 25)
    first = provisional_ledger(stored, hang, T0 + 100)
    later = provisional_ledger(stored, hang, T0 + 130)
    assert first.provisional is not None and later.provisional is not None
    assert later.provisional.hang_gpu_seconds - first.provisional.hang_gpu_seconds == pytest.approx(30 * W)
    assert later.allocated_gpu_seconds - first.allocated_gpu_seconds == pytest.approx(30 * W)
    assert_partition(later)


def test_allocated_gpus_beyond_the_world_stay_idle() -> None:
    stored = ledger_of(hung_run(gpus=8))
    out = provisional_ledger(stored, LiveHang(since=T0 + 25), T0 + 100)
    assert_partition(out)
    assert out.waste_gpu_seconds.hang == pytest.approx(75 * W)
    assert out.allocated_gpu_seconds == pytest.approx(100 * 8)
    assert out.waste_gpu_seconds.idle == pytest.approx(100 * (8 - W))  # the GPUs no rank uses


def test_a_ledger_older_than_the_last_progress_keeps_the_unknown_stretch_idle() -> None:
    stored = ledger_of(hung_run())  # ends at 40; progress was seen at 60 (events the ledger does not have yet)
    out = provisional_ledger(stored, LiveHang(since=T0 + 60), T0 + 100)
    assert_partition(out)
    assert out.waste_gpu_seconds.hang == pytest.approx(40 * W)  # 60 -> 100 only
    assert out.waste_gpu_seconds.idle == pytest.approx((15 + 20) * W)


def test_nothing_changes_when_the_run_is_not_hung_or_not_running() -> None:
    stored = ledger_of(hung_run())
    assert provisional_ledger(stored, None, T0 + 100) == stored.model_copy(update={"provisional": None})
    failed = ledger_of([*hung_run(), *per_rank("attempt_end", 90, W, attempt=0, reason="failed"),
                        ev("run_end", 90, status="failed")])
    unchanged = failed.model_copy(update={"provisional": None})
    assert provisional_ledger(failed, LiveHang(since=T0 + 25), T0 + 100) == unchanged


def test_when_the_attempt_ends_the_final_ledger_books_what_the_provisional_one_showed() -> None:
    """Hung from 25; detected and torn down at 90 (attempt_end failed), the launcher's allocation_end at 120."""
    hung = ledger_of(hung_run())
    provisional = provisional_ledger(hung, LiveHang(since=T0 + 25), T0 + 120)
    final = ledger_of([*hung_run(), *per_rank("attempt_end", 90, W, attempt=0, reason="failed"),
                       ev("allocation_end", 120), ev("run_end", 120, status="failed")])
    assert_partition(final)
    assert final.running_tail is None
    assert final.waste_gpu_seconds.hang == pytest.approx(provisional.waste_gpu_seconds.hang)
    assert final.allocated_gpu_seconds == pytest.approx(provisional.allocated_gpu_seconds)


def test_a_hung_run_found_by_live_detection_gets_its_hang_from_its_last_step(live_db: LiveDatabase) -> None:
    events = hung_run()
    live = live_db.store(events).status(T0 + 100)
    assert live.hung and live.last_progress_time == pytest.approx(T0 + 25)
    assert live.last_progress_time is not None
    out = provisional_ledger(ledger_of(events), LiveHang(since=live.last_progress_time), live.server_time)
    assert out.provisional is not None
    assert out.provisional.hang_gpu_seconds == pytest.approx(75 * W)
    assert_partition(out)


def test_a_ledger_stored_before_running_tails_existed_is_left_as_it_is() -> None:
    stored = ledger_of(hung_run()).model_copy(update={"running_tail": None})
    unchanged = stored.model_copy(update={"provisional": None})
    assert provisional_ledger(stored, LiveHang(since=T0 + 25), T0 + 100) == unchanged


@pytest.mark.parametrize(("gpus", "since", "now", "clock_offset_s"), [
    (W, 25.0, 100.0, 0.0),  # the tail moves to hang and the allocation grows to now
    (W + 2, 25.0, 100.0, 0.0),  # GPUs beyond the world stay idle
    (W, 60.0, 100.0, 0.0),  # progress seen after the stored ledger's end
    (W, 25.0, 30.0, 0.0),  # now inside the stored tail: only part of it moves
    (W, 25.0, 100.0, -7.5),  # the run's clock behind the collector's
    (W, 200.0, 100.0, 0.0),  # nothing to book
])
def test_the_run_lists_hang_booked_on_the_stored_figures_equals_the_whole_ledgers_to_the_bit(
        gpus: int, since: float, now: float, clock_offset_s: float) -> None:
    stored = ledger_of(hung_run(gpus))
    hang = LiveHang(since=T0 + since, clock_offset_s=clock_offset_s)
    expected = listed_figures(provisional_ledger(stored, hang, T0 + now))
    # the figures as the lists read them back: stored JSON and usage bytes, not the ledger
    figures = RunFigures.model_validate_json(figures_of(stored).model_dump_json())
    assert figures.knows_running_tail
    got = provisional_figures(ListedFigures(figures, usage_from_bytes(figures, usage_bytes(stored))), hang, T0 + now)
    assert got.figures == expected.figures
    assert got.usage is not None and expected.usage is not None
    for name in ("start", "end", "values"):  # the same doubles, not merely close
        assert getattr(got.usage, name).tobytes() == getattr(expected.usage, name).tobytes()
