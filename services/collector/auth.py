"""Who may call the collector: access tokens per project, and localhost only while no token exists.

Rules (README, "Security"):

- No active token in the database: every client that is not on the loopback interface gets 403 with a message
  that says how to create one; loopback clients may do everything (a laptop, `make demo`, the tests).
- Once a token exists, every API request needs one, loopback or not, as `Authorization: Bearer <token>`
  (HTTP Basic with the token as the password works too, for browsers).
  `gpw_...` write tokens may only `POST /v1/events`; `gpr_...` read tokens may only read.
- A token belongs to one project, and a run is identified by (project, run id): a write token's batches go to
  the runs of its project (created there if new), so two projects may use the same run id without seeing or
  affecting each other. A read token sees only its project's runs: any other run id answers 404, exactly like
  a run that does not exist, and lists leave other projects out. A read token of project "*" (and a local
  client while no token exists) sees every project: a run id that several projects use needs `?project=P`
  (else 409 listing them). `/metrics`, whose series span the fleet, needs a '*' token.
- `/healthz` needs no token (only the network rule), and neither do `/docs` and `/openapi.json`.

Tokens are looked up by their public id and their secret's salted hash compared in constant time
(services.storage.tokens). Lookups are cached per process for `GOODPUT_AUTH_CACHE_TTL_S` seconds, so a revoked
token stops working within that time. Every route of one run resolves it for the caller with one of the run
dependencies below (services.storage.runs.resolve_run: one index lookup); services.collector.deps names them
for the routes (`RunDep`, `WriteRunDep`, `ClientRunDep`).
"""

from __future__ import annotations

import base64
import binascii
import functools
import ipaddress
import threading
import time
from dataclasses import dataclass
from typing import Annotated, Generic, Literal, TypeVar, cast

from fastapi import Depends, Query, Request
from sqlalchemy import Engine
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from services.derive.runs import RunScope
from services.errors import Forbidden, Unauthenticated
from services.storage.runs import RunRow, resolve_run
from services.storage.tokens import (
    ALL_PROJECTS,
    PROJECT_RE,
    StoredToken,
    find_token,
    has_active_tokens,
    parse_token,
    verify_secret,
)

CREATE_HINT = ("create one on the collector's host with `goodput token create --project P --kind write` (for the "
               "training jobs' GOODPUT_TOKEN) or `--kind read` (API, reports, dashboard)")
# Starlette's TestClient reports its peer as "testclient". A socket peer is always an IP address, and a proxy
# that lets a client choose its X-Forwarded-For could as well let it say 127.0.0.1, so this adds no way in.
_LOCAL_NAMES = frozenset({"localhost", "testclient"})


@functools.lru_cache(maxsize=4096)  # asked on every request; parsing the address is most of its cost
def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    if host in _LOCAL_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True, kw_only=True)
class Principal:
    """Who is calling. `project` None = every project (a loopback client while no token exists, or project "*")."""

    kind: Literal["local", "write", "read"]
    project: str | None
    token_id: str | None = None


V = TypeVar("V")


@dataclass(slots=True)
class _Cached(Generic[V]):
    value: V
    until: float


