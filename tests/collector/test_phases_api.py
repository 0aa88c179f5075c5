"""Phases through the collector, on SQLite and PostgreSQL (runs written down by hand in tests/analysis/test_phases.py).

Evaluation between steps (two ranks evaluating from 25 to 35): every surface that lists the partition of allocated
time shows `eval` apart from productive and from waste (ledger, run list, fleet window, metrics, report), with the
same figure. A round waiting in `init_process_group` for a peer that never comes: `/live` (read from the database's
indexes) dates the missing progress from the entry into it, and the stored ledger's startup ends there."""

from __future__ import annotations

import io
import time
from typing import Any

import pandas as pd
import pytest

from tests.analysis.scenarios import T0
from tests.analysis.test_phases import W, waiting_for_a_peer, with_eval
from tests.collector.test_live_api import post
from tests.ledger_checks import assert_partition
from tests.metrics.test_metrics_endpoint import scrape, value

EVAL_GPU_S = 10.0 * W


def recent(events: list[dict[str, Any]], ago_s: float = 300.0) -> list[dict[str, Any]]:
    """The events moved so that T0 lies `ago_s` before now (the metrics label runs active in the last day; live
    detection judges with the collector's clock)."""
    by = time.time() - ago_s - T0

    def moved(value: Any) -> Any:
        return [v + by for v in value] if isinstance(value, list) else value + by

    return [{**e, **{k: moved(e[k]) for k in ("time", "start", "end") if k in e}} for e in events]


def test_every_surface_shows_eval_apart_from_productive_and_waste(client) -> None:
    post(client, recent(with_eval()))
    ledger = client.get("/v1/runs/s1/waste").json()
    assert_partition(ledger)
    assert ledger["eval_gpu_seconds"] == pytest.approx(EVAL_GPU_S)
    assert ledger["attempts"][0]["gpu_seconds"]["eval"] == pytest.approx(EVAL_GPU_S)
    assert "eval" not in ledger["waste_gpu_seconds"]

    (listed,) = client.get("/v1/runs").json()["runs"]
    assert listed["eval_gpu_seconds"] == pytest.approx(EVAL_GPU_S)

    (run,) = client.get("/v1/fleet/window").json()["runs"]
    window = run["window"]
    assert window["eval_gpu_seconds"] == pytest.approx(EVAL_GPU_S)
    assert sum(run["buckets"]["eval"]) == pytest.approx(EVAL_GPU_S)
    assert window["allocated_gpu_seconds"] == pytest.approx(
        window["productive_gpu_seconds"] + window["eval_gpu_seconds"] + sum(window["waste_gpu_seconds"].values()))

    samples = scrape(client)
    assert value(samples, "goodput_run_eval_gpu_seconds", run_id="s1") == pytest.approx(EVAL_GPU_S)
    assert value(samples, "goodput_fleet_eval_gpu_seconds") == pytest.approx(EVAL_GPU_S)

    report = client.get("/v1/runs/s1/report", params={"format": "csv"})
    assert report.status_code == 200, report.text
    rows = pd.read_csv(io.StringIO(report.text)).set_index("category")
    assert list(rows.index[:2]) == ["productive", "eval"]
    assert rows.loc["eval", "gpu_seconds"] == pytest.approx(EVAL_GPU_S)
    assert rows.loc["eval", "share"] == pytest.approx(EVAL_GPU_S / ledger["allocated_gpu_seconds"], abs=1e-6)


def test_live_dates_a_wait_for_peers_from_the_entry_into_init_process_group(client) -> None:
    post(client, recent(waiting_for_a_peer(until=340, ended=False), ago_s=400))  # entered at T0 + 10, 390 s ago
    live = client.get("/v1/runs/s1/live").json()
    assert live["hung"] and live["threshold_basis"] == "startup", live
    assert live["last_progress_time"] == pytest.approx(time.time() - 390, abs=5)  # not the attempt's start (400)
    ledger = client.get("/v1/runs/s1/waste").json()
    assert_partition(ledger)
    assert ledger["waste_gpu_seconds"]["startup"] == pytest.approx(10 * W)
    assert ledger["provisional"]["since"] == live["last_progress_time"]
    assert ledger["waste_gpu_seconds"]["hang"] == pytest.approx(
        (ledger["provisional"]["as_of"] - ledger["provisional"]["since"]) * W)
