"""Where storage and live hang detection meet: a few index lookups per running run, the server's clock.

The hang verdict comes from `services.storage.live` (fresh on every call: no cache, no full load of the run).
The at-risk GPU-seconds come from the run's ledger, which needs the whole run: a fresh one when it is built
within `LEDGER_BUDGET_S`, else the one stored in the database while a single, paced background build
catches up (services.derive.ledger.recent_ledger), so polling `/v1/runs/{id}/live` every 0.2 s never analyses
the run 5 times a second.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sqlalchemy import Engine

from services.analysis.live import LiveConfig, LiveStatus, detect_hang
from services.analysis.provisional import LiveHang, provisional_ledger
from services.analysis.preemption import allocated_gpus, rank_preemption_candidates
from services.derive import ledger as pipeline
from services.settings import ServiceSettings
from services.storage.checkpoint_requests import (
    CheckpointRequestRow,
    create_request,
    list_requests,
    pending_requests,
    resolve_fulfilled,
)
from services.storage.live import load_live_state
from services.storage.load import RunRef, RunRow, get_run, list_runs

LEDGER_BUDGET_S = 0.5
MAX_FLEET_SUSPECTS = 16  # suspects listed per run in /v1/live (the per-run endpoint: LiveConfig.max_suspects)


def live_config(settings: ServiceSettings) -> LiveConfig:
    live = settings.live
    return LiveConfig(floor_s=live.hang_floor_s, step_factor=live.hang_step_factor,
                      heartbeat_interval_s=live.heartbeat_interval_s)


def live_status(engine: Engine, row: RunRow, now: float, config: LiveConfig) -> LiveStatus:
    """The run's hang verdict judged as running (a few index lookups; the caller knows it is running)."""
    with engine.connect() as conn:
        state = load_live_state(conn, row, now=now, lookback_s=max(60.0, 4 * config.silent_after_s),
                                recent_steps=config.recent_steps)
    return detect_hang(replace(state, status="running"), now, config)


def live_hang_of(status: LiveStatus) -> LiveHang | None:
    """The provisional hang's input when live detection calls the run hung."""
    if not status.hung or status.last_progress_time is None:
        return None
    return LiveHang(since=status.last_progress_time)


def live_hang_of_answer(live: dict[str, Any]) -> LiveHang | None:
    """The same, from a `live_for_row` answer (the run page has one already)."""
    if not live.get("hung") or live.get("last_progress_time") is None:
        return None
    return LiveHang(since=float(live["last_progress_time"]))


def with_live_hang(engine: Engine, row: RunRow, ledger: dict[str, Any], now: float,
                   config: LiveConfig) -> dict[str, Any]:
    """`ledger` with the provisional hang of a hung running run booked up to `now` (services.analysis.provisional);
    the ledger itself for a run that is not running (no lookups)."""
    if ledger.get("status") != "running":
        return ledger
    return provisional_ledger(ledger, live_hang_of(live_status(engine, row, now, config)), now)


def ledger_now(engine: Engine, ref: RunRef, now: float, config: LiveConfig) -> dict[str, Any]:
    """GET /v1/runs/{run_id}/waste: the ledger of the run's current version, with a live hang provisionally."""
    with engine.connect() as conn:
        row = get_run(conn, ref)
    return with_live_hang(engine, row, pipeline.ledger_for_row(engine, row), now, config)


def recent_ledger(engine: Engine, row: RunRow, budget_s: float = LEDGER_BUDGET_S) -> dict[str, Any]:
    """The run's ledger, fresh when it is built within `budget_s`, else the stored one (refreshed in the
    background): polling a big live run never waits for a full analysis."""
    return pipeline.recent_ledger(engine, row, budget_s=budget_s)[0]


def live_for_row(engine: Engine, row: RunRow, now: float, config: LiveConfig, *,
                 with_ranks: bool = True, ledger_budget_s: float = LEDGER_BUDGET_S) -> dict[str, Any]:
    ledger = recent_ledger(engine, row, ledger_budget_s)
    with engine.connect() as conn:
        state = load_live_state(conn, row, now=now, lookback_s=max(60.0, 4 * config.silent_after_s),
                                recent_steps=config.recent_steps)
    status = ledger["status"] if row.status == "running" else row.status
    state = replace(state, status=status)
    out = detect_hang(state, now, config).to_dict(with_ranks=with_ranks)
    latest = row.last_time
    out.update({
        "project": row.project, "version": row.version, "latest_time": latest,
        "seconds_since_last_event": (now - latest) if latest is not None else None,
        "at_risk_gpu_seconds": float(ledger.get("at_risk_gpu_seconds", 0.0)),
        "allocated_gpus": max(allocated_gpus(ledger), state.world_size),
    })
    if not with_ranks and len(out["suspects"]) > MAX_FLEET_SUSPECTS:
        out["suspects_truncated"] = out["suspects_total"]
        out["suspects"] = out["suspects"][:MAX_FLEET_SUSPECTS]
        out["suspect_ranks"] = out["suspect_ranks"][:MAX_FLEET_SUSPECTS]
    return out