class Authenticator:
    """Checks credentials against the database with short-lived caches (one per collector process)."""

    def __init__(self, engine: Engine, *, cache_ttl_s: float = 5.0) -> None:
        self._engine = engine
        self._ttl = cache_ttl_s
        self._lock = threading.Lock()
        self._enabled: _Cached[bool] | None = None
        self._tokens: dict[str, _Cached[StoredToken | None]] = {}

    # -- lookups (sync: run them in a thread) ---------------------------------------------------------------

    def enabled(self) -> bool:
        """True once at least one active token exists: from then on every request needs a token."""
        cached = self._enabled
        if cached is not None and cached.until > time.monotonic():
            return cached.value
        with self._engine.connect() as conn:
            value = has_active_tokens(conn)
        self._enabled = _Cached(value, time.monotonic() + self._ttl)
        return value

    def _stored(self, token_id: str) -> StoredToken | None:
        cached = self._tokens.get(token_id)
        if cached is not None and cached.until > time.monotonic():
            return cached.value
        with self._engine.connect() as conn:
            stored = find_token(conn, token_id)
        with self._lock:
            if len(self._tokens) > 10_000:  # bounded even under a flood of made-up ids
                self._tokens.clear()
            self._tokens[token_id] = _Cached(stored, time.monotonic() + self._ttl)
        return stored

    def resolve_run(self, principal: Principal, run_id: str, project: str | None) -> RunRow:
        """The run `principal` names (services.storage.runs.resolve_run): RunNotFound for one it may not see."""
        with self._engine.connect() as conn:
            return resolve_run(conn, run_id, own_project=principal.project, project=project)

    def authenticate(self, credential: str | None, client_host: str | None) -> Principal:
        if not self.enabled():
            if is_loopback(client_host):
                return Principal(kind="local", project=None)
            raise Forbidden(
                f"this collector has no access tokens yet, so it accepts only connections from localhost (you "
                f"connected from {client_host}); {CREATE_HINT}, then send it as 'Authorization: Bearer <token>'",
                code="auth_not_configured")
        if not credential:
            raise Unauthenticated("this collector requires an access token: send 'Authorization: Bearer <token>' "
                                  "(the client reads GOODPUT_TOKEN); " + CREATE_HINT)
        parsed = parse_token(credential)
        if parsed is None:
            raise Unauthenticated("the credential is not a goodput token (expected gpw_<id>_<secret> for writing "
                                  "or gpr_<id>_<secret> for reading)")
        kind, token_id, secret = parsed
        stored = self._stored(token_id)
        if not verify_secret(stored, secret) or stored is None or stored.info.kind != kind:
            raise Unauthenticated(f"token {token_id} is unknown or its secret is wrong (`goodput token list` shows "
                                  "the valid ones)")
        if not stored.info.active:
            raise Unauthenticated(f"token {token_id} was revoked; ask for a new one (`goodput token create`)")
        project = None if stored.info.project == ALL_PROJECTS else stored.info.project
        return Principal(kind=kind, project=project, token_id=token_id)

    # -- async front: cache hits never leave the event loop -----------------------------------------------

    async def authenticate_request(self, request: Request) -> Principal:
        return await self.authenticate_scope(request.scope)

    async def authenticate_scope(self, scope: Scope) -> Principal:
        credential = credential_from_headers(scope)
        client = scope.get("client")
        host = client[0] if client else None
        if self._is_cache_fresh(credential):
            return self.authenticate(credential, host)
        return await run_in_threadpool(self.authenticate, credential, host)

    def _is_cache_fresh(self, credential: str | None) -> bool:
        now = time.monotonic()
        if self._enabled is None or self._enabled.until <= now:
            return False
        if not self._enabled.value or not credential:
            return True
        parsed = parse_token(credential)
        cached = self._tokens.get(parsed[1]) if parsed else None
        return parsed is None or (cached is not None and cached.until > now)


def credential_from_headers(scope: Scope) -> str | None:
    """The token in `Authorization: Bearer <token>`, or the password (else user name) of HTTP Basic."""
    for name, value in scope.get("headers", ()):
        if name != b"authorization":
            continue
        text = value.decode("latin-1").strip()
        scheme, _, rest = text.partition(" ")
        rest = rest.strip()
        if scheme.lower() == "bearer":
            return rest or None
        if scheme.lower() == "basic":
            try:
                user, _, password = base64.b64decode(rest, validate=True).decode("utf-8").partition(":")
            except (binascii.Error, UnicodeDecodeError):
                return None
            return password or user or None
        return text or None
    return None


# -- FastAPI dependencies ---------------------------------------------------------------------------------------


def _authenticator(request: Request) -> Authenticator:
    return cast(Authenticator, request.app.state.auth)


async def caller(request: Request) -> Principal:
    return await _authenticator(request).authenticate_request(request)


