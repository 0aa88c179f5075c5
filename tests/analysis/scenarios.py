"""Hand-built event streams with ledgers worked out by hand."""

from __future__ import annotations

from itertools import count
from typing import Any

_ids = count()
T0 = 1_700_000_000.0  # scenario times are seconds after T0 (the API accepts only plausible epochs)


def ev(kind: str, time: float, run_id: str = "s1", **fields: Any) -> dict[str, Any]:
    return {"event_id": f"e{next(_ids)}", "run_id": run_id, "kind": kind, "time": T0 + float(time), **fields}


def steps(attempt: int, world: int, first: int, last: int, t0: float, dt: float = 1.0,
          run_id: str = "s1") -> list[dict[str, Any]]:
    """Compact step records, one per rank: steps first..last, each dt long, back to back from t0."""
    n = last - first + 1
    starts = [T0 + t0 + i * dt for i in range(n)]
    return [
        ev("steps", t0 + n * dt, run_id=run_id, attempt=attempt, rank=r, step=list(range(first, last + 1)),
           start=starts, end=[s + dt for s in starts])
        for r in range(world)
    ]


def per_rank(kind: str, time: float, world: int, run_id: str = "s1", **fields: Any) -> list[dict[str, Any]]:
    return [ev(kind, time, run_id=run_id, rank=r, **fields) for r in range(world)]


def attempt_events(attempt: int, world: int, start: float, *, resumed: float | None = None, last_step: int = 0,
                   steps_from: float = 0.0, end: float | None = None, reason: str = "completed", run_id: str = "s1",
                   **start_fields: Any) -> list[dict[str, Any]]:
    """Every rank's events of one attempt of a world of `world`, in this order: attempt_start at `start` (with
    `start_fields`, e.g. host); a resume from step 0 at `resumed`; steps 1..`last_step` back to back, 1 s each, from
    `steps_from`; attempt_end for `reason` at `end`. A part not given (None, no last step) is left out."""
    events = [ev("attempt_start", start, run_id=run_id, attempt=attempt, rank=r, world_size=world, **start_fields)
              for r in range(world)]
    if resumed is not None:
        events += per_rank("resume", resumed, world, run_id=run_id, attempt=attempt, step=0)
    if last_step:
        events += steps(attempt, world, 1, last_step, steps_from, run_id=run_id)
    if end is not None:
        events += per_rank("attempt_end", end, world, run_id=run_id, attempt=attempt, reason=reason)
    return events


def reference_s1() -> list[dict[str, Any]]:
    """The reference scenario of the ledger specification (world size 8, one restart)."""
    w = 8
    out = [ev("run_submitted", 0), ev("allocation_start", 100, gpus=8), ev("allocation_end", 620)]
    out += [ev("attempt_start", 100, attempt=0, rank=r, world_size=w, host=f"h{r // 4}") for r in range(w)]
    out += per_rank("resume", 100, w, attempt=0, step=0)
    out += steps(0, w, 1, 100, 130)
    out += per_rank("checkpoint_start", 230, w, attempt=0, step=100)
    out += per_rank("checkpoint_end", 240, w, attempt=0, step=100, ok=True)
    out += steps(0, w, 101, 150, 240)
    out += per_rank("attempt_end", 350, w, attempt=0, reason="failed")
    out += [ev("attempt_start", 360, attempt=1, rank=r, world_size=w, host=f"h{r // 4}") for r in range(w)]
    out += per_rank("resume", 360, w, attempt=1, step=100)
    out += steps(1, w, 101, 200, 380)
    out += per_rank("checkpoint_start", 480, w, attempt=1, step=200)
    out += per_rank("checkpoint_end", 490, w, attempt=1, step=200, ok=True)
    out += steps(1, w, 201, 300, 490)
    out += per_rank("attempt_end", 600, w, attempt=1, reason="completed")
    out.append(ev("run_end", 600, status="finished"))
    return out
