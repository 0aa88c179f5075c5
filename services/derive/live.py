"""Where storage and live hang detection meet: a few index lookups per running run, the server's clock.

The hang verdict comes from `services.storage.live` (fresh on every call: no cache, no full load of the run).
The at-risk GPU-seconds come from the run's ledger, which needs the whole run: a fresh one when it is built
within `LEDGER_BUDGET_S`, else the one stored in the database while a single, paced background build
catches up (services.derive.ledger.recent_ledger), so polling `/v1/runs/{id}/live` every 0.2 s never analyses
the run 5 times a second. Beside an analyst process (GOODPUT_ANALYST) the stored one is served as it is: the
analyst rebuilds it each round the run changed, and a poll does not build it again in a collector. Checkpoint
requests are here too: what a scheduler asks of a running run.
"""

from __future__ import annotations

from dataclasses import replace

from sqlalchemy import Connection, Engine

from services.analysis.live import LiveConfig, LiveState, LiveStatus, detect_hang, live_run
from services.analysis.preemption import allocated_gpus, cheapest_to_preempt
from services.analysis.provisional import LiveHang
from services.derive.cache import AnalysisCache
from services.derive.ledger import recent_ledger
from services.schemas.ledger import Ledger
from services.schemas.live import CheckpointRequestOut, LiveRun, PreemptionCandidate
from services.settings import ServiceSettings
from services.storage.checkpoint_requests import (
    CheckpointRequestRow,
    create_request,
    list_requests,
    pending_requests,
    resolve_fulfilled,
)
from services.storage.live import load_live_state
from services.storage.live_batch import load_live_states
from services.storage.runs import RunRow, list_runs

LEDGER_BUDGET_S = 0.5
# Fleet-wide answers (/v1/live, preemption candidates) take each run's kept ledger as it is while its build goes on
# in the background: waiting LEDGER_BUDGET_S for each of 40 busy live runs kept /v1/live 29.5 s long under the
# 10,240-rank load (benchmarks.load). The hang verdict itself is always fresh (services.storage.live).
FLEET_LEDGER_BUDGET_S = 0.0
MAX_FLEET_SUSPECTS = 16  # suspects listed per run in /v1/live (the per-run endpoint: LiveConfig.max_suspects)


def live_config(settings: ServiceSettings) -> LiveConfig:
    live = settings.live
    return LiveConfig(floor_s=live.hang_floor_s, step_factor=live.hang_step_factor,
                      startup_floor_s=live.hang_startup_floor_s, checkpoint_floor_s=live.hang_startup_floor_s,
                      heartbeat_interval_s=live.heartbeat_interval_s)


def read_live_state(conn: Connection, row: RunRow, now: float, config: LiveConfig) -> LiveState:
    """The run's LiveState at the server time `now`, as every live answer reads it."""
    return load_live_state(conn, row, now=now, lookback_s=config.heartbeat_lookback_s,
                           recent_steps=config.recent_steps)


def live_status(engine: Engine, row: RunRow, now: float, config: LiveConfig) -> LiveStatus:
    """The run's hang verdict judged as running, without rank rows (a few index lookups; the caller knows it is
    running)."""
    with engine.connect() as conn:
        state = read_live_state(conn, row, now, config)
    return detect_hang(replace(state, status="running"), now, config, with_ranks=False)


def live_hang_of(status: LiveStatus | LiveRun) -> LiveHang | None:
    """The provisional hang's input when live detection calls the run hung (from the verdict, or from a
    `live_for_row` answer: the run page has one already)."""
    if not status.hung or status.last_progress_time is None:
        return None
    clock_offset = status.clock_offset_s if isinstance(status, LiveStatus) else status.clock_offset_seconds
    return LiveHang(since=status.last_progress_time, clock_offset_s=clock_offset)


def live_hangs(engine: Engine, rows: list[RunRow], now: float, config: LiveConfig) -> dict[int, LiveHang]:
    """The hung runs among `rows` (running runs), by key, each with its hang's input: their states read with one
    statement per kind of lookup for them all (services.storage.live_batch), each judged as `live_status` does."""
    if not rows:
        return {}
    with engine.connect() as conn:
        states = load_live_states(conn, rows, now=now, lookback_s=config.heartbeat_lookback_s,
                                  recent_steps=config.recent_steps)
    verdicts = {pk: live_hang_of(detect_hang(replace(state, status="running"), now, config, with_ranks=False))
                for pk, state in states.items()}
    return {pk: hang for pk, hang in verdicts.items() if hang is not None}


def live_for_row(analyses: AnalysisCache, row: RunRow, now: float, config: LiveConfig, *,
                 with_ranks: bool = True, ledger_budget_s: float = LEDGER_BUDGET_S, polled: bool = True) -> LiveRun:
    """The run's live status. Its at-risk GPU-seconds come from the ledger: fresh when it is built within
    `ledger_budget_s`, else the stored one, refreshed in the background: here, or where an analyst process keeps
    the stored ledgers, by it (`polled`; a run page's own read is not a poll)."""
    ledger = recent_ledger(analyses, row, budget_s=ledger_budget_s, polled=polled)[0]
    with analyses.engine.connect() as conn:
        state = read_live_state(conn, row, now, config)
    return _judged(row, ledger, state, now, config, with_ranks=with_ranks)


