"""A hung running run's hang so far is in every figure, provisionally: /waste, /v1/runs (and so the fleet's
worst-first order), /v1/runs/{id} and the run report; it grows with the collector's clock."""

from __future__ import annotations

import csv
import io
import time
from typing import Any

import pytest

from dashboards.data import runs_frame
from services.schemas.runs import RunList
from tests.collector.test_live_api import post, running_sim
from tests.ledger_checks import assert_partition

GPUS = 4  # running_sim: 4 ranks on 4 GPUs


def listed(client: Any) -> dict[str, dict[str, Any]]:
    return {r["run_id"]: r for r in client.get("/v1/runs").json()["runs"]}


def all_idle_run(run_id: str, idle_gpu_s: float) -> list[dict[str, Any]]:
    """A finished run that held one GPU for `idle_gpu_s` seconds and never stepped: all of it idle."""
    end = time.time() - 600
    return [{"event_id": f"{run_id}-{k}", "run_id": run_id, "kind": k, "time": t, **f} for k, t, f in (
        ("allocation_start", end - idle_gpu_s, {"gpus": 1}), ("allocation_end", end, {}),
        ("run_end", end, {"status": "finished"}))]


def test_a_hung_runs_hang_is_in_waste_and_the_fleet_list_and_grows(client) -> None:
    post(client, running_sim("stalled", stopped_ago_s=120.0))  # threshold 40.5 s: hung
    post(client, running_sim("healthy", stopped_ago_s=1.0))
    first = client.get("/v1/runs/stalled/waste").json()
    runs_1 = listed(client)
    time.sleep(1.0)
    second = client.get("/v1/runs/stalled/waste").json()
    runs_2 = listed(client)

    for ledger in (first, second):
        assert_partition(ledger)
    p1, p2 = first["provisional"], second["provisional"]
    assert p1["hang_gpu_seconds"] == pytest.approx(120.0 * GPUS, abs=10 * GPUS)  # from the last step on
    assert p2["hang_gpu_seconds"] - p1["hang_gpu_seconds"] >= 1.0 * GPUS
    assert p2["as_of"] > p1["as_of"] and p1["since"] == p2["since"]
    assert second["waste_gpu_seconds"]["hang"] - first["waste_gpu_seconds"]["hang"] == pytest.approx(
        p2["hang_gpu_seconds"] - p1["hang_gpu_seconds"])
    assert second["allocated_gpu_seconds"] > first["allocated_gpu_seconds"]

    for runs in (runs_1, runs_2):
        assert runs["healthy"]["provisional"] is None
    s1, s2 = runs_1["stalled"], runs_2["stalled"]
    assert s1["provisional"] and s2["waste_gpu_seconds"]["hang"] > s1["waste_gpu_seconds"]["hang"] > 0
    assert s1["waste_gpu_seconds"]["hang"] == pytest.approx(s1["provisional"]["hang_gpu_seconds"])
    assert p1["as_of"] <= s1["provisional"]["as_of"] <= p2["as_of"]

    detail = client.get("/v1/runs/stalled").json()
    assert detail["provisional"] and detail["allocated_gpu_seconds"] >= second["allocated_gpu_seconds"]


def test_the_fleets_worst_first_order_sees_the_hang(client) -> None:
    post(client, running_sim("stalled", stopped_ago_s=300.0))
    stored = client.get("/v1/runs/stalled/waste").json()
    stored_waste = sum(stored["waste_gpu_seconds"].values()) - stored["provisional"]["hang_gpu_seconds"]
    # a finished run that wasted more than the stalled run had before it hung, less than with its hang so far
    post(client, all_idle_run("idle-run", stored_waste + 0.5 * stored["provisional"]["hang_gpu_seconds"]))
    frame = runs_frame(RunList.model_validate(client.get("/v1/runs").json()).runs)
    assert list(frame["run_id"]) == ["stalled", "idle-run"]


def test_the_run_report_counts_the_hang_and_says_the_run_is_hung(client) -> None:
    post(client, running_sim("stalled", stopped_ago_s=120.0))
    report = client.get("/v1/runs/stalled/report").json()
    ledger = report["ledger"]
    assert ledger["provisional"]["hang_gpu_seconds"] > 100 * GPUS and ledger["waste_gpu_seconds"]["hang"] > 0
    assert_partition(ledger)
    assert report["recommendations"][0]["code"] == "hung_now"
    rows = {r["category"]: r for r in csv.DictReader(io.StringIO(client.get(
        "/v1/runs/stalled/report", params={"format": "csv"}).text))}
    assert float(rows["hang"]["gpu_seconds"]) >= ledger["provisional"]["hang_gpu_seconds"]
    html = client.get("/v1/runs/stalled/report", params={"format": "html"}).text
    assert "Hung now (provisional)" in html and "The run is hung now" in html


def test_a_healthy_run_has_no_provisional_hang_anywhere(client) -> None:
    post(client, running_sim("healthy", stopped_ago_s=1.0))
    assert client.get("/v1/runs/healthy/waste").json()["provisional"] is None
    assert client.get("/v1/runs/healthy/report").json()["ledger"]["provisional"] is None
    assert all(c["code"] != "hung_now" for c in client.get("/v1/runs/healthy/report").json()["recommendations"])
