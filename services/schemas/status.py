"""Response models of the collector's own status: its health, and the caller's access."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class Health(BaseModel):
    status: Literal["ok", "degraded"]
    database: str = Field(description="ok, or unreachable: <error class>")
    pending_events: int = Field(description="events accepted and waiting for the database")


class WhoAmI(BaseModel):
    kind: Literal["local", "write", "read"] = Field(description=(
        "local: a loopback client of a collector that has no tokens yet; write or read: the token's kind"))
    project: str | None = Field(description="the token's project; null = every project ('*' or local)")
    token_id: str | None = Field(description="the token's public id (never its secret)")
