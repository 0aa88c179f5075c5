"""The dashboard's only way to data: the collector's HTTP API, turned into dicts and DataFrames.

Nothing is fetched at import time. The API's base URL is the configured one (standalone mode) or, in the
embedded mode, the local address of the server that received the browser's request: the dashboard then
calls the very process it runs in, over HTTP, and never opens the database.

ApiError
 ├── CollectorUnreachable   no answer from the collector (down, wrong URL, timeout)
 └── RunNotFound            404 for a run id
"""

from __future__ import annotations

import threading
from typing import Any
from urllib.parse import quote

import flask
import httpx
import pandas as pd

from services.presentation import CATEGORIES
from services.settings import DashboardSettings

CONFIG_KEY = "GOODPUT_DASHBOARD_CONFIG"
_CLIENTS_KEY = "goodput_http_clients"
_LOCK = threading.Lock()

RANGES_S: dict[str, float | None] = {"1h": 3600.0, "24h": 86400.0, "7d": 7 * 86400.0, "30d": 30 * 86400.0,
                                     "all": None}


class ApiError(Exception):
    """The collector did not give the dashboard what it asked for; the message is shown to the user."""


class CollectorUnreachable(ApiError):
    pass


class RunNotFound(ApiError):
    pass


class Api:
    """A thin client of the collector's read API."""

    def __init__(self, base_url: str, client: httpx.Client, *, authorization: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self._client = client
        self._headers = {"Authorization": authorization} if authorization else None

    def _get(self, path: str, params: dict[str, Any] | None = None, *, pending_ok: bool = False) -> Any:
        url = f"{self.base_url}{path}"
        try:
            response = self._client.get(url, params={k: v for k, v in (params or {}).items() if v is not None},
                                        headers=self._headers)
        except httpx.HTTPError as exc:
            raise CollectorUnreachable(
                f"Cannot reach the collector at {self.base_url} ({exc.__class__.__name__}). "
                "Is `goodput serve` running, and is the dashboard's --api URL right?") from exc
        if response.status_code in (401, 403):
            raise ApiError(f"The collector refused the dashboard's credential: "
                           f"{_error_message(response, response.text[:300])}")
        if response.status_code == 404:
            raise RunNotFound(_error_message(response, f"not found: {path}"))
        if response.status_code == 202 and pending_ok:
            return None
        if response.status_code != 200:
            raise ApiError(f"The collector answered {response.status_code} to {path}: "
                           f"{_error_message(response, response.text[:300])}")
        return response.json()

    # A run is identified by (project, run id): `project` names it for a reader of every project when several
    # projects use the run id (a token of one project always gets its own; None lets the collector resolve it).

    def runs(self, *, status: str | None = None, since: float | None = None, until: float | None = None,
             run_id: str | None = None, project: str | None = None) -> dict[str, Any]:
        return self._get("/v1/runs", {"status": status, "since": since, "until": until,  # type: ignore[no-any-return]
                                      "run_id": run_id or None, "project": project or None})

    def live_runs(self, project: str | None = None) -> dict[str, Any]:
        return self._get("/v1/live", {"project": project or None})  # type: ignore[no-any-return]

    def ledger(self, run_id: str, project: str | None = None) -> dict[str, Any]:
        path = f"/v1/runs/{quote(run_id, safe='')}/waste"
        return self._get(path, {"project": project})  # type: ignore[no-any-return]

    def view(self, run_id: str, project: str | None = None) -> dict[str, Any]:
        """The run page's document: views and ledger of one version; possibly an older one (`stale`) while a
        big run's newest version is being analysed."""
        return self._get(f"/v1/runs/{quote(run_id, safe='')}/view",  # type: ignore[no-any-return]
                         {"stale_ok": "true", "project": project})

    def live(self, run_id: str, project: str | None = None) -> dict[str, Any]:
        return self._get(f"/v1/runs/{quote(run_id, safe='')}/live", {"project": project})  # type: ignore[no-any-return]

    def resume_check(self, run_id: str, project: str | None = None) -> dict[str, Any] | None:
        """The run's resume check, possibly stale; None while its first check is still being computed."""
        return self._get(f"/v1/runs/{quote(run_id, safe='')}/resume-check",  # type: ignore[no-any-return]
                         {"stale_ok": "true", "project": project}, pending_ok=True)


def _error_message(response: httpx.Response, default: str) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return default


def config() -> DashboardSettings:
    cfg = flask.current_app.config.get(CONFIG_KEY)
    return cfg if isinstance(cfg, DashboardSettings) else DashboardSettings()


def api() -> Api:
    """The API client for the current request (call inside a callback)."""
    cfg = config()
    base = cfg.api_url or _local_base_url(flask.request.environ)
    app = flask.current_app
    with _LOCK:
        clients: dict[str, httpx.Client] = app.extensions.setdefault(_CLIENTS_KEY, {})
        client = clients.get(base)
        if client is None:
            client = clients[base] = httpx.Client(timeout=cfg.timeout_s)
    return Api(base, client, authorization=_authorization(cfg))


def _authorization(cfg: DashboardSettings) -> str | None:
    """The browser's own credential (forwarded as is), else the configured GOODPUT_DASHBOARD_TOKEN."""
    sent = flask.request.headers.get("Authorization") if flask.has_request_context() else None
    if sent:
        return sent
    return f"Bearer {cfg.token}" if cfg.token else None


def _local_base_url(environ: dict[str, Any]) -> str:
    """The server that received this request, by its local address (not the Host header a proxy may rewrite)."""
    host = str(environ.get("SERVER_NAME") or "127.0.0.1")
    port = str(environ.get("SERVER_PORT") or "80")
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


# -- shaping API answers ------------------------------------------------------------------------------------


def runs_frame(runs: list[dict[str, Any]], live: list[dict[str, Any]] | None = None) -> pd.DataFrame:
    """/v1/runs rows -> one row per run with waste_<category> columns, worst (most wasted GPU-seconds) first."""
    columns = ["run_id", "project", "status", "first_time", "last_time", "allocated_gpu_seconds", "productive_gpu_seconds",
               "goodput", "restarts", "wasted_gpu_seconds", *(f"waste_{c}" for c in CATEGORIES),
               "seconds_since_progress", "possibly_hung", "at_risk_gpu_seconds", "suspect_ranks", "stale"]
    if not runs:
        return pd.DataFrame({c: [] for c in columns})
    rows = []
    live_by_run = {(row["run_id"], row.get("project")): row for row in (live or [])}
    for run in runs:
        waste = run["waste_gpu_seconds"]
        lv = live_by_run.get((run["run_id"], run.get("project")), {})
        rows.append({
            "run_id": run["run_id"], "project": run.get("project"), "status": run["status"], "first_time": run["first_time"],
            "last_time": run["last_time"], "allocated_gpu_seconds": run["allocated_gpu_seconds"],
            "productive_gpu_seconds": run["productive_gpu_seconds"], "goodput": run["goodput"],
            "restarts": run["restarts"], "wasted_gpu_seconds": sum(waste[c] for c in CATEGORIES),
            **{f"waste_{c}": waste[c] for c in CATEGORIES},
            "seconds_since_progress": lv.get("seconds_since_progress"),
            "possibly_hung": bool(lv.get("possibly_hung", False)),
            "at_risk_gpu_seconds": lv.get("at_risk_gpu_seconds"),
            "suspect_ranks": tuple(lv.get("suspect_ranks") or ()),
            "stale": bool(run.get("stale", False)),  # figures of an older version while a newer one is built
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
    for row in spans.itertuples(index=False):
        start, end = float(row.first_time), max(float(row.last_time), float(row.first_time) + 1e-9)
        amounts = {"productive": row.productive_gpu_seconds, **{c: getattr(row, f"waste_{c}") for c in CATEGORIES}}
        b0, b1 = int((start - first_bucket) // width), int((end - first_bucket) // width)
        for b in range(b0, min(b1, n - 1) + 1):
            overlap = min(end, edges[b + 1]) - max(start, edges[b])
            fraction = overlap / (end - start)
            if fraction <= 0:
                continue
            for c, v in amounts.items():
                out[c][b] += float(v) * fraction
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
