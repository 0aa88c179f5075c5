"""Typed API answers for the dashboard's pure pieces: every field the API always sends, with neutral values,
and the ones a test names."""

from __future__ import annotations

from typing import Any

from services.presentation import CATEGORIES
from services.schemas.ledger import Ledger
from services.schemas.live import LiveRun
from services.schemas.resume import ResumeCheck
from services.schemas.run_view import RunView
from services.schemas.runs import RunListItem


def run_item(**fields: Any) -> RunListItem:
    """A row of GET /v1/runs."""
    return RunListItem.model_validate({
        "run_id": "r", "project": "default", "status": "finished", "first_time": 0.0, "last_time": 0.0,
        "allocated_gpu_seconds": 0.0, "productive_gpu_seconds": 0.0, "goodput": None,
        "waste_gpu_seconds": dict.fromkeys(CATEGORIES, 0.0), "restarts": 0, **fields})


def live_run(**fields: Any) -> LiveRun:
    """GET /v1/runs/{run_id}/live of a running run that is not hung."""
    return LiveRun.model_validate({
        "run_id": "r", "project": "default", "status": "running", "attempt": 0, "world_size": 1, "allocated_gpus": 1,
        "version": 1, "server_time": 0.0, "latest_time": None, "seconds_since_last_event": None,
        "last_progress_time": None, "last_step": None, "pending_step": None, "seconds_since_progress": None,
        "median_step_seconds": None, "threshold_seconds": 300.0, "threshold_basis": "floor", "hung": False,
        "hung_for_seconds": None, "suspects": [], "suspect_ranks": [], "at_risk_gpu_seconds": 0.0,
        "possibly_hung": fields.get("hung", False), "stall_threshold_seconds": 300.0, **fields})


def ledger(**fields: Any) -> Ledger:
    """GET /v1/runs/{run_id}/waste of a run that has reported nothing yet."""
    return Ledger.model_validate({
        "run_id": "r", "status": "running", "allocated_gpu_seconds": 0.0, "productive_gpu_seconds": 0.0,
        "waste_gpu_seconds": dict.fromkeys(CATEGORIES, 0.0), "goodput": None, "queue_seconds": 0.0,
        "allocated_wall_seconds": 0.0, "at_risk_gpu_seconds": 0.0, "restarts": 0, "failures": 0,
        "mtbf_seconds": None, "checkpoints": {
            "count": 0, "ok": 0, "failed": 0, "torn": 0, "median_blocking_seconds": None,
            "median_interval_seconds": None, "median_interval_steps": None, "last_ok_step": None},
        "steps": {"furthest": None, "kept": 0, "reworked": 0, "computed": 0}, "straggler_gpu_seconds_by_rank": {},
        "attempts": [], "allocations": [], "first_time": None, "latest_time": None, **fields})


def resume_check(verdict: str, findings: list[dict[str, Any]]) -> ResumeCheck:
    """GET /v1/runs/{run_id}/resume-check; each finding names its code and message, the rest is neutral."""
    return ResumeCheck.model_validate({
        "run_id": "r", "version": 1, "verdict": verdict, "resumes": [], "notes": [],
        "findings": [{"attempt": 1, "ranks": [0], "steps": [], "evidence": {}, "examples": [], **f} for f in findings],
        "config": {"loss_rtol": 0.0, "loss_atol": 0.0, "lr_rtol": 0.0, "jump_window": 1, "jump_factor": 1.0,
                   "min_jump_samples": 1, "max_examples": 1},
        "gpu_seconds_since_first_finding": 0.0})


def run_view(**fields: Any) -> RunView:
    """GET /v1/runs/{run_id}/view of a run that has reported nothing yet."""
    no_rows: dict[str, Any] = {name: value for key in ("allocations", "attempts", "hangs", "failures", "restarts")
               for name, value in ((key, []), (f"{key}_total", 0), (f"{key}_truncated", False))}
    return RunView.model_validate({
        "run_id": "r", "status": "running", "first_time": None, "latest_time": None, "version": 1,
        "timeline": {**no_rows, "segments": [], "idle_gaps": [], "progress": []},
        "progress": {"median_step_seconds": None, "last_progress_time": None, "last_step": None},
        "ranks": {"rows": [], "heatmap": None, "compute_source": None, "straggler_ranks": []},
        "checkpoints": [], "checkpoints_total": 0, "checkpoints_truncated": False,
        "restarts": [], "restarts_total": 0, "restarts_truncated": False,
        "ledger": ledger().model_dump(mode="json"), "stale": False, "run_version": 1, "analysed_at": 0.0,
        "analysis_seconds": 0.0, "live": live_run().model_dump(mode="json"), **fields})
