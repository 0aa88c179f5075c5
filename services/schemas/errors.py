"""The error envelope every route answers with (services.collector.errors builds it)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class ErrorBody(BaseModel):
    code: str
    message: str
    index: int | None = None
    event_id: str | None = None
    field: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


# For the decorators of routes of one run (/v1/runs/{run_id}/...): `responses=NOT_FOUND`.
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": ErrorResponse}}
