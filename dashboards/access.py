"""Who may open a standalone dashboard (`python -m dashboards`, `dashboards.wsgi`): the collector's rules, asked of
the collector itself.

The dashboard reads the collector's API with the browser's own credential, so a browser must bring one:
HTTP Basic with a read token as the password (any user name), as the dashboard mounted in the collector asks.
The credential is checked with the collector (`GET /v1/whoami`, cached for a few seconds per credential):

- a read token: served, and every figure is scoped to the token's project by the API itself;
- a write token, or one the collector refuses: 401 with a Basic challenge and the collector's reason;
- no credential: only a browser on the dashboard's own host (loopback) may go on, and only if the collector
  accepts the dashboard's own access (no tokens yet and the dashboard on the collector's host, or
  GOODPUT_DASHBOARD_TOKEN); any other browser is asked to sign in. The dashboard never passes its own
  localhost privilege or configured token on to a browser on another host.

`/healthz` needs nothing (container health checks).
"""

from __future__ import annotations

import ipaddress
import threading
import time
from dataclasses import dataclass

import flask

from services.api_client import AccessDenied, ApiClient, ApiError, ApiStatusError, bearer
from services.settings import DashboardSettings

CACHE_TTL_S = 5.0
_MAX_CACHED = 10_000
SIGN_IN = "sign in with a read token: any user name, the token (gpr_...) as the password"


@dataclass(frozen=True, slots=True)
class Verdict:
    allowed: bool
    status: int  # when refused: 401 (ask again), 403 (no credential can help), 503 (collector unreachable)
    message: str
    kind: str | None = None  # local, read or write, as the collector says


def is_loopback(address: str | None) -> bool:
    if not address:
        return False
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


class CredentialCheck:
    """Asks the collector what a credential is worth; answers cached per credential for `ttl_s`."""

    def __init__(self, api_url: str, *, timeout_s: float, ttl_s: float = CACHE_TTL_S) -> None:
        self._api = ApiClient(api_url, timeout_s=timeout_s)
        self._ttl_s = ttl_s
        self._lock = threading.Lock()
        self._cache: dict[str | None, tuple[float, Verdict]] = {}

    def verdict(self, authorization: str | None) -> Verdict:
        now = time.monotonic()
        cached = self._cache.get(authorization)
        if cached is not None and cached[0] > now:
            return cached[1]
        verdict = self._ask(authorization)
        if verdict.status != 503:  # an unreachable collector is asked again next time
            with self._lock:
                if len(self._cache) >= _MAX_CACHED:
                    self._cache.clear()
                self._cache[authorization] = (now + self._ttl_s, verdict)
        return verdict

    def _ask(self, authorization: str | None) -> Verdict:
        try:
            kind = self._api.with_credential(authorization).whoami().kind
        except AccessDenied as exc:
            return Verdict(False, 401, f"the collector refused this credential: {exc.message}")
        except ApiStatusError as exc:
            return Verdict(False, 503, f"the collector could not check the credential: {exc.message}")
        except ApiError as exc:  # no answer, or not a collector's
            return Verdict(False, 503, f"{exc}; try again shortly")
        if kind == "write":
            return Verdict(False, 401, "the dashboard needs a read token (gpr_...), not a write token", kind)
        return Verdict(True, 200, "", kind)


def require_sign_in(server: flask.Flask, config: DashboardSettings, check: CredentialCheck | None = None) -> None:
    """Guard every request of a standalone dashboard's Flask server (pages, callbacks, assets)."""
    if config.api_url is None:
        raise ValueError("a standalone dashboard needs the collector's URL (--api or GOODPUT_DASHBOARD_API_URL)")
    check = check or CredentialCheck(config.api_url, timeout_s=min(config.timeout_s, 10.0))
    own = bearer(config.token)

    @server.before_request
    def _guard() -> flask.Response | None:
        if flask.request.path.rstrip("/").endswith("/healthz"):
            return None
        sent = flask.request.headers.get("Authorization")
        browser_is_local = is_loopback(flask.request.remote_addr)
        if sent:
            verdict = check.verdict(sent)
            if verdict.allowed and verdict.kind == "local" and not browser_is_local:
                # The collector has no tokens and trusts the dashboard as a local client: that trust is the
                # dashboard host's, not a remote browser's, whatever it typed.
                return _refuse(Verdict(False, 403, "the collector has no access tokens yet, so this dashboard "
                                                   "serves only browsers on its own host; create a read token "
                                                   "(`goodput token create --kind read`) and sign in with it"))
            return None if verdict.allowed else _refuse(verdict)
        if browser_is_local:
            verdict = check.verdict(own)
            if verdict.allowed:
                return None
            return _refuse(Verdict(False, 401 if verdict.status != 503 else 503,
                                   f"{SIGN_IN} ({verdict.message})"))
        return _refuse(Verdict(False, 401, SIGN_IN))

    @server.route("/healthz")
    def _healthz() -> flask.Response:
        return flask.jsonify({"status": "ok"})


def _refuse(verdict: Verdict) -> flask.Response:
    response = flask.jsonify({"error": {"code": "unauthenticated" if verdict.status == 401 else "forbidden"
                                        if verdict.status == 403 else "collector_unavailable",
                                        "message": verdict.message}})
    response.status_code = verdict.status
    if verdict.status == 401:
        response.headers["WWW-Authenticate"] = 'Basic realm="goodput dashboard", charset="UTF-8"'
    if verdict.status == 503:
        response.headers["Retry-After"] = "2"
    return response
