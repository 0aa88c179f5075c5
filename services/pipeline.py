"""The one place storage and analysis meet: load a run, build its ledger, keep it while the run is unchanged."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Engine, update

from services.analysis.ledger import build_ledger
from services.storage.load import RunRow, get_run, last_ok_checkpoint, list_runs, load_run_data
from services.storage.tables import Run


def ledger_for_run(engine: Engine, run_id: str) -> dict[str, Any]:
    """The run's ledger as served by the API (cached in the database until the run receives events)."""
    with engine.connect() as conn:
        run = get_run(conn, run_id)
    return ledger_for_row(engine, run)


def ledger_for_row(engine: Engine, run: RunRow) -> dict[str, Any]:
    if run.ledger_json is not None and run.ledger_version == run.version:
        return json.loads(run.ledger_json)  # type: ignore[no-any-return]
    with engine.connect() as conn:
        data = load_run_data(conn, run)
    ledger = build_ledger(data).to_dict()
    with engine.begin() as conn:  # only if no event arrived meanwhile
        conn.execute(
            update(Run).where(Run.id == run.pk, Run.version == run.version)
            .values(ledger_json=json.dumps(ledger), ledger_version=run.version, status=ledger["status"])
        )
    return ledger


def run_detail(engine: Engine, run_id: str) -> dict[str, Any]:
    """GET /v1/runs/{run_id}: the run's structure, from its ledger."""
    ledger = ledger_for_run(engine, run_id)
    attempts = ledger["attempts"]
    last_steps = [a["last_step"] for a in attempts if a["last_step"] is not None]
    last_ok = ledger["checkpoints"]["last_ok_step"]
    last_checkpoint = None
    if last_ok is not None:
        with engine.connect() as conn:
            last_checkpoint = last_ok_checkpoint(conn, get_run(conn, run_id).pk)
    return {
        "run_id": ledger["run_id"], "status": ledger["status"], "first_time": ledger["first_time"],
        "last_time": ledger["latest_time"], "attempts": attempts,
        "world_sizes": sorted({a["world_size"] for a in attempts}), "restarts": ledger["restarts"],
        "last_step": max(last_steps) if last_steps else None, "last_checkpoint": last_checkpoint,
        "allocated_gpu_seconds": ledger["allocated_gpu_seconds"], "goodput": ledger["goodput"],
    }


def fleet_ledgers(engine: Engine, *, limit: int = 2000) -> list[dict[str, Any]]:
    """The ledgers of the most recent runs (cached per run), for fleet-wide estimates."""
    with engine.connect() as conn:
        rows = list_runs(conn, limit=limit)
    return [ledger_for_row(engine, row) for row in rows]
