"""The resume check's type: what `build_resume_check` returns, what the analysis cache keeps, what the API serves
(`GET /v1/runs/{run_id}/resume-check`) and what the reports and the dashboard read. services.analysis.resume_check
states the rules (and docs/resume-check.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

FindingCode = Literal["digest_mismatch_at_load", "loss_mismatch", "lr_mismatch", "digest_mismatch",
                      "loss_jump_at_resume", "resume_not_a_checkpoint", "skipped_steps", "repeated_steps"]
Verdict = Literal["ok", "flagged", "unverified"]


class EvidenceRow(BaseModel):
    rank: int
    step: int
    expected: float | int | str | None = Field(description="the first computation's value (loss, lr, digest), or "
                                                           "what was due: the step number, the checkpoint step")
    got: float | int | str | None = Field(description="what this attempt reported")
    expected_attempt: int | None = Field(description="the attempt `expected` comes from, when it comes from one")


class Finding(BaseModel):
    code: FindingCode
    attempt: int
    message: str
    ranks: list[int]
    steps: list[int] = Field(description="every step concerned, ascending")
    evidence: dict[str, float | int | str | bool | list[int] | None] = Field(
        description="numbers behind the finding: resume_step, compared, mismatched, tolerance, "
                    "max_relative_difference, checkpoints_completed, jump, median_change, ...")
    examples: list[EvidenceRow] = Field(description="expected vs got, at most max_examples rows")


class ResumeSummary(BaseModel):
    attempt: int
    resume_step: int | None
    resume_reported: bool
    checkpoint_attempt: int | None = Field(description="the attempt that completed the checkpoint at resume_step")
    reference_attempts: list[int] = Field(description="whose values the recomputed steps were compared with")
    recomputed_steps: int = Field(description="distinct steps this attempt computed that a reference computed too")
    compared: dict[str, int] = Field(description="(rank, step) pairs compared: loss, lr, digest; digest_at_load: "
                                                 "ranks whose digest of the state they loaded was compared")
    ok: bool
    verified: bool = Field(True, description="something was compared for it (a recomputed step, the digest at "
                                             "load); false: it loaded a checkpoint and nothing could be compared "
                                             "(`unverified_reason` says why)")
    unverified_reason: str | None = None


class Tolerances(BaseModel):
    loss_rtol: float
    loss_atol: float
    lr_rtol: float
    jump_window: int
    jump_factor: float
    min_jump_samples: int
    max_examples: int


class ResumeCheck(BaseModel):
    run_id: str
    version: int = Field(description="the run version checked (changes with every write)")
    stale: bool = Field(False, description="with stale_ok=true: the run received events since this check; a newer "
                                           "one is being computed")
    verdict: Verdict = Field(description="flagged: any finding; unverified: no finding, but a restart that loaded "
                                         "a checkpoint had nothing compared (`reason`); ok: every such restart "
                                         "was compared and matched (a run that never loaded one has nothing to "
                                         "check)")
    reason: str | None = Field(None, description="why the verdict is unverified: the restarts nothing was compared "
                                                 "for, and what did not arrive")
    findings: list[Finding]
    resumes: list[ResumeSummary] = Field(description="one per attempt after the first")
    notes: list[str] = Field(description="what could not be checked, or was checked and is worth knowing")
    config: Tolerances
    gpu_seconds_since_first_finding: float = Field(
        description="GPU-seconds of the steps computed from the first flagged attempt on: trained on a state "
                    "that differs from the one the run had")
    gpu_seconds_since_first_unverified: float = Field(
        0.0, description="GPU-seconds of the steps computed from the first unverified restart on: trained on a "
                         "state nobody checked")

    @property
    def flagged(self) -> bool:
        return self.verdict == "flagged"
