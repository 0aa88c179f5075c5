"""The startup waste split by what the attempts were doing (docs/ledger.md, "Startup, split").

Pure: the run's painting (services.analysis.claims) in, the startup GPU-seconds of every attempt split at the moments
its events mark, out. Each startup piece counts on the GPUs the ledger counts it on, so the parts add up to the
ledger's startup. The moments, each on the run's reference clock:

- the attempt's start (its earliest `attempt_start`: the interpreter's start under `goodput launch`, else `init()`);
- the process group up: the latest `phase_end` of `init_process_group` that succeeded;
- the checkpoint loaded: the latest `resume` (the client's `tracker.resumed()`, called once the state is loaded).

Before the start is relaunch, from the start to the process group rendezvous, then restore, then what comes before
the first step. Where a moment is missing, the two parts around it are one: `unsplit`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from services.analysis.attempts import Attempt
from services.analysis.claims import Claim, RunPainting
from services.schemas.ledger import StartupParts

_INF = float("inf")


def build_startup_parts(painting: RunPainting) -> StartupParts:
    run = painting.run
    parts = dict.fromkeys(StartupParts.model_fields, 0.0)
    pieces = np.flatnonzero(painting.claim == Claim.STARTUP)
    if not pieces.size or not run.attempts:
        return StartupParts(**parts)
    events = run.events if run.events is not None else pd.DataFrame(columns=["kind", "attempt"])
    spans = [_spans(a, events[events["attempt"] == a.attempt]) for a in run.attempts]
    world = np.array([a.world_size for a in run.attempts], dtype=np.float64)
    bounds, gpus, position = painting.bounds, painting.gpus.astype(np.float64), painting.position
    for i in pieces.tolist():
        start, end, pos = float(bounds[i]), float(bounds[i + 1]), int(position[i])
        on = min(world[pos], gpus[i])
        for name, lo, hi in spans[pos]:
            overlap = min(end, hi) - max(start, lo)
            if overlap > 0:
                parts[name] += overlap * on
    return StartupParts(**parts)


def _spans(attempt: Attempt, events: pd.DataFrame) -> list[tuple[str, float, float]]:
    """(part, from, to) of one attempt, covering all time."""
    began = attempt.start
    ends = events[(events["kind"] == "phase_end") & (events["name"] == "init_process_group")
                  & events["ok"].map(lambda v: v is True)]
    resumes = events[events["kind"] == "resume"]
    group_up = max(float(ends["time"].max()), began) if not ends.empty else None
    restored = max(float(resumes["time"].max()), group_up or began) if not resumes.empty else None
    spans = [("relaunch", -_INF, began)]
    if group_up is not None and restored is not None:
        spans += [("rendezvous", began, group_up), ("restore", group_up, restored),
                  ("before_first_step", restored, _INF)]
    elif group_up is not None:
        spans += [("rendezvous", began, group_up), ("unsplit", group_up, _INF)]
    elif restored is not None:
        spans += [("unsplit", began, restored), ("before_first_step", restored, _INF)]
    else:
        spans.append(("unsplit", began, _INF))
    return spans
