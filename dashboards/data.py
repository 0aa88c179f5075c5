"""The dashboard's only way to data: the collector's API (services.api_client), and its answers turned into
DataFrames.

Nothing is fetched at import time. The API's base URL is the configured one (standalone mode) or, in the
embedded mode, the local address of the server that received the browser's request: the dashboard then
calls the very process it runs in, over HTTP, and never opens the database.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import flask
import numpy as np
import pandas as pd

from services.api_client import AccessDenied, ApiClient, ApiError, bearer
from services.presentation import CATEGORIES, CATEGORY_ORDER, last_range
from services.presentation import duration as fmt_duration
from services.schemas.categories import EVAL
from services.schemas.fleet import FleetWindow
from services.schemas.ledger import goodput_ratio
from services.schemas.live import LiveRun
from services.schemas.runs import RunListItem
from services.settings import DashboardSettings

CONFIG_KEY = "goodput_dashboard_config"  # the Dash server's Flask config key
_CLIENTS_KEY = "goodput_api_clients"
_LOCK = threading.Lock()

PRESET_RANGES = ("1h", "24h", "7d", "30d")  # the last DURATION (services.presentation.last_range); also "all", "custom"


_TIME_FORMATS = ("%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d")  # UTC


def time_range(range_key: str | None, start: str | None, end: str | None, now: float) -> tuple[float | None,
                                                                                             float | None]:
    """(since, until) of the range picked: a preset ends now; a custom one reads its UTC inputs (an empty side is
    open); "all" is (None, None)."""
    if range_key == "custom":
        return _epoch(start), _epoch(end)
    if range_key in PRESET_RANGES:
        return last_range(range_key, now)  # the rule `goodput runs --last` follows
    return None, None


def _epoch(text: str | None) -> float | None:
    if not text:
        return None
    for pattern in _TIME_FORMATS:
        try:
            return datetime.strptime(text.strip(), pattern).replace(tzinfo=UTC).timestamp()
        except ValueError:
            continue
    return None


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

RUN_COLUMNS = ["run_id", "project", "status", "first_time", "last_time", "allocated_gpu_seconds",
               "productive_gpu_seconds", "eval_gpu_seconds", "goodput", "restarts", "wasted_gpu_seconds",
               *(f"waste_{c}" for c in CATEGORIES), "seconds_since_progress", "possibly_hung", "at_risk_gpu_seconds",
               "suspect_ranks", "stale", "life_allocated_gpu_seconds", "laid_out"]
KEYS: tuple[str, ...] = CATEGORY_ORDER  # the partition of allocated time, as the API's usage keys


def runs_frame(runs: Sequence[RunListItem], live: Sequence[LiveRun] = ()) -> pd.DataFrame:
    """/v1/runs rows -> one row per run with waste_<category> columns (figures of each run's whole life), worst
    (most wasted GPU-seconds) first."""
    return _frame([(run, run.allocated_gpu_seconds, run.productive_gpu_seconds, run.eval_gpu_seconds, run.goodput,
                    run.waste_gpu_seconds, True) for run in runs], live)


def window_frame(window: FleetWindow, live: Sequence[LiveRun] = ()) -> pd.DataFrame:
    """/v1/fleet/window -> one row per run as `runs_frame`, its figures those inside the range (a run's whole-life
    allocation in `life_allocated_gpu_seconds`)."""
    return _frame([(r.run, r.window.allocated_gpu_seconds, r.window.productive_gpu_seconds,
                    r.window.eval_gpu_seconds, r.window.goodput, r.window.waste_gpu_seconds, r.laid_out)
                   for r in window.runs], live)


def _frame(rows_in: Sequence[tuple[RunListItem, float, float, float, float | None, Any, bool]],
           live: Sequence[LiveRun]) -> pd.DataFrame:
    if not rows_in:
        return pd.DataFrame({c: [] for c in RUN_COLUMNS})
    rows = []
    live_by_run = {(row.run_id, row.project): row for row in live}
    for run, allocated, productive, eval_gpu_s, goodput, waste, laid_out in rows_in:
        lv = live_by_run.get((run.run_id, run.project))
        rows.append({
            "run_id": run.run_id, "project": run.project, "status": run.status, "first_time": run.first_time,
            "last_time": run.last_time, "allocated_gpu_seconds": allocated,
            "productive_gpu_seconds": productive, "eval_gpu_seconds": eval_gpu_s, "goodput": goodput,
            "restarts": run.restarts, "wasted_gpu_seconds": float(sum(waste[c] for c in CATEGORIES)),
            **{f"waste_{c}": waste[c] for c in CATEGORIES},
            "seconds_since_progress": lv.seconds_since_progress if lv else None,
            "possibly_hung": lv.possibly_hung if lv else False,
            "at_risk_gpu_seconds": lv.at_risk_gpu_seconds if lv else None,
            "suspect_ranks": tuple(lv.suspect_ranks) if lv else (),
            "stale": run.stale,  # figures of an older version while a newer one is built
            "life_allocated_gpu_seconds": run.allocated_gpu_seconds,
            "laid_out": laid_out,
        })
    frame = pd.DataFrame(rows, columns=RUN_COLUMNS)
    return sort_runs(frame, "wasted", descending=True)


SORT_COLUMNS: dict[str, str] = {"run": "run_id", "project": "project", "status": "status", "goodput": "goodput",
                                "allocated": "allocated_gpu_seconds", "wasted": "wasted_gpu_seconds",
                                "restarts": "restarts", "last": "last_time"}


def sort_runs(frame: pd.DataFrame, key: str, *, descending: bool, group_by_project: bool = False) -> pd.DataFrame:
    """The runs ordered by SORT_COLUMNS[key] (unknown or undefined values last), ties by run id; by project first
    when grouped."""
    column = SORT_COLUMNS.get(key, "wasted_gpu_seconds")
    by = [column, "run_id"] if column != "run_id" else ["run_id"]
    ascending = [not descending, True][: len(by)]
    if group_by_project and column != "project":
        by, ascending = ["project", *by], [True, *ascending]
    return frame.sort_values(by, ascending=ascending, kind="stable", na_position="last").reset_index(drop=True)


def page_of(frame: pd.DataFrame, page: int, size: int) -> tuple[pd.DataFrame, int, int]:
    """(the rows of 1-based `page`, that page clamped to the pages there are, how many pages)."""
    pages = max(1, -(-len(frame) // size))
    page = min(max(page, 1), pages)
    return frame.iloc[(page - 1) * size: page * size], page, pages


def fleet_totals(frame: pd.DataFrame) -> dict[str, float | None]:
    allocated = float(frame["allocated_gpu_seconds"].sum()) if len(frame) else 0.0
    productive = float(frame["productive_gpu_seconds"].sum()) if len(frame) else 0.0
    out: dict[str, float | None] = {
        "runs": float(len(frame)),
        "running": float((frame["status"] == "running").sum()) if len(frame) else 0.0,
        "allocated": allocated,
        "productive": productive,
        "goodput": goodput_ratio(productive, allocated),
        "wasted": float(frame["wasted_gpu_seconds"].sum()) if len(frame) else 0.0,
        EVAL: float(frame["eval_gpu_seconds"].sum()) if len(frame) else 0.0,
    }
    for c in CATEGORIES:
        out[c] = float(frame[f"waste_{c}"].sum()) if len(frame) else 0.0
    return out


def projects_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per project: its runs' figures added up (goodput of the sums), most wasted first."""
    columns = ["allocated_gpu_seconds", "productive_gpu_seconds", "eval_gpu_seconds", "wasted_gpu_seconds", "restarts",
               *(f"waste_{c}" for c in CATEGORIES)]
    if frame.empty:
        return pd.DataFrame({c: [] for c in ["project", "runs", "running", "goodput", *columns]})
    grouped = frame.groupby("project", sort=True)
    out = grouped[columns].sum()
    out["runs"] = grouped.size()
    out["running"] = grouped["status"].apply(lambda s: int((s == "running").sum()))
    out["goodput"] = np.array([goodput_ratio(p, a) for p, a in zip(out["productive_gpu_seconds"],
                                                                   out["allocated_gpu_seconds"], strict=True)],
                              dtype=np.float64)  # NaN: nothing allocated
    return out.reset_index().sort_values(["wasted_gpu_seconds", "project"], ascending=[False, True], kind="stable")


def over_time(window: FleetWindow, keep: set[tuple[str, str]] | None = None) -> pd.DataFrame:
    """GPU-seconds per time bucket, project and key (productive and each waste category) of the runs in `keep`
    ((project, run id); None: all), from each run's own buckets: time is where it was spent, never spread.

    Columns: bucket_start, project, category, gpu_seconds (one row per bucket x project x key)."""
    edges = window.bucket_start + window.bucket_s * np.arange(window.bucket_count, dtype=np.float64)
    sums: dict[tuple[str, str], np.ndarray] = {}
    for r in window.runs:
        if keep is not None and (r.run.project, r.run.run_id) not in keep:
            continue
        for key, values in r.buckets.items():
            acc = sums.setdefault((r.run.project, key), np.zeros(window.bucket_count))
            acc += np.asarray(values[: window.bucket_count], dtype=np.float64)
    records = [{"bucket_start": float(edges[b]), "project": project, "category": key, "gpu_seconds": float(v[b])}
               for (project, key), v in sorted(sums.items()) for b in range(window.bucket_count)]
    if not records:
        return pd.DataFrame({"bucket_start": [], "project": [], "category": [], "gpu_seconds": []})
    return pd.DataFrame(records)


_WIDTH_LABELS = {60: "1 min", 300: "5 min", 600: "10 min", 900: "15 min", 1800: "30 min", 3600: "1 h",
                 7200: "2 h", 6 * 3600: "6 h", 12 * 3600: "12 h", 86400: "1 day", 7 * 86400: "1 week"}


def width_label(bucket_s: float) -> str:
    """`15 min`, `1 h`, `1 day`: a bucket's width as the chart's axis says it."""
    return _WIDTH_LABELS.get(int(bucket_s), fmt_duration(bucket_s))
