"""The one place storage and analysis meet for the ledger: load a run, build its ledger, keep it in `runs`.

`ledger_for_row` answers for the run's current version (the API's /waste, reports, advice): it builds the
ledger when the stored one is stale, sharing the build with every concurrent request for the same run.
`recent_ledger` is for pages that poll (the fleet list, live status): it waits at most `budget_s` for a
fresh ledger and otherwise answers with the stored one, flagged stale, while the build finishes in the
background and stores its result for the next request.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, update

from services.analysis.ledger import build_ledger
from services.analysis.ledger_types import Ledger
from services.derive.single_flight import Pace, SingleFlight, run_key
from services.storage.load import (
    RunRef,
    RunRow,
    get_run,
    get_run_by_pk,
    last_ok_checkpoint,
    list_runs,
    load_run_data,
)
from services.storage.tables import Run

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LedgerBuild:
    version: int
    ledger: Ledger


# One analysis of a run at a time in this process, whether it builds the ledger alone (here) or the ledger
# and the views (services.derive.views): a ledger request joins a running views build, whose ledger is the
# same. One pace for both, so background builds of a big run cost at most about a quarter of a core.
ANALYSES: SingleFlight[Any] = SingleFlight("analysis")
ANALYSIS_PACE = Pace()


def ledger_for_run(engine: Engine, ref: RunRef) -> Ledger:
    """The run's ledger as served by the API (cached in the database until the run receives events)."""
    with engine.connect() as conn:
        run = get_run(conn, ref)
    return ledger_for_row(engine, run)


def ledger_for_row(engine: Engine, run: RunRow) -> Ledger:
    """The ledger of at least the version `run` was read at."""
    if _is_fresh(run):
        return Ledger.model_validate_json(run.ledger_json)  # type: ignore[arg-type]
    while True:
        built = ANALYSES.submit(run_key(engine, run.pk), lambda: _build(engine, run.pk)).result()
        if built.version >= run.version:
            return built.ledger  # type: ignore[no-any-return]
        # we joined a build that started before `run` was read: the next one reads the run again


def recent_ledger(engine: Engine, run: RunRow, *, budget_s: float) -> tuple[Ledger, bool]:
    """(ledger, stale): the current ledger if it is stored or built within `budget_s`, else the stored one."""
    if _is_fresh(run):
        return Ledger.model_validate_json(run.ledger_json), False  # type: ignore[arg-type]
    if run.ledger_json is None:
        return ledger_for_row(engine, run), False  # nothing to show meanwhile
    built = build_within(engine, run.pk, lambda: _build(engine, run.pk), budget_s)
    if built is not None and built.version >= run.version:
        return built.ledger, False
    return Ledger.model_validate_json(run.ledger_json), True


def build_within(engine: Engine, run_pk: int, build: Callable[[], Any], budget_s: float) -> Any | None:
    """What the run's analysis in progress returns, or one started now if its pace allows, when that is ready
    within `budget_s`; None otherwise (the build goes on in the background and stores its result)."""
    key = run_key(engine, run_pk)
    future = ANALYSES.running(key)
    if future is None and ANALYSIS_PACE.due(key, time.monotonic()):
        future = ANALYSES.submit(key, build)
    if future is None:
        return None
    try:
        return future.result(timeout=budget_s)
    except FutureTimeout:
        return None


def _is_fresh(run: RunRow) -> bool:
    return run.ledger_json is not None and run.ledger_version == run.version


def _build(engine: Engine, run_pk: int) -> LedgerBuild:
    started = time.monotonic()
    with engine.connect() as conn:
        run = get_run_by_pk(conn, run_pk)  # read again: the newest version when the build starts
        if _is_fresh(run):
            return LedgerBuild(run.version, Ledger.model_validate_json(run.ledger_json))  # type: ignore[arg-type]
        data = load_run_data(conn, run)
    ledger = build_ledger(data)
    store_ledger(engine, run, ledger)
    finished = time.monotonic()
    ANALYSIS_PACE.record(run_key(engine, run_pk), finished, finished - started)
    if finished - started > 1.0:
        logger.info("ledger of run %s (version %d) built in %.1f s", run.run_id, run.version, finished - started)
    return LedgerBuild(run.version, ledger)


def store_ledger(engine: Engine, run: RunRow, ledger: Ledger) -> None:
    with engine.begin() as conn:  # only if no event arrived meanwhile
        conn.execute(
            update(Run).where(Run.id == run.pk, Run.version == run.version)
            .values(ledger_json=ledger.model_dump_json(), ledger_version=run.version, status=ledger.status)
        )


def run_detail(engine: Engine, ref: RunRef,
               overlay: Callable[[RunRow, Ledger], Ledger] | None = None) -> dict[str, Any]:
    """GET /v1/runs/{run_id}: the run's structure, from its ledger (passed through `overlay`, e.g. a live
    hang's provisional booking, when given)."""
    with engine.connect() as conn:
        row = get_run(conn, ref)
    ledger = ledger_for_row(engine, row)
    if overlay is not None:
        ledger = overlay(row, ledger)
    attempts = ledger["attempts"]
    last_steps = [a["last_step"] for a in attempts if a["last_step"] is not None]
    last_ok = ledger["checkpoints"]["last_ok_step"]
    last_checkpoint = None
    if last_ok is not None:
        with engine.connect() as conn:
            last_checkpoint = last_ok_checkpoint(conn, row.pk)
    return {
        "run_id": ledger["run_id"], "project": row.project, "status": ledger["status"],
        "first_time": ledger["first_time"], "last_time": ledger["latest_time"], "attempts": attempts,
        "world_sizes": sorted({a["world_size"] for a in attempts}), "restarts": ledger["restarts"],
        "last_step": max(last_steps) if last_steps else None, "last_checkpoint": last_checkpoint,
        "allocated_gpu_seconds": ledger["allocated_gpu_seconds"], "goodput": ledger["goodput"],
        "provisional": ledger.get("provisional"),
    }


def fleet_ledgers(engine: Engine, *, project: str | None = None, limit: int = 2000) -> list[Ledger]:
    """The ledgers of the most recent runs of `project` (all projects: None), for fleet-wide estimates. Stored
    ledgers are taken as they are (an estimate over many runs does not wait for one that is being re-analysed)."""
    with engine.connect() as conn:
        rows = list_runs(conn, limit=limit, project=project)
    return [recent_ledger(engine, row, budget_s=0.0)[0] for row in rows]
