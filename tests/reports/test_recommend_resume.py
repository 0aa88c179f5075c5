"""The resume_correctness provider: advice only when the resume check flagged the run."""

from __future__ import annotations

from services.reports.recommend import (
    DEFAULT_PROVIDERS,
    ReportInput,
    recommend,
    resume_correctness,
)
from tests.reports.ledgers import ledger

LEDGER = ledger(1000.0)


def test_a_flagged_resume_check_becomes_a_recommendation_that_quotes_the_first_finding() -> None:
    check = {"verdict": "flagged", "gpu_seconds_since_first_finding": 400.0, "findings": [
        {"code": "loss_mismatch", "message": "attempt 1 resumed from step 10; ..."},
        {"code": "digest_mismatch", "message": "..."}]}
    (rec,) = recommend(ReportInput(ledger=LEDGER, resume_check=check))
    assert rec.code == "resume_correctness" and rec.gpu_seconds == 400.0
    assert "digest_mismatch, loss_mismatch" in rec.detail and "attempt 1 resumed from step 10" in rec.detail
    assert resume_correctness in DEFAULT_PROVIDERS


def test_no_advice_without_a_check_or_with_an_ok_one() -> None:
    assert recommend(ReportInput(ledger=LEDGER)) == []
    assert recommend(ReportInput(ledger=LEDGER, resume_check={"verdict": "ok", "findings": []})) == []
