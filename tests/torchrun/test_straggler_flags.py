"""Straggler flags on real torchrun jobs (CPU, gloo): a healthy 2-rank run flags no rank, a slow rank is flagged.

The rule (docs/ledger.md, "Straggler") flags a rank only when it is consistently and materially slower than the
others; with two ranks the old "10% of the straggler cost" rule flagged both of a healthy run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.ledger_checks import assert_partition
from tests.torchrun.conftest import Collector, Job, fetch_ledger, start_job

pytestmark = pytest.mark.torchrun


def _finished(ledger: dict[str, Any]) -> bool:
    return ledger["status"] == "finished"


def _flags(url: str, run_id: str) -> tuple[dict[str, Any], list[int]]:
    """The /stragglers report, and the ranks the run page paints as stragglers (/view)."""
    report = httpx.get(f"{url}/v1/runs/{run_id}/stragglers", timeout=30).json()
    view = httpx.get(f"{url}/v1/runs/{run_id}/view", timeout=60).json()
    return report, view["ranks"]["straggler_ranks"]


def test_a_healthy_two_rank_run_flags_no_straggler(tmp_path: Path, collector: Collector, jobs: list[Job]) -> None:
    steps = 40
    job = start_job(tmp_path / "job", collector.url, run_id="healthy", launch=False, args=(
        "--steps", str(steps), "--checkpoint-every", "0", "--step-sleep", "0.01"))
    jobs.append(job)
    assert job.wait() == 0, job.tail()

    ledger = fetch_ledger(collector.url, "healthy", _finished)
    assert_partition(ledger)
    report, painted = _flags(collector.url, "healthy")
    assert len(report["ranks"]) == 2 and all(r["compared_steps"] >= 20 for r in report["ranks"]), \
        "the rule had enough steps with collective timings to judge"
    assert [r["rank"] for r in report["ranks"] if r["flagged"]] == [], report["ranks"]
    assert [h["host"] for h in report["hosts"] if h["flagged"]] == []
    assert painted == []


def test_a_rank_slower_in_every_step_is_flagged(tmp_path: Path, collector: Collector, jobs: list[Job]) -> None:
    steps, slow_rank = 30, 1
    job = start_job(tmp_path / "job", collector.url, run_id="slow", launch=False, args=(
        "--steps", str(steps), "--checkpoint-every", "0", "--straggler-rank", str(slow_rank),
        "--straggler-sleep", "0.05"))
    jobs.append(job)
    assert job.wait() == 0, job.tail()

    fetch_ledger(collector.url, "slow", _finished)
    report, painted = _flags(collector.url, "slow")
    assert [r["rank"] for r in report["ranks"] if r["flagged"]] == [slow_rank], report["ranks"]
    (slow,) = [r for r in report["ranks"] if r["rank"] == slow_rank]
    assert slow["slower_steps"] >= 0.9 * slow["compared_steps"] and slow["median_excess_seconds"] >= 0.04
    assert painted == [slow_rank]
