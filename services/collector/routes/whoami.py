"""`GET /v1/whoami`: what the caller's credential is, for front ends that sign users in (the dashboard)."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter
from pydantic import BaseModel, Field

from services.collector.auth import PrincipalDep

router = APIRouter(tags=["access"])


class WhoAmI(BaseModel):
    kind: Literal["local", "write", "read"] = Field(description=(
        "local: a loopback client of a collector that has no tokens yet; write or read: the token's kind"))
    project: str | None = Field(description="the token's project; null = every project ('*' or local)")
    token_id: str | None = Field(description="the token's public id (never its secret)")


@router.get("/v1/whoami", summary="The caller's access: token kind and project", response_model=WhoAmI)
async def whoami(principal: PrincipalDep) -> WhoAmI:
    return WhoAmI(kind=principal.kind, project=principal.project, token_id=principal.token_id)