def live_for_running_runs(analyses: AnalysisCache, now: float, config: LiveConfig, *, limit: int = 500,
                          project: str | None = None) -> list[LiveRun]:
    """Every running run (of `project`; None = every project), hung ones first, then by seconds since progress
    (longest first): each judged as `live_for_row` judges it without ranks, the states of them all read with one
    statement per kind of lookup (services.storage.live_batch) after their kept ledgers."""
    with analyses.engine.connect() as conn:
        rows = list_runs(conn, status="running", limit=limit, project=project)
    if not rows:
        return []
    ledgers = [recent_ledger(analyses, row, budget_s=FLEET_LEDGER_BUDGET_S, polled=True)[0] for row in rows]
    with analyses.engine.connect() as conn:
        states = load_live_states(conn, rows, now=now, lookback_s=config.heartbeat_lookback_s,
                                  recent_steps=config.recent_steps)
    out = [_judged(row, ledger, states[row.pk], now, config, with_ranks=False)
           for row, ledger in zip(rows, ledgers, strict=True)]
    out = [r for r in out if r.status == "running"]
    out.sort(key=lambda r: (not r.hung, -(r.seconds_since_progress or 0.0), r.run_id, r.project))
    return out


def _judged(row: RunRow, ledger: Ledger, state: LiveState, now: float, config: LiveConfig, *,
            with_ranks: bool) -> LiveRun:
    status = ledger.status if row.status == "running" else row.status
    state = replace(state, status=status)
    return live_run(detect_hang(state, now, config, with_ranks=with_ranks), project=row.project, version=row.version,
                    latest_time=row.last_time, at_risk_gpu_seconds=float(ledger.at_risk_gpu_seconds),
                    allocated_gpus=max(allocated_gpus(ledger), state.world_size), with_ranks=with_ranks,
                    max_suspects=None if with_ranks else MAX_FLEET_SUSPECTS)


# -- preemption cost and checkpoint requests -----------------------------------------------------------------


def preemption_candidates(analyses: AnalysisCache, now: float, config: LiveConfig, *, limit: int = 500,
                          project: str | None = None) -> list[PreemptionCandidate]:
    """Running runs (of `project`; None = every project), cheapest to preempt now first, with the components of
    the cost and each run's project."""
    engine = analyses.engine
    with engine.connect() as conn:
        rows = list_runs(conn, status="running", limit=limit, project=project)
    # run ids repeat across projects: each ledger is keyed by (project, row), which also breaks ties in that order
    ranked = cheapest_to_preempt(((row.project, k), recent_ledger(analyses, row, budget_s=FLEET_LEDGER_BUDGET_S,
                                                                           polled=True)[0])
                                 for k, row in enumerate(rows))
    with engine.begin() as conn:
        for row in rows:
            resolve_fulfilled(conn, row.pk)
        pending = {r.run_pk: r.id for r in reversed(pending_requests(conn, [row.pk for row in rows]))}
    hung = live_hangs(engine, rows, now, config)
    return [PreemptionCandidate(**{**cost.model_dump(), "run_id": rows[k].run_id}, project=rows[k].project,
                                hung=rows[k].pk in hung, pending_checkpoint_request=pending.get(rows[k].pk))
            for (_, k), cost in ranked]


def request_out(run_id: str, r: CheckpointRequestRow) -> CheckpointRequestOut:
    return CheckpointRequestOut(id=r.id, run_id=run_id, requested_at=r.requested_at, reason=r.reason,
                                requested_by=r.requested_by, fulfilled_at=r.fulfilled_at,
                                fulfilled_step=r.fulfilled_step, pending=r.pending)


def request_checkpoint(engine: Engine, row: RunRow, now: float, *, reason: str | None,
                       requested_by: str | None) -> CheckpointRequestOut:
    with engine.begin() as conn:
        return request_out(row.run_id, create_request(conn, row.pk, now=now, reason=reason,
                                                      requested_by=requested_by))


def checkpoint_requests_for_run(engine: Engine, row: RunRow) -> list[CheckpointRequestOut]:
    with engine.begin() as conn:
        resolve_fulfilled(conn, row.pk)
        return [request_out(row.run_id, r) for r in list_requests(conn, row.pk)]


def signals_for_run(engine: Engine, row: RunRow) -> CheckpointRequestOut | None:
    """The oldest checkpoint request of the run not fulfilled yet, or None."""
    with engine.begin() as conn:
        resolve_fulfilled(conn, row.pk)
        pending = pending_requests(conn, [row.pk])
    return request_out(row.run_id, pending[0]) if pending else None
