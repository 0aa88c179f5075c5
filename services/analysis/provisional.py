"""Provisional hang: a hung running run's ledger as it stands now, before its attempt has ended.

The stored ledger of a running run books the time after its last step as idle (nothing claims it yet) and ends
at the run's latest event. While live detection (services.analysis.live) calls the run hung, that time is hang:
the job holds its GPUs and makes no progress. `provisional_ledger` overlays it on the stored ledger at read
time, without a new analysis:

- the ledger's unclaimed tail after the last progress (`running_tail`, idle so far) moves from idle to hang, on
  the GPUs the last attempt's claims count on;
- when the allocation grows with time (open, or derived from the attempts), it grows to `now`: the new time is
  allocated, hang from the last progress on (idle before it, when the stored ledger predates the progress; the
  allocated GPUs beyond the world size stay idle).

`productive + sum(waste) == allocated` holds in the result as in the input. The result carries a
`provisional` block (hang GPU-seconds it added, since, as_of); once the attempt ends, the rebuilt ledger claims
the time itself (a failed attempt's hang and teardown) and the run is no longer hung, so the overlay vanishes.
Pure: the caller passes `now`.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.analysis.usage import with_interval
from services.schemas.ledger import Ledger, ProvisionalHang, RunningTail, WasteBreakdown, goodput_ratio
from services.schemas.usage import Usage

RUNNING = "running"


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveHang:
    """What live detection says of a run it calls hung: no progress since `since` (epoch seconds on the collector's
    clock); `clock_offset_s`: the run's own clock minus the collector's, to book the hang on the ledger's clock."""

    since: float
    clock_offset_s: float = 0.0


@dataclass(frozen=True, slots=True)
class HangOverlay:
    """What the provisional hang adds to a ledger whose running tail is `tail` (on the ledger's clock from `now` on),
    for both the whole ledger and the run lists' figures (services.analysis.run_figures)."""

    tail: RunningTail
    hang: LiveHang  # on the ledger's clock
    now: float  # on the ledger's clock
    start: float
    moved: float  # painted already: idle -> hang
    added_wall: float
    added_hang: float
    added_alloc: float
    block: ProvisionalHang

    @property
    def total_hang(self) -> float:
        return self.moved + self.added_hang

    def waste(self, waste: WasteBreakdown) -> WasteBreakdown:
        return waste.model_copy(update={"hang": waste.hang + self.total_hang,
                                        "idle": waste.idle - self.moved + (self.added_alloc - self.added_hang)})

    def usage(self, usage: Usage) -> Usage:
        return _provisional_usage(usage, self.tail, self.hang, self.now, start=self.start, added_wall=self.added_wall)


def hang_overlay(status: str, tail: RunningTail | None, hang: LiveHang | None, now: float) -> HangOverlay | None:
    """The provisional hang of a hung running run up to `now`; None when the run is not running, not hung, its
    ledger has no running tail (a ledger stored before there was one), or nothing would change."""
    if hang is None or status != RUNNING or tail is None:
        return None
    as_of, reported_since = now, hang.since
    # on the ledger's clock from here on: the run's times are its own, `now` and `since` the collector's
    now, hang = now + hang.clock_offset_s, LiveHang(since=hang.since + hang.clock_offset_s)
    gpus, allocated_gpus = float(tail.gpus), float(tail.allocated_gpus)
    start = max(tail.since, hang.since)
    moved = max(tail.until - start, 0.0) * gpus
    added_wall = max(now - tail.until, 0.0) if tail.grows else 0.0
    added_hang = max(now - max(tail.until, hang.since), 0.0) * gpus if added_wall > 0 else 0.0
    added_alloc = added_wall * allocated_gpus
    if moved + added_hang <= 0 and added_alloc <= 0:
        return None
    block = ProvisionalHang(hang_gpu_seconds=moved + added_hang, since=float(reported_since), as_of=float(as_of),
                            from_idle_gpu_seconds=moved, added_allocated_gpu_seconds=added_alloc)
    return HangOverlay(tail=tail, hang=hang, now=now, start=start, moved=moved, added_wall=added_wall,
                       added_hang=added_hang, added_alloc=added_alloc, block=block)


def provisional_ledger(ledger: Ledger, hang: LiveHang | None, now: float) -> Ledger:
    """The ledger with the provisional hang of a hung running run booked up to `now`; the ledger itself (with
    `provisional: None`) when the run is not running, not hung, or its ledger has no running tail (a ledger
    stored before there was one)."""
    overlay = hang_overlay(ledger.status, ledger.running_tail, hang, now)
    if overlay is None:
        return ledger.model_copy(update={"provisional": None})
    allocated = ledger.allocated_gpu_seconds + overlay.added_alloc
    update: dict[str, object] = {
        "waste_gpu_seconds": overlay.waste(ledger.waste_gpu_seconds),
        "allocated_gpu_seconds": allocated,
        "goodput": goodput_ratio(ledger.productive_gpu_seconds, allocated),
        "allocated_wall_seconds": ledger.allocated_wall_seconds + overlay.added_wall,
        "provisional": overlay.block,
    }
    now, tail = overlay.now, overlay.tail
    if overlay.added_wall > 0:
        if ledger.allocations:
            last = max(range(len(ledger.allocations)),
                       key=lambda i: (ledger.allocations[i].end, ledger.allocations[i].start))
            allocations = list(ledger.allocations)
            allocations[last] = allocations[last].model_copy(update={"end": float(now)})
            update["allocations"] = allocations
        update["running_tail"] = RunningTail(**{**tail.model_dump(), "until": float(now)})
    if ledger.usage is not None:
        update["usage"] = overlay.usage(ledger.usage)
    if ledger.attempts and overlay.total_hang > 0:
        attempts = list(ledger.attempts)
        booked = attempts[-1].gpu_seconds
        attempts[-1] = attempts[-1].model_copy(update={"gpu_seconds": {**booked, "hang": booked.get("hang", 0.0)
                                                                       + overlay.total_hang}})
        update["attempts"] = attempts
    return ledger.model_copy(update=update)


def _provisional_usage(usage: Usage, tail: RunningTail, hang: LiveHang, now: float, *, start: float,
                       added_wall: float) -> Usage:
    """The ledger's Usage with the same overlay, where it happened: idle -> hang over [start, tail.until) on the
    tail's GPUs; the time allocated since (to `now`) idle until the hang began, hang on the tail's GPUs after."""
    gpus, allocated_gpus = float(tail.gpus), float(tail.allocated_gpus)
    usage = with_interval(usage, start, tail.until, {"idle": -gpus, "hang": gpus})
    if added_wall > 0:
        hung_from = max(tail.until, hang.since)
        usage = with_interval(usage, tail.until, hung_from, {"idle": allocated_gpus})
        usage = with_interval(usage, hung_from, now, {"hang": gpus, "idle": allocated_gpus - gpus})
    return usage
