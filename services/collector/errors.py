"""Every service error becomes one clear JSON answer; route bodies never build error responses by hand."""

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


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None,
           **details: object) -> JSONResponse:
    body = {"code": code, "message": message, **{k: v for k, v in details.items() if v is not None}}
    return JSONResponse({"error": body}, status_code=status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RunNotFound)
    async def _not_found(_: Request, exc: RunNotFound) -> JSONResponse:
        return _error(404, "run_not_found", str(exc), run_id=exc.run_id)

    @app.exception_handler(RunInSeveralProjects)
    async def _ambiguous(_: Request, exc: RunInSeveralProjects) -> JSONResponse:
        return _error(409, "run_in_several_projects", str(exc), run_id=exc.run_id, projects=exc.projects)

    @app.exception_handler(RunDetailPruned)
    async def _pruned(_: Request, exc: RunDetailPruned) -> JSONResponse:
        return _error(410, "run_detail_pruned", str(exc), run_id=exc.run_id, detail_pruned_at=exc.pruned_at)

    @app.exception_handler(EventIdConflict)
    async def _event_conflict(_: Request, exc: EventIdConflict) -> JSONResponse:
        return _error(409, "event_id_conflict", str(exc), index=exc.index, event_id=exc.event_id, run_id=exc.run_id,
                      field=f"events[{exc.index}].event_id")

    @app.exception_handler(InvalidBatch)
    async def _invalid(_: Request, exc: InvalidBatch) -> JSONResponse:
        return _error(exc.status, exc.code, str(exc), **exc.details)

    @app.exception_handler(Overloaded)
    async def _overloaded(_: Request, exc: Overloaded) -> JSONResponse:
        return _error(503, "overloaded", f"{exc}; retry the same batch after {exc.retry_after_s} s",
                      headers={"Retry-After": str(exc.retry_after_s)})

    @app.exception_handler(StorageUnavailable)
    async def _storage(_: Request, exc: StorageUnavailable) -> JSONResponse:
        return _error(503, "storage_unavailable", f"{exc}; retry after {exc.retry_after_s} s",
                      headers={"Retry-After": str(exc.retry_after_s)})

    last_logged = [0.0]

    async def _database_unreachable(request: Request, exc: Exception) -> JSONResponse:
        # Once per interval, not per request: a fleet of clients retries every second while the database is down.
        if time.monotonic() - last_logged[0] >= _UNREACHABLE_LOG_EVERY_S:
            last_logged[0] = time.monotonic()
            logger.warning("the database is not answering (%s on %s %s): %s", exc.__class__.__name__,
                           request.method, request.url.path, str(exc).splitlines()[0] if str(exc) else "")
        retry_after_s = StorageUnavailable.retry_after_s
        return _error(503, "storage_unavailable",
                      f"the collector's database is not answering ({exc.__class__.__name__}); nothing of this "
                      f"request was stored; retry after {retry_after_s} s",
                      headers={"Retry-After": str(retry_after_s)})

    for error_class in UNREACHABLE_ERRORS:
        app.add_exception_handler(error_class, _database_unreachable)

    @app.exception_handler(Unauthenticated)
    async def _unauthenticated(_: Request, exc: Unauthenticated) -> JSONResponse:
        return _error(401, "unauthenticated", str(exc), headers={"WWW-Authenticate": 'Bearer realm="goodput"'})

    @app.exception_handler(Forbidden)
    async def _forbidden(_: Request, exc: Forbidden) -> JSONResponse:
        return _error(403, exc.code, str(exc), **exc.details)

    @app.exception_handler(RequestValidationError)
    async def _bad_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return _error(422, "invalid_request", f"{where}: {first.get('msg')}", field=where or None)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unexpected error on %s %s", request.method, request.url.path)
        return _error(500, "internal_error",
                      f"the collector failed on this request ({exc.__class__.__name__}); see its log")
