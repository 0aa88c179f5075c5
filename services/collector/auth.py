"""Who may call the collector: access tokens per project, and localhost only while no token exists.

Rules (README, "Security"):

- No active token in the database: every client that is not on the loopback interface gets 403 with a message
  that says how to create one; loopback clients may do everything (a laptop, `make demo`, the tests).
- Once a token exists, every API request needs one, loopback or not, as `Authorization: Bearer <token>`
  (HTTP Basic with the token as the password works too, for browsers).
  `gpw_...` write tokens may only `POST /v1/events`; `gpr_...` read tokens may only read.
- A token belongs to one project. Runs a write token creates get its project; a batch naming a run of another
  project is refused whole (403). A read token sees only its project's runs: another project's run answers 404,
  exactly like a run that does not exist, and lists leave it out. A read token of project "*" sees every
  project; `/metrics`, whose series span the fleet, needs one.
- `/healthz` needs no token (only the network rule), and neither do `/docs` and `/openapi.json`.

Tokens are looked up by their public id and their secret's salted hash compared in constant time
(services.storage.tokens). Lookups are cached per process for `GOODPUT_AUTH_CACHE_TTL_S` seconds, so a revoked
token stops working within that time; a run's project never changes and is cached until the cache is full.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Literal

from fastapi import Depends, Request
from sqlalchemy import Engine, select
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from services.errors import Forbidden, RunNotFound, Unauthenticated
from services.storage.tables import Run
from services.storage.tokens import ALL_PROJECTS, StoredToken, find_token, has_active_tokens, parse_token, verify_secret

CREATE_HINT = ("create one on the collector's host with `goodput token create --project P --kind write` (for the "
               "training jobs' GOODPUT_TOKEN) or `--kind read` (API, reports, dashboard)")
# Starlette's TestClient reports its peer as "testclient". A socket peer is always an IP address, and a proxy
# that lets a client choose its X-Forwarded-For could as well let it say 127.0.0.1, so this adds no way in.
_LOCAL_NAMES = frozenset({"localhost", "testclient"})
_MAX_CACHED_RUNS = 100_000


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

    def sees(self, project: str | None) -> bool:
        return self.project is None or project is None or project == self.project


@dataclass(slots=True)
class _Cached:
    value: object
    until: float


class Authenticator:
    """Checks credentials against the database with short-lived caches (one per collector process)."""

    def __init__(self, engine: Engine, *, cache_ttl_s: float = 5.0) -> None:
        self._engine = engine
        self._ttl = cache_ttl_s
        self._lock = threading.Lock()
        self._enabled: _Cached | None = None
        self._tokens: dict[str, _Cached] = {}
        self._run_projects: dict[str, str] = {}

    # -- lookups (sync: run them in a thread) ---------------------------------------------------------------

    def enabled(self) -> bool:
        """True once at least one active token exists: from then on every request needs a token."""
        cached = self._enabled
        if cached is not None and cached.until > time.monotonic():
            return bool(cached.value)
        with self._engine.connect() as conn:
            value = has_active_tokens(conn)
        self._enabled = _Cached(value, time.monotonic() + self._ttl)
        return value

    def _stored(self, token_id: str) -> StoredToken | None:
        cached = self._tokens.get(token_id)
        if cached is not None and cached.until > time.monotonic():
            return cached.value  # type: ignore[return-value]
        with self._engine.connect() as conn:
            stored = find_token(conn, token_id)
        with self._lock:
            if len(self._tokens) > 10_000:  # bounded even under a flood of made-up ids
                self._tokens.clear()
            self._tokens[token_id] = _Cached(stored, time.monotonic() + self._ttl)
        return stored

    def project_of(self, run_id: str) -> str | None:
        """The run's project, None if there is no such run (yet)."""
        project = self._run_projects.get(run_id)
        if project is not None:
            return project
        with self._engine.connect() as conn:
            project = conn.execute(select(Run.project).where(Run.run_id == run_id)).scalar()
        if project is not None:
            with self._lock:
                if len(self._run_projects) >= _MAX_CACHED_RUNS:
                    self._run_projects.clear()
                self._run_projects[run_id] = project
        return project

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
        return Principal(kind=kind, project=project, token_id=token_id)  # type: ignore[arg-type]

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
    return request.app.state.auth  # type: ignore[no-any-return]


