"""A run's report as one JSON-able dict: the ledger, a per-category breakdown, restarts, checkpoints,
stragglers and recommendations. Pure: the caller passes the ledger, the views and the time of writing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from services.analysis.views import build_restart_rows
from services.reports.recommend import DEFAULT_PROVIDERS, Provider, ReportInput, recommend
from services.presentation import CATEGORY_ORDER

REPORT_VERSION = 1
MAX_STRAGGLER_ROWS = 32


def build_breakdown(ledger: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per category (productive first, then the six waste categories) and a last `allocated` row:
    GPU-seconds, GPU-hours and share of allocated (None when nothing was allocated)."""
    allocated = float(ledger["allocated_gpu_seconds"])
    values = {"productive": float(ledger["productive_gpu_seconds"]),
              **{k: float(v) for k, v in ledger["waste_gpu_seconds"].items()}}
    rows = []
    for category in (*CATEGORY_ORDER, "allocated"):
        gpu_s = allocated if category == "allocated" else values.get(category, 0.0)
        rows.append({"category": category, "gpu_seconds": gpu_s, "gpu_hours": gpu_s / 3600.0,
                     "share": gpu_s / allocated if allocated > 0 else None})
    return rows


def build_stragglers(ledger: Mapping[str, Any], views: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Ranks charged with straggler time, costliest first, with their host and median compute when known."""
    by_rank = {int(k): float(v) for k, v in ledger.get("straggler_gpu_seconds_by_rank", {}).items() if v > 0}
    total = sum(by_rank.values())
    rows_by_rank = {r["rank"]: r for r in (views or {}).get("ranks", {}).get("rows", [])}
    out = []
    for rank, gpu_s in sorted(by_rank.items(), key=lambda kv: -kv[1])[:MAX_STRAGGLER_ROWS]:
        row = rows_by_rank.get(rank, {})
        out.append({"rank": rank, "host": row.get("host"), "straggler_gpu_seconds": gpu_s,
                    "share_of_straggler": gpu_s / total if total else None,
                    "median_compute_seconds": row.get("median_compute_s")})
    return out


def build_report(ledger: Mapping[str, Any], views: Mapping[str, Any] | None, *, generated_at: float,
                 providers: Sequence[Provider] = DEFAULT_PROVIDERS,
                 resume_check: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`ledger` is the API's ledger document (GET /v1/runs/{id}/waste); `views` the run's dashboard views of the
    same version (services.analysis.views), or None for a report from the ledger alone; `resume_check` the run's
    GET /v1/runs/{id}/resume-check, when known (a flagged one becomes a recommendation)."""
    checkpoints: dict[str, Any] = {"summary": dict(ledger.get("checkpoints", {}))}
    if views is not None:
        checkpoints["rows"] = list(views.get("checkpoints", []))
        checkpoints["rows_total"] = views.get("checkpoints_total", len(checkpoints["rows"]))
    return {
        "report_version": REPORT_VERSION,
        "run_id": ledger["run_id"],
        "generated_at": generated_at,
        "ledger": dict(ledger),
        "breakdown": build_breakdown(ledger),
        "restarts": list(views["restarts"]) if views is not None else build_restart_rows(ledger),
        "checkpoints": checkpoints,
        "stragglers": build_stragglers(ledger, views),
        "recommendations": [r.to_dict() for r in recommend(
            ReportInput(ledger=ledger, views=views, resume_check=resume_check), providers)],
    }
