"""`GET /v1/whoami`: what the caller's credential is, for front ends that sign users in (the dashboard)."""

from __future__ import annotations

from fastapi import APIRouter

from services.collector.deps import PrincipalDep
from services.schemas.status import WhoAmI

router = APIRouter(tags=["access"])


@router.get("/v1/whoami", summary="The caller's access: token kind and project", response_model=WhoAmI)
async def whoami(principal: PrincipalDep) -> WhoAmI:  # async: nothing blocks (the caller is resolved already)
    return WhoAmI(kind=principal.kind, project=principal.project, token_id=principal.token_id)
