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

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

HANG = "hang"
IDLE = "idle"
RUNNING = "running"


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveHang:
    """What live detection says of a run it calls hung: no progress since `since` (epoch seconds)."""

    since: float


def provisional_ledger(ledger: Mapping[str, Any], hang: LiveHang | None, now: float) -> dict[str, Any]:
    """The ledger with the provisional hang of a hung running run booked up to `now`; an unchanged copy (with
    `provisional: None`) when the run is not running, not hung, or its ledger has no running tail (a ledger
    stored before there was one)."""
    out = copy.deepcopy(dict(ledger))
    out["provisional"] = None
    tail = ledger.get("running_tail")
    if hang is None or ledger.get("status") != RUNNING or not tail:
        return out
    since, until = float(tail["since"]), float(tail["until"])
    gpus, allocated_gpus = float(tail["gpus"]), float(tail["allocated_gpus"])
    start = max(since, hang.since)
    moved = max(until - start, 0.0) * gpus  # painted already: idle -> hang
    added_wall = max(now - until, 0.0) if tail.get("grows") else 0.0
    added_hang = max(now - max(until, hang.since), 0.0) * gpus if added_wall > 0 else 0.0
    added_alloc = added_wall * allocated_gpus
    total_hang = moved + added_hang
    if total_hang <= 0 and added_alloc <= 0:
        return out

    waste = out["waste_gpu_seconds"]
    waste[HANG] = float(waste.get(HANG, 0.0)) + total_hang
    waste[IDLE] = float(waste.get(IDLE, 0.0)) - moved + (added_alloc - added_hang)
    allocated = float(out["allocated_gpu_seconds"]) + added_alloc
    out["allocated_gpu_seconds"] = allocated
    out["goodput"] = float(out["productive_gpu_seconds"]) / allocated if allocated > 0 else None
    out["allocated_wall_seconds"] = float(out.get("allocated_wall_seconds") or 0.0) + added_wall
    if added_wall > 0:
        allocations = out.get("allocations") or []
        if allocations:
            last = max(allocations, key=lambda a: (a["end"], a["start"]))
            last["end"] = float(now)
        out["running_tail"] = {**tail, "until": float(now)}
    attempts = out.get("attempts") or []
    if attempts and total_hang > 0:
        per_attempt = attempts[-1].setdefault("gpu_seconds", {})
        per_attempt[HANG] = float(per_attempt.get(HANG, 0.0)) + total_hang
    out["provisional"] = {
        "hang_gpu_seconds": total_hang, "since": float(hang.since), "as_of": float(now),
        "from_idle_gpu_seconds": moved, "added_allocated_gpu_seconds": added_alloc,
    }
    return out
