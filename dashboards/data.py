"""The dashboard's only way to data: the collector's API (services.api_client), and its answers turned into
DataFrames.

Nothing is fetched at import time. The API's base URL is the configured one (standalone mode) or, in the
embedded mode, the local address of the server that received the browser's request: the dashboard then
calls the very process it runs in, over HTTP, and never opens the database.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import flask
import pandas as pd

from services.api_client import AccessDenied, ApiClient, ApiError, LiveRun, RunListItem, bearer
from services.presentation import CATEGORIES
from services.settings import DashboardSettings

CONFIG_KEY = "GOODPUT_DASHBOARD_CONFIG"
_CLIENTS_KEY = "goodput_api_clients"
_LOCK = threading.Lock()

RANGES_S: dict[str, float | None] = {"1h": 3600.0, "24h": 86400.0, "7d": 7 * 86400.0, "30d": 30 * 86400.0,
                                     "all": None}


def config() -> DashboardSettings:
    cfg = flask.current_app.config.get(CONFIG_KEY)
    return cfg if isinstance(cfg, DashboardSettings) else DashboardSettings()


def api() -> ApiClient:
    """The API client for the current request (call inside a callback): one connection pool per collector URL,
    the request's credential."""
    cfg = config()
    base = cfg.api_url or _local_base_url(flask.request.environ)
    app = flask.current_app
    with _LOCK:
        clients: dict[str, ApiClient] = app.extensions.setdefault(_CLIENTS_KEY, {})
        client = clients.get(base)
        if client is None:
            client = clients[base] = ApiClient(base, timeout_s=cfg.timeout_s)
    return client.with_credential(_authorization(cfg))


def explain(error: ApiError) -> str:
    """What a page says when the API did not give it its data."""
    if isinstance(error, AccessDenied):
        return f"The collector refused the dashboard's credential: {error.message}"
    return str(error)


def _authorization(cfg: DashboardSettings) -> str | None:
    """The browser's own credential (forwarded as is), else the configured GOODPUT_DASHBOARD_TOKEN."""
    sent = flask.request.headers.get("Authorization") if flask.has_request_context() else None
    return sent or bearer(cfg.token)


def _local_base_url(environ: Mapping[str, Any]) -> str:
    """The server that received this request, by its local address (not the Host header a proxy may rewrite)."""
    host = str(environ.get("SERVER_NAME") or "127.0.0.1")
    port = str(environ.get("SERVER_PORT") or "80")
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


# -- shaping API answers ------------------------------------------------------------------------------------


def runs_frame(runs: Sequence[RunListItem], live: Sequence[LiveRun] = ()) -> pd.DataFrame:
    """/v1/runs rows -> one row per run with waste_<category> columns, worst (most wasted GPU-seconds) first."""
    columns = ["run_id", "project", "status", "first_time", "last_time", "allocated_gpu_seconds",
               "productive_gpu_seconds", "goodput", "restarts", "wasted_gpu_seconds",
               *(f"waste_{c}" for c in CATEGORIES), "seconds_since_progress", "possibly_hung", "at_risk_gpu_seconds",
               "suspect_ranks", "stale"]
    if not runs:
        return pd.DataFrame({c: [] for c in columns})
    rows = []
    live_by_run = {(row.run_id, row.project): row for row in live}
    for run in runs:
        waste = run.waste_gpu_seconds
        lv = live_by_run.get((run.run_id, run.project))
        rows.append({
            "run_id": run.run_id, "project": run.project, "status": run.status, "first_time": run.first_time,
            "last_time": run.last_time, "allocated_gpu_seconds": run.allocated_gpu_seconds,
            "productive_gpu_seconds": run.productive_gpu_seconds, "goodput": run.goodput,
            "restarts": run.restarts, "wasted_gpu_seconds": waste.total(),
            **{f"waste_{c}": waste[c] for c in CATEGORIES},
            "seconds_since_progress": lv.seconds_since_progress if lv else None,
            "possibly_hung": lv.possibly_hung if lv else False,
            "at_risk_gpu_seconds": lv.at_risk_gpu_seconds if lv else None,
            "suspect_ranks": tuple(lv.suspect_ranks) if lv else (),
            "stale": run.stale,  # figures of an older version while a newer one is built
        })
    frame = pd.DataFrame(rows, columns=columns)
    return frame.sort_values(["wasted_gpu_seconds", "run_id"], ascending=[False, True], kind="stable").reset_index(
        drop=True)


def fleet_totals(frame: pd.DataFrame) -> dict[str, float | None]:
    allocated = float(frame["allocated_gpu_seconds"].sum()) if len(frame) else 0.0
    productive = float(frame["productive_gpu_seconds"].sum()) if len(frame) else 0.0
    out: dict[str, float | None] = {
        "runs": float(len(frame)),
        "running": float((frame["status"] == "running").sum()) if len(frame) else 0.0,
        "allocated": allocated,
        "productive": productive,
        "goodput": productive / allocated if allocated > 0 else None,
        "wasted": float(frame["wasted_gpu_seconds"].sum()) if len(frame) else 0.0,
    }
    for c in CATEGORIES:
        out[c] = float(frame[f"waste_{c}"].sum()) if len(frame) else 0.0
    return out


def fleet_over_time(frame: pd.DataFrame, max_buckets: int = 48) -> tuple[pd.DataFrame, str]:
    """GPU-seconds per time bucket and category, each run's totals spread evenly over its active time.

    Returns (DataFrame with columns bucket_start, category, gpu_seconds; the bucket width's label).
    """
    spans = frame.dropna(subset=["first_time", "last_time"])
    if spans.empty:
        return pd.DataFrame({"bucket_start": [], "category": [], "gpu_seconds": []}), ""
    lo, hi = float(spans["first_time"].min()), float(spans["last_time"].max())
    width, label = _bucket_width(max(hi - lo, 1.0) / max_buckets)
    first_bucket = (lo // width) * width
    n = int((hi - first_bucket) // width) + 1
    edges = first_bucket + width * pd.RangeIndex(n + 1).to_numpy()
    out: dict[str, list[float]] = {c: [0.0] * n for c in ("productive", *CATEGORIES)}
    columns = {"productive": "productive_gpu_seconds", **{c: f"waste_{c}" for c in CATEGORIES}}
    gpu_seconds = {c: spans[column].to_numpy(dtype=float) for c, column in columns.items()}
    for i, (first, last) in enumerate(zip(spans["first_time"].to_numpy(dtype=float),
                                          spans["last_time"].to_numpy(dtype=float), strict=True)):
        start, end = float(first), max(float(last), float(first) + 1e-9)
        b0, b1 = int((start - first_bucket) // width), int((end - first_bucket) // width)
        for b in range(b0, min(b1, n - 1) + 1):
            overlap = min(end, edges[b + 1]) - max(start, edges[b])
            fraction = overlap / (end - start)
            if fraction <= 0:
                continue
            for c, values in gpu_seconds.items():
                out[c][b] += float(values[i]) * fraction
    records = [{"bucket_start": float(edges[b]), "category": c, "gpu_seconds": out[c][b]}
               for c in out for b in range(n)]
    return pd.DataFrame(records), label


_WIDTHS = ((60, "1 min"), (300, "5 min"), (900, "15 min"), (3600, "1 h"), (6 * 3600, "6 h"), (86400, "1 day"),
           (7 * 86400, "1 week"))


def _bucket_width(at_least_s: float) -> tuple[float, str]:
    for width, label in _WIDTHS:
        if width >= at_least_s:
            return float(width), label
    return float(_WIDTHS[-1][0]), _WIDTHS[-1][1]
