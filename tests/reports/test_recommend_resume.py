"""The resume_correctness provider: advice only when the resume check flagged the run."""

from __future__ import annotations

from dataclasses import asdict

from services.analysis.resume_check import ResumeCheckConfig
from services.analysis.resume_types import Finding, FindingCode, ResumeCheck, Tolerances
from services.reports.recommend import (
    DEFAULT_PROVIDERS,
    ReportInput,
    recommend,
    resume_correctness,
)
from tests.reports.ledgers import ledger

LEDGER = ledger(1000.0)
TOLERANCES = Tolerances(**asdict(ResumeCheckConfig()))


def finding(code: FindingCode, message: str) -> Finding:
    return Finding(code=code, attempt=1, message=message, ranks=[0], steps=[11], evidence={}, examples=[])


def resume_check(findings: list[Finding], gpu_seconds: float = 0.0) -> ResumeCheck:
    return ResumeCheck(run_id="r", version=1, verdict="flagged" if findings else "ok", findings=findings, resumes=[],
                       notes=[], config=TOLERANCES, gpu_seconds_since_first_finding=gpu_seconds)


def test_a_flagged_resume_check_becomes_a_recommendation_that_quotes_the_first_finding() -> None:
    check = resume_check([finding("loss_mismatch", "attempt 1 resumed from step 10; ..."),
                          finding("digest_mismatch", "...")], gpu_seconds=400.0)
    (rec,) = recommend(ReportInput(ledger=LEDGER, resume_check=check))
    assert rec.code == "resume_correctness" and rec.gpu_seconds == 400.0
    assert "digest_mismatch, loss_mismatch" in rec.detail and "attempt 1 resumed from step 10" in rec.detail
    assert resume_correctness in DEFAULT_PROVIDERS


def test_no_advice_without_a_check_or_with_an_ok_one() -> None:
    assert recommend(ReportInput(ledger=LEDGER)) == []
    assert recommend(ReportInput(ledger=LEDGER, resume_check=resume_check([]))) == []
