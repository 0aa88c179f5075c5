"""The startup waste split at the moments the events mark (attempt start, process group up, checkpoint loaded), worked
out by hand: the parts add up to the ledger's startup, and an attempt without a marker keeps its parts together."""

from __future__ import annotations

from typing import Any

import pytest

from tests.analysis.scenarios import attempt_events, ev, per_rank, steps
from tests.ledger_checks import ledger_of_events

W = 4


def two_attempts() -> list[dict[str, Any]]:
    """World 4 on 4 GPUs from 0 to 130. Attempt 0 starts at 10, its process group is up at 25 (the last rank out of
    init_process_group), it loads its checkpoint until 40, steps 1-20 from 50 to 70 and fails at 72. Attempt 1 starts
    at 80 with no init_process_group phase (init() after the process group), loads until 95, steps 1-30 from 100."""
    events = [ev("allocation_start", 0, gpus=W), ev("allocation_end", 130)]
    events += attempt_events(0, W, 10, host="h")
    events += per_rank("phase_start", 10, W, attempt=0, name="init_process_group", step=0)
    events += [ev("phase_end", 22 + r, attempt=0, rank=r, name="init_process_group", step=0, ok=True)
               for r in range(W)]
    events += per_rank("resume", 40, W, attempt=0, step=0)
    events += steps(0, W, 1, 20, 50)
    events += per_rank("attempt_end", 72, W, attempt=0, reason="failed")
    events += attempt_events(1, W, 80, resumed=95, last_step=30, steps_from=100, end=130, host="h")
    events.append(ev("run_end", 130, status="finished"))
    return events


def test_the_startup_splits_at_the_marked_moments_and_adds_up_to_the_ledgers_startup() -> None:
    ledger = ledger_of_events(two_attempts())
    parts = ledger.startup_parts
    assert parts is not None
    # attempt 0: 0-10 relaunch, 10-25 rendezvous, 25-40 restore, 40-50 before the first step;
    # attempt 1: 72-80 relaunch, 80-95 rendezvous and restore together (no marker between), 95-100 before its step
    assert parts.model_dump() == pytest.approx({
        "relaunch": (10 + 8) * W, "rendezvous": 15 * W, "restore": 15 * W, "before_first_step": (10 + 5) * W,
        "unsplit": 15 * W})
    assert sum(parts.model_dump().values()) == pytest.approx(ledger.waste_gpu_seconds.startup, rel=1e-12)
    assert ledger.waste_gpu_seconds.startup == pytest.approx((50 + 28) * W)


def test_a_run_without_markers_keeps_its_startup_unsplit_after_the_relaunch() -> None:
    bare = [e for e in two_attempts() if e["kind"] not in ("phase_start", "phase_end", "resume")]
    parts = ledger_of_events(bare).startup_parts
    assert parts is not None
    assert parts.model_dump() == pytest.approx({
        "relaunch": (10 + 8) * W, "rendezvous": 0.0, "restore": 0.0, "before_first_step": 0.0,
        "unsplit": (40 + 20) * W})
