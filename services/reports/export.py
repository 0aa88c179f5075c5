"""Reports as files: JSON, CSV (one run's breakdown, or the fleet) and self-contained HTML (services.reports.html)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Mapping
from typing import Any

from services.analysis.categories import WASTE_KEYS
from services.presentation import iso

BREAKDOWN_COLUMNS = ("run_id", "category", "gpu_seconds", "gpu_hours", "share")
FLEET_COLUMNS = (
    "run_id", "project", "status", "first_time", "last_time", "first_time_utc", "last_time_utc", "allocated_gpu_seconds",
    "allocated_gpu_hours", "productive_gpu_seconds", "goodput",
    *(f"{k}_gpu_seconds" for k in WASTE_KEYS), "at_risk_gpu_seconds", "restarts", "failures", "queue_seconds",
)


def report_json(report: Mapping[str, Any]) -> str:
    return json.dumps(report, indent=2, allow_nan=False)


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)  # shortest exact round trip: a spreadsheet or pandas reads back the same double
    return value


def _write(columns: Iterable[str], rows: Iterable[Mapping[str, Any]]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(columns), lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _cell(v) for k, v in row.items()})
    return out.getvalue()


def breakdown_csv(report: Mapping[str, Any]) -> str:
    """One row per category (productive, the six waste categories, allocated): GPU-seconds, GPU-hours, share."""
    run_id = report["run_id"]
    return _write(BREAKDOWN_COLUMNS, ({"run_id": run_id, **row} for row in report["breakdown"]))


def fleet_rows(ledgers: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for ledger in ledgers:
        waste = ledger["waste_gpu_seconds"]
        rows.append({
            "run_id": ledger["run_id"], "project": ledger.get("project", "default"), "status": ledger["status"],
            "first_time": ledger.get("first_time"), "last_time": ledger.get("latest_time"),
            "first_time_utc": iso(ledger.get("first_time")), "last_time_utc": iso(ledger.get("latest_time")),
            "allocated_gpu_seconds": float(ledger["allocated_gpu_seconds"]),
            "allocated_gpu_hours": float(ledger["allocated_gpu_seconds"]) / 3600.0,
            "productive_gpu_seconds": float(ledger["productive_gpu_seconds"]), "goodput": ledger.get("goodput"),
            **{f"{k}_gpu_seconds": float(waste.get(k, 0.0)) for k in WASTE_KEYS},
            "at_risk_gpu_seconds": float(ledger.get("at_risk_gpu_seconds", 0.0)),
            "restarts": int(ledger.get("restarts", 0)), "failures": int(ledger.get("failures", 0)),
            "queue_seconds": float(ledger.get("queue_seconds", 0.0)),
        })
    return rows


def fleet_csv(ledgers: Iterable[Mapping[str, Any]]) -> str:
    """One row per run: times (epoch seconds and ISO 8601 UTC), GPU-seconds per category, goodput, restarts."""
    return _write(FLEET_COLUMNS, fleet_rows(ledgers))