def live_for_run(engine: Engine, ref: RunRef, now: float, config: LiveConfig, *,
                 ledger_budget_s: float = LEDGER_BUDGET_S) -> dict[str, Any]:
    with engine.connect() as conn:
        row = get_run(conn, ref)
    return live_for_row(engine, row, now, config, ledger_budget_s=ledger_budget_s)


def live_for_running_runs(engine: Engine, now: float, config: LiveConfig, *, limit: int = 500,
                          project: str | None = None) -> list[dict[str, Any]]:
    """Every running run (of `project`; None = every project), hung ones first, then by seconds since progress
    (longest first)."""
    with engine.connect() as conn:
        rows = list_runs(conn, status="running", limit=limit, project=project)
    out = [live_for_row(engine, row, now, config, with_ranks=False) for row in rows]
    out = [r for r in out if r["status"] == "running"]
    out.sort(key=lambda r: (not r["hung"], -(r["seconds_since_progress"] or 0.0), r["run_id"], r["project"]))
    return out


# -- preemption cost and checkpoint requests -----------------------------------------------------------------


def preemption_candidates(engine: Engine, now: float, config: LiveConfig, *, limit: int = 500,
                          project: str | None = None) -> list[dict[str, Any]]:
    """Running runs (of `project`; None = every project), cheapest to preempt now first, with the components of
    the cost and each run's project."""
    with engine.connect() as conn:
        rows = list_runs(conn, status="running", limit=limit, project=project)
    # the ranking knows runs by their ledgers' run_id, which is not unique across projects: rank by
    # (run id, project, row) instead (the same order on ties) and put the run id back afterwards
    ledgers = [{**recent_ledger(engine, row), "run_id": (row.run_id, row.project, k)} for k, row in enumerate(rows)]
    ranked = rank_preemption_candidates(ledgers)
    with engine.begin() as conn:
        for row in rows:
            resolve_fulfilled(conn, row.pk)
        pending = {r.run_pk: r.id for r in reversed(pending_requests(conn, [row.pk for row in rows]))}
    for item in ranked:
        row = rows[item["run_id"][2]]
        item.update(run_id=row.run_id, project=row.project)
        with engine.connect() as conn:
            state = load_live_state(conn, row, now=now, lookback_s=max(60.0, 4 * config.silent_after_s))
        item["hung"] = detect_hang(replace(state, status="running"), now, config).hung
        item["pending_checkpoint_request"] = pending.get(row.pk)
    return ranked


def request_out(run_id: str, r: CheckpointRequestRow) -> dict[str, Any]:
    return {"id": r.id, "run_id": run_id, "requested_at": r.requested_at, "reason": r.reason,
            "requested_by": r.requested_by, "fulfilled_at": r.fulfilled_at, "fulfilled_step": r.fulfilled_step,
            "pending": r.pending}


def request_checkpoint(engine: Engine, ref: RunRef, now: float, *, reason: str | None,
                       requested_by: str | None) -> dict[str, Any]:
    with engine.begin() as conn:
        row = get_run(conn, ref)
        return request_out(row.run_id, create_request(conn, row.pk, now=now, reason=reason,
                                                      requested_by=requested_by))


def checkpoint_requests_for_run(engine: Engine, ref: RunRef) -> list[dict[str, Any]]:
    with engine.begin() as conn:
        row = get_run(conn, ref)
        resolve_fulfilled(conn, row.pk)
        return [request_out(row.run_id, r) for r in list_requests(conn, row.pk)]


def signals_for_run(engine: Engine, ref: RunRef) -> dict[str, Any] | None:
    """The oldest checkpoint request of the run not fulfilled yet, or None."""
    with engine.begin() as conn:
        row = get_run(conn, ref)
        resolve_fulfilled(conn, row.pk)
        pending = pending_requests(conn, [row.pk])
    return request_out(row.run_id, pending[0]) if pending else None
