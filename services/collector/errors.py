"""Every service error becomes one clear JSON answer; route bodies never build error responses by hand.

`error_response` is the one mapping from an exception to its answer: FastAPI's exception handlers use it, and so
does the ingest endpoint, which answers outside FastAPI's routing (services/collector/ingest_endpoint.py).
"""

from __future__ import annotations

import logging
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from services.errors import (
    EventIdConflict,
    Forbidden,
    InvalidBatch,
    Overloaded,
    RunDetailPruned,
    RunInSeveralProjects,
    RunNotFound,
    StorageUnavailable,
    Unauthenticated,
)
from services.storage.db import UNREACHABLE_ERRORS

logger = logging.getLogger(__name__)
_UNREACHABLE_LOG_EVERY_S = 10.0
_last_unreachable_log = [0.0]


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None,
           **details: object) -> JSONResponse:
    body = {"code": code, "message": message, **{k: v for k, v in details.items() if v is not None}}
    return JSONResponse({"error": body}, status_code=status, headers=headers)


def error_response(exc: Exception, method: str, path: str) -> JSONResponse:
    """The answer to a request that raised `exc`; anything unforeseen is logged and answered 500 in the same shape."""
    if isinstance(exc, RunNotFound):
        return _error(404, "run_not_found", str(exc), run_id=exc.run_id)
    if isinstance(exc, RunInSeveralProjects):
        return _error(409, "run_in_several_projects", str(exc), run_id=exc.run_id, projects=exc.projects)
    if isinstance(exc, RunDetailPruned):
        return _error(410, "run_detail_pruned", str(exc), run_id=exc.run_id, detail_pruned_at=exc.pruned_at)
    if isinstance(exc, EventIdConflict):
        return _error(409, "event_id_conflict", str(exc), index=exc.index, event_id=exc.event_id, run_id=exc.run_id,
                      field=f"events[{exc.index}].event_id")
    if isinstance(exc, InvalidBatch):
        return _error(exc.status, exc.code, str(exc), **exc.details)
    if isinstance(exc, Overloaded):
        return _error(503, "overloaded", f"{exc}; retry the same batch after {exc.retry_after_s} s",
                      headers={"Retry-After": str(exc.retry_after_s)})
    if isinstance(exc, StorageUnavailable):
        return _error(503, "storage_unavailable", f"{exc}; retry after {exc.retry_after_s} s",
                      headers={"Retry-After": str(exc.retry_after_s)})
    if isinstance(exc, UNREACHABLE_ERRORS):
        return _database_unreachable(exc, method, path)
    if isinstance(exc, Unauthenticated):
        return _error(401, "unauthenticated", str(exc), headers={"WWW-Authenticate": 'Bearer realm="goodput"'})
    if isinstance(exc, Forbidden):
        return _error(403, exc.code, str(exc), **exc.details)
    if isinstance(exc, RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return _error(422, "invalid_request", f"{where}: {first.get('msg')}", field=where or None)
    logger.error("unexpected error on %s %s", method, path, exc_info=exc)
    return _error(500, "internal_error",
                  f"the collector failed on this request ({exc.__class__.__name__}); see its log")


def _database_unreachable(exc: Exception, method: str, path: str) -> JSONResponse:
    # Once per interval, not per request: a fleet of clients retries every second while the database is down.
    if time.monotonic() - _last_unreachable_log[0] >= _UNREACHABLE_LOG_EVERY_S:
        _last_unreachable_log[0] = time.monotonic()
        logger.warning("the database is not answering (%s on %s %s): %s", exc.__class__.__name__, method, path,
                       str(exc).splitlines()[0] if str(exc) else "")
    retry_after_s = StorageUnavailable.retry_after_s
    return _error(503, "storage_unavailable",
                  f"the collector's database is not answering ({exc.__class__.__name__}); nothing of this request "
                  f"was stored; retry after {retry_after_s} s", headers={"Retry-After": str(retry_after_s)})


def install_error_handlers(app: FastAPI) -> None:
    async def handle(request: Request, exc: Exception) -> JSONResponse:
        return error_response(exc, request.method, request.url.path)

    for error_class in (RunNotFound, RunInSeveralProjects, RunDetailPruned, EventIdConflict, InvalidBatch,
                        Overloaded, StorageUnavailable, *UNREACHABLE_ERRORS, Unauthenticated, Forbidden,
                        RequestValidationError, Exception):
        app.add_exception_handler(error_class, handle)
