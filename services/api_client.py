"""One typed client of the collector's HTTP API: the CLI, the dashboards and the simulator reach the server only
through it.

    with ApiClient("http://127.0.0.1:8000", credential=bearer(token)) as api:
        ledger = api.ledger("run-1")  # services.schemas.ledger.Ledger

Answers are typed: the API's own response models, services.schemas' (import them from there; nothing is
re-exported here); documents to save (reports) are bytes. Every failure is an ApiError,
raised from the httpx or pydantic exception behind it; the collector's error envelope (`{"error": {"code",
"message", ...}}`, services/collector/errors.py) is read here and nowhere else:

ApiError                    the API did not give what was asked; str() is a sentence for people
 ├── CollectorUnreachable   no answer: nothing listens at the URL (start `goodput serve`), or none in time
 ├── UnexpectedAnswer       an answer that is not what the API documents (another service at that URL?)
 └── ApiStatusError         the collector refused: .status, .code, .message, .details of its error envelope
      ├── AccessDenied      401 / 403: no credential, an unknown or revoked one, or one that may not do this
      └── NotFound          404: no such run

A credential is one Authorization header value: `bearer(token)` for a token, or a header passed on as it came
(the dashboard forwards the browser's own). Clients made by `with_credential` share one connection pool.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, Literal, TypeVar
from urllib.parse import quote

import httpx
from pydantic import ValidationError

from services.schemas.advice import RunAdvice
from services.schemas.events import IngestAck
from services.schemas.fleet import FleetWindow
from services.schemas.ledger import Ledger
from services.schemas.live import LiveRun, LiveRuns
from services.schemas.ranks import RankDetail
from services.schemas.resume import ResumeCheck
from services.schemas.run_view import RunView
from services.schemas.runs import RunList
from services.schemas.status import WhoAmI
from services.schemas.views import TrainingCurves

__all__ = [
    "AccessDenied", "ApiClient", "ApiError", "ApiStatusError", "CollectorUnreachable", "NotFound", "UnexpectedAnswer",
    "bearer",
]

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 60.0
ADVICE_TIMEOUT_S = 120.0  # the advice reads the ledgers of the run's whole project
REPORT_TIMEOUT_S = 300.0  # a report renders every figure of a run, the fleet CSV a ledger per run


# -- errors ------------------------------------------------------------------------------------------------------


class ApiError(Exception):
    """The API did not give what was asked."""


class CollectorUnreachable(ApiError):
    pass


class UnexpectedAnswer(ApiError):
    pass


class ApiStatusError(ApiError):
    """The collector answered with an error status and its error envelope."""

    def __init__(self, status: int, code: str, message: str, *, path: str,
                 details: Mapping[str, Any] | None = None) -> None:
        super().__init__(f"the collector answered {status}: {message}")
        self.status = status
        self.code = code  # services/collector/errors.py: run_not_found, unauthenticated, ...; "" without an envelope
        self.message = message
        self.path = path
        self.details = dict(details or {})


class AccessDenied(ApiStatusError):
    pass


class NotFound(ApiStatusError):
    pass


def bearer(token: str | None) -> str | None:
    """The Authorization header value of an access token (gpw_... or gpr_...); None without one."""
    return f"Bearer {token}" if token else None


# -- the client --------------------------------------------------------------------------------------------------


class ApiClient:
    """The collector's API at `base_url`; `http` is an httpx client to use (a test's MockTransport, a shared pool)."""

    def __init__(self, base_url: str, *, credential: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 http: httpx.Client | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": credential} if credential else {}
        self._owns_http = http is None
        self._http = http if http is not None else httpx.Client(timeout=timeout_s)

    def with_credential(self, credential: str | None) -> ApiClient:
        """The same API and connection pool, another caller's credential (closing it leaves the pool open)."""
        return ApiClient(self.base_url, credential=credential, http=self._http)

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    # A run is identified by (project, run id): `project` names it for a reader of every project when several
    # projects use the run id; None lets the collector resolve it (a token of one project always gets its own).

    def runs(self, *, status: str | None = None, since: float | None = None, until: float | None = None,
             run_id: str | None = None, project: str | None = None) -> RunList:
        """Every run (of `project`, with events in [since, until], of `status`, whose id contains `run_id`)."""
        params = {"status": status, "since": since, "until": until, "run_id": run_id, "project": project}
        return _parse(self._get("/v1/runs", params), RunList.model_validate_json)

    def fleet_window(self, *, since: float | None = None, until: float | None = None, status: str | None = None,
                     run_id: str | None = None, project: str | None = None, buckets: int = 48) -> FleetWindow:
        """Every run's GPU time inside [since, until) (None: all time, until now), in total and per time bucket."""
        params = {"since": since, "until": until, "status": status, "run_id": run_id, "project": project,
                  "buckets": buckets}
        return _parse(self._get("/v1/fleet/window", params), FleetWindow.model_validate_json)

    def ledger(self, run_id: str, *, project: str | None = None) -> Ledger:
        return _parse(self._get(_run_path(run_id, "waste"), {"project": project}), Ledger.model_validate_json)

    def view(self, run_id: str, *, project: str | None = None) -> RunView:
        """The run page's document; while a big run's newest version is being analysed, possibly an older one
        (`stale`), so that it answers within about a second."""
        response = self._get(_run_path(run_id, "view"), {"stale_ok": "true", "project": project})
        return _parse(response, RunView.model_validate_json)

    def rank(self, run_id: str, rank: int, *, project: str | None = None) -> RankDetail:
        """One rank of the run: host, attempts, steps' compute and collective time, failures it was part of."""
        return _parse(self._get(_run_path(run_id, f"ranks/{int(rank)}"), {"project": project}),
                      RankDetail.model_validate_json)

    def curves(self, run_id: str, *, project: str | None = None) -> TrainingCurves:
        """Loss, learning rate and step time over time, per attempt, downsampled; restarts and checkpoints marked."""
        return _parse(self._get(_run_path(run_id, "curves"), {"project": project}), TrainingCurves.model_validate_json)

    def live(self, run_id: str, *, project: str | None = None) -> LiveRun:
        return _parse(self._get(_run_path(run_id, "live"), {"project": project}), LiveRun.model_validate_json)

    def live_runs(self, *, project: str | None = None) -> LiveRuns:
        return _parse(self._get("/v1/live", {"project": project}), LiveRuns.model_validate_json)

    def resume_check(self, run_id: str, *, project: str | None = None) -> ResumeCheck | None:
        """The run's resume check, possibly stale; None while its first check is still being computed (202)."""
        response = self._get(_run_path(run_id, "resume-check"), {"stale_ok": "true", "project": project})
        return None if response.status_code == 202 else _parse(response, ResumeCheck.model_validate_json)

    def advice(self, run_id: str, *, project: str | None = None) -> RunAdvice:
        response = self._get(_run_path(run_id, "advice"), {"project": project}, timeout_s=ADVICE_TIMEOUT_S)
        return _parse(response, RunAdvice.model_validate_json)

    def report(self, run_id: str, *, format: Literal["json", "csv", "html"] = "html",
               project: str | None = None, self_contained: bool = False) -> bytes:
        """The run's waste report, as the file to write (html: plotly.js inlined when `self_contained`, else
        loaded from the collector)."""
        params = {"format": format, "project": project, "self_contained": "true" if self_contained else None}
        return self._get(_run_path(run_id, "report"), params, timeout_s=REPORT_TIMEOUT_S).content

    def fleet_report(self, *, since: float | None = None, until: float | None = None, status: str | None = None,
                     project: str | None = None) -> bytes:
        """One CSV row per run, as the file to write."""
        params = {"since": since, "until": until, "status": status, "project": project}
        return self._get("/v1/reports/fleet.csv", params, timeout_s=REPORT_TIMEOUT_S).content

    def whoami(self) -> WhoAmI:
        """What this client's credential is worth: its kind and project."""
        return _parse(self._get("/v1/whoami"), WhoAmI.model_validate_json)

    def send_events(self, events: Sequence[Mapping[str, Any]]) -> IngestAck:
        """One batch of events in the wire format (docs/events.md), stored all or nothing."""
        response = self._send("POST", "/v1/events", json={"schema_version": 1, "events": list(events)})
        return _parse(response, IngestAck.model_validate_json)

    def _get(self, path: str, params: Mapping[str, str | float | None] | None = None, *,
             timeout_s: float | None = None) -> httpx.Response:
        return self._send("GET", path, params={k: v for k, v in (params or {}).items() if v not in (None, "")},
                          timeout_s=timeout_s)

    def _send(self, method: str, path: str, *, params: Mapping[str, str | float] | None = None,
              json: Any = None, timeout_s: float | None = None) -> httpx.Response:
        # no `timeout` unless asked: the client's default then, whatever HTTP client it is (Starlette's TestClient
        # is built on httpx2, whose sentinel for "the default" is not httpx's)
        url = self.base_url + path
        try:
            if timeout_s is None:
                response = self._http.request(method, url, params=params, json=json, headers=self._headers)
            else:
                response = self._http.request(method, url, params=params, json=json, headers=self._headers,
                                              timeout=timeout_s)
        except httpx.TransportError as exc:
            raise CollectorUnreachable(_unreachable(self.base_url, exc)) from exc
        if response.status_code >= 400:
            raise _status_error(response, path)
        return response