async def write_caller(request: Request) -> Principal:
    return require_writer(await caller(request))


def require_writer(principal: Principal) -> Principal:
    if principal.kind == "read":
        raise Forbidden("a read token cannot write events; the training jobs need a write token (gpw_...) of the "
                        "project (`goodput token create --project P --kind write`)", code="wrong_token_kind")
    return principal


async def read_caller(principal: Annotated[Principal, Depends(caller)]) -> Principal:
    if principal.kind == "write":
        raise Forbidden("a write token cannot read; use a read token (gpr_...) of the project "
                        "(`goodput token create --project P --kind read`)", code="wrong_token_kind")
    return principal


async def fleet_read_caller(principal: Annotated[Principal, Depends(read_caller)]) -> Principal:
    if principal.project is not None:
        raise Forbidden(f"this endpoint covers every project; it needs a read token of project {ALL_PROJECTS!r} "
                        f"(this one is for project {principal.project!r})", code="needs_all_projects")
    return principal


ProjectQuery = Annotated[str | None, Query(
    max_length=64, pattern=PROJECT_RE.pattern, description="the run's project; needed only by a reader of every "
    "project ('*' token, or local without tokens) when several projects use the run id. A token of one project "
    "always gets its own run")]


def readable_run(run_id: str, request: Request, principal: Annotated[Principal, Depends(read_caller)],
                 project: ProjectQuery = None) -> RunRow:
    """The run a reader names; another project's run answers 404, like a run that does not exist."""
    return _authenticator(request).resolve_run(principal, run_id, project)


def writable_run(run_id: str, request: Request, principal: Annotated[Principal, Depends(write_caller)],
                 project: ProjectQuery = None) -> RunRow:
    """A write token acting on one run of its project (a checkpoint request); any other is 404."""
    return _authenticator(request).resolve_run(principal, run_id, project)


def client_run(run_id: str, request: Request, principal: Annotated[Principal, Depends(caller)],
               project: ProjectQuery = None) -> RunRow:
    """Either kind of token of the run's project: what a training job polls with its write token."""
    return _authenticator(request).resolve_run(principal, run_id, project)


def network_rule(request: Request) -> None:
    """Only the network rule: while no token exists, loopback clients only."""
    auth = _authenticator(request)
    host = request.client.host if request.client else None
    if not auth.enabled() and not is_loopback(host):
        auth.authenticate(credential_from_headers(request.scope), host)  # raises the explanatory 403


async def run_scope(principal: Annotated[Principal, Depends(read_caller)], project: Annotated[str | None, Query(
        max_length=64, pattern=PROJECT_RE.pattern,
        description="only runs of this project (a token of one project sees only its own)")] = None) -> RunScope:
    if principal.project is None:
        return RunScope(project)
    return RunScope(principal.project, matches_nothing=project is not None and project != principal.project)


# For route decorators: dependencies=[READ_FLEET] and so on.
READ_FLEET = Depends(fleet_read_caller)
NETWORK = Depends(network_rule)


# -- the dashboard mount ----------------------------------------------------------------------------------------


class DashboardGuard:
    """ASGI wrapper for /dashboard/: the same rules as the read API, with a Basic-auth challenge so that a browser
    asks for the read token (any user name, the token as password). The dashboard forwards that header to the
    API, which then scopes what it shows to the token's project."""

    def __init__(self, app: ASGIApp, auth: Authenticator) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            principal = await self.auth.authenticate_scope(scope)
            if principal.kind == "write":
                raise Forbidden("the dashboard needs a read token (gpr_...), not a write token")
        except Unauthenticated as exc:
            response = JSONResponse({"error": {"code": "unauthenticated", "message": str(exc)}}, status_code=401,
                                    headers={"WWW-Authenticate": 'Basic realm="goodput dashboard", charset="UTF-8"'})
            await response(scope, receive, send)
            return
        except Forbidden as exc:
            response = JSONResponse({"error": {"code": exc.code, "message": str(exc)}}, status_code=403)
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)
