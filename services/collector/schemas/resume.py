"""Response model of `GET /v1/runs/{run_id}/resume-check`: services.analysis.resume_types' `ResumeCheck` (built by
services.analysis.resume_check, docs/resume-check.md), re-exported for the API's users."""

from __future__ import annotations

from services.analysis.resume_types import EvidenceRow, Finding, ResumeCheck, ResumeSummary, Tolerances

__all__ = ["EvidenceRow", "Finding", "ResumeCheck", "ResumeSummary", "Tolerances"]