def _run_path(run_id: str, what: str) -> str:
    return f"/v1/runs/{quote(run_id, safe='')}/{what}"


def _unreachable(base_url: str, exc: httpx.TransportError) -> str:
    if isinstance(exc, httpx.ConnectError):
        return (f"cannot reach the collector at {base_url} ({exc}): is it running? Start it with `goodput serve`, "
                "or give the URL it listens on")
    if isinstance(exc, httpx.TimeoutException):
        return f"the collector at {base_url} did not answer in time ({exc.__class__.__name__})"
    return f"cannot reach the collector at {base_url} ({exc.__class__.__name__}: {exc})"


def _status_error(response: httpx.Response, path: str) -> ApiStatusError:
    """The collector's error envelope as an exception: the one reader of `{"error": {"code", "message", ...}}`."""
    try:
        error = response.json()["error"]
        message = str(error["message"])
        code = str(error.get("code", ""))
        details = {key: value for key, value in error.items() if key not in ("code", "message")}
    except (ValueError, KeyError, TypeError, AttributeError):  # no envelope: a proxy's page, another service
        message, code, details = response.text[:300] or response.reason_phrase, "", {}
    kind = AccessDenied if response.status_code in (401, 403) else NotFound if response.status_code == 404 \
        else ApiStatusError
    return kind(response.status_code, code, message, path=path, details=details)


def _parse(response: httpx.Response, validate: Callable[[bytes], T]) -> T:
    """The answer's JSON, read by a pydantic validator (`Ledger.model_validate_json`, ...)."""
    try:
        return validate(response.content)
    except ValidationError as exc:
        raise UnexpectedAnswer(f"the answer of {response.url} is not what the collector's API documents "
                               f"({exc.error_count()} error(s), first: {exc.errors()[0]['msg']}); is this URL "
                               "a goodput collector of this version?") from exc
