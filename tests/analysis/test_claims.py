"""Painting's tie-break, worked out by hand: where two attempts' claims of one kind overlap, the later attempt's
wins (docs/ledger.md, "Painting wall time"); the run page's band draws the ledger's own pieces."""

from __future__ import annotations

import pytest

from services.analysis.attempts import build_run_structure
from services.analysis.claims import paint_run
from services.analysis.ledger import build_ledger
from services.analysis.run_data import run_data_from_events
from services.analysis.views import build_run_views
from tests.analysis.scenarios import T0, ev, per_rank, steps
from tests.ledger_checks import assert_ledger as expect
from tests.ledger_checks import assert_partition


def overlapping_attempts() -> list[dict]:  # type: ignore[type-arg]
    """Allocated 0-40 with 4 GPUs. Attempt 0 (world 4) steps 1-10 from 5 to 15, preempted at 15. Attempt 1
    (world 2, its clock skewed) starts at 8, resumes from 10 and steps 11-20 from 12 to 22: both attempts' kept
    steps claim 12-15."""
    out = [ev("allocation_start", 0, gpus=4), ev("allocation_end", 40)]
    out += [ev("attempt_start", 0, attempt=0, rank=r, world_size=4) for r in range(4)]
    out += per_rank("resume", 0, 4, attempt=0, step=0)
    out += steps(0, 4, 1, 10, 5)
    out += per_rank("attempt_end", 15, 4, attempt=0, reason="preempted")
    out += [ev("attempt_start", 8, attempt=1, rank=r, world_size=2) for r in range(2)]
    out += per_rank("resume", 8, 2, attempt=1, step=10)
    out += steps(1, 2, 11, 20, 12)
    out += per_rank("attempt_end", 22, 2, attempt=1, reason="completed")
    out.append(ev("run_end", 22, status="finished"))
    return out


def test_where_two_attempts_kept_steps_overlap_the_later_attempt_wins() -> None:
    data = run_data_from_events("s1", overlapping_attempts())
    ledger = build_ledger(data)
    assert_partition(ledger)
    # 12-15 counts on attempt 1's 2 GPUs (its other 2 GPUs idle), not on attempt 0's 4
    expect(ledger, (12 - 5) * 4 + (22 - 12) * 2, startup=5 * 4, idle=(22 - 12) * 2 + (40 - 22) * 4)
    first, second = ledger.attempts
    assert first.gpu_seconds == pytest.approx({"productive": 7 * 4, "startup": 5 * 4})
    assert second.gpu_seconds == pytest.approx({"productive": 10 * 2})


def test_the_run_pages_band_draws_the_ledgers_painting() -> None:
    data = run_data_from_events("s1", overlapping_attempts())
    painting = paint_run(build_run_structure(data))
    ledger = build_ledger(data, painting)
    views = build_run_views(data, ledger, version=1, painting=painting)
    band = [(s.start - T0, s.end - T0, s.category) for s in views.timeline.segments]
    assert band == [(0, 5, "startup"), (5, 22, "productive"), (22, 40, "idle")]
    assert views == build_run_views(data, ledger, version=1)  # the same views whether painted here or there
