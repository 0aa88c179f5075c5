"""`GET /v1/runs/{run_id}/resume-check`: steps computed twice (before and after a restart) compared; step numbering.

Thin: services.derive.resume loads the run (with losses and digests) and keeps the check per run version; the
rules are in services.analysis.resume_check and docs/resume-check.md.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from services.collector.deps import AnalysesDep, RunDep
from services.derive.resume import DEFAULT_CONFIG, ResumeCheckPending, recent_resume_check, resume_check
from services.schemas.errors import ErrorResponse
from services.schemas.resume import ResumeCheck

router = APIRouter(tags=["advice"])

STALE_OK_BUDGET_S = 1.0


@router.get("/v1/runs/{run_id:path}/resume-check", response_model=ResumeCheck,
            responses={404: {"model": ErrorResponse},
                       202: {"model": ErrorResponse, "description": "stale_ok=true and the run's first check "
                                                                    "is still being computed: retry shortly"}},
            summary="Did each restart reproduce the steps it recomputed (loss, lr, digest), resume from a checkpoint, "
                    "and number its steps without gaps or repeats?")
def get_resume_check(
    run: RunDep, analyses: AnalysesDep,
    loss_rtol: Annotated[float, Query(ge=0, le=1, description="relative tolerance on recomputed losses; raise it "
                                      "for GPU jobs that are not bitwise deterministic")] = DEFAULT_CONFIG.loss_rtol,
    lr_rtol: Annotated[float, Query(ge=0, le=1)] = DEFAULT_CONFIG.lr_rtol,
    stale_ok: Annotated[bool, Query(description=(
        "answer within about a second (default tolerances only): when the run changed and the check takes "
        "longer (a run of millions of steps), serve the last check (`stale: true`), or 202 when there is none "
        "yet, while the check goes on in the background"))] = False,
) -> ResumeCheck | JSONResponse:
    config = replace(DEFAULT_CONFIG, loss_rtol=loss_rtol, lr_rtol=lr_rtol)
    if stale_ok and config == DEFAULT_CONFIG:
        try:
            check, stale = recent_resume_check(analyses, run, budget_s=STALE_OK_BUDGET_S)
        except ResumeCheckPending:
            return JSONResponse(status_code=202, headers={"Retry-After": "5"}, content={"error": {
                "code": "resume_check_pending",
                "message": f"the resume check of run {run.run_id!r} is being computed; retry in a few seconds"}})
        return check.model_copy(update={"stale": stale})  # the kept check stays as built (stale: False)
    return resume_check(analyses, run, config)