async def _principal(request: Request) -> Principal:
    return await _authenticator(request).authenticate_request(request)


async def _writer(principal: Annotated[Principal, Depends(_principal)]) -> Principal:
    if principal.kind == "read":
        raise Forbidden("a read token cannot write events; the training jobs need a write token (gpw_...) of the "
                        "project (`goodput token create --project P --kind write`)", code="wrong_token_kind")
    return principal


async def _reader(principal: Annotated[Principal, Depends(_principal)]) -> Principal:
    if principal.kind == "write":
        raise Forbidden("a write token cannot read; use a read token (gpr_...) of the project "
                        "(`goodput token create --project P --kind read`)", code="wrong_token_kind")
    return principal


async def _fleet_reader(principal: Annotated[Principal, Depends(_reader)]) -> Principal:
    if principal.project is not None:
        raise Forbidden(f"this endpoint covers every project; it needs a read token of project {ALL_PROJECTS!r} "
                        f"(this one is for project {principal.project!r})", code="needs_all_projects")
    return principal


async def _readable_run(run_id: str, request: Request,
                        principal: Annotated[Principal, Depends(_reader)]) -> Principal:
    """A run of another project answers 404, like a run that does not exist."""
    return await _run_of_own_project(run_id, request, principal)


async def _run_of_own_project(run_id: str, request: Request, principal: Principal) -> Principal:
    if principal.project is not None:
        project = await run_in_threadpool(_authenticator(request).project_of, run_id)
        if project is not None and project != principal.project:
            raise RunNotFound(run_id)
    return principal


async def _writable_run(run_id: str, request: Request,
                        principal: Annotated[Principal, Depends(_writer)]) -> Principal:
    """A write token acting on one run of its project (a checkpoint request); another project's run is 404."""
    return await _run_of_own_project(run_id, request, principal)


async def _client_run(run_id: str, request: Request,
                      principal: Annotated[Principal, Depends(_principal)]) -> Principal:
    """Either kind of token of the run's project: what a training job polls with its write token."""
    return await _run_of_own_project(run_id, request, principal)


async def _network(request: Request) -> None:
    """Only the network rule: while no token exists, loopback clients only."""
    auth = _authenticator(request)
    host = request.client.host if request.client else None
    enabled = await run_in_threadpool(auth.enabled)
    if not enabled and not is_loopback(host):
        await auth.authenticate_request(request)  # raises the explanatory 403


@dataclass(frozen=True, slots=True)
class RunScope:
    """What a reader may list: `project` for SQL filters (None = all), `allows(run_id)` for lists built otherwise.
    `allows` may read the database: call it from a worker thread."""

    project: str | None
    allows: Callable[[str], bool]


async def _run_scope(request: Request, principal: Annotated[Principal, Depends(_reader)]) -> RunScope:
    auth = _authenticator(request)
    return RunScope(principal.project, lambda run_id: principal.sees(auth.project_of(run_id)))


PrincipalDep = Annotated[Principal, Depends(_principal)]
WritePrincipalDep = Annotated[Principal, Depends(_writer)]
ReadPrincipalDep = Annotated[Principal, Depends(_reader)]
RunScopeDep = Annotated[RunScope, Depends(_run_scope)]
# For route decorators: dependencies=[READ_RUN] and so on.
READ_RUN = Depends(_readable_run)
READ_ANY = Depends(_reader)
READ_FLEET = Depends(_fleet_reader)
WRITE_RUN = Depends(_writable_run)
CLIENT_RUN = Depends(_client_run)
NETWORK = Depends(_network)


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
