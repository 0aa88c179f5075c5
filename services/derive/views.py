"""Where storage and the dashboard's read models meet: build a run's views, keep the last build, serve it.

One build loads the run once and makes both its ledger and its views from one structure of it; the result is
stored in `run_views` with the version it describes (shared by every collector process, kept across
restarts).

- `views_for_row`: the views of the run's current version (the API's default): built here when stale.
- `recent_views`: for the run page, which must draw in well under 2 s even for a run of ten million steps
  that keeps receiving events. It waits at most `budget_s` for a fresh build; otherwise it answers with the
  stored build, flagged stale, while the build goes on in the background (one per run; paced, so a polled
  big run costs at most about a quarter of a core) and stores its result for the next poll.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, insert, select, update
from sqlalchemy.exc import IntegrityError

from services.analysis.attempts import build_run_structure
from services.analysis.ledger import build_ledger
from services.analysis.ledger_types import Ledger
from services.analysis.views import build_run_views
from services.derive.ledger import ANALYSES, ANALYSIS_PACE, build_within, store_ledger
from services.derive.single_flight import run_key
from services.storage.load import RunRef, RunRow, get_run, get_run_by_pk, load_run_data
from services.storage.tables import RunViews

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredViews:
    version: int
    analysed_at: float  # server clock
    analysis_seconds: float
    ledger: Ledger
    views: dict[str, Any]




def views_for_run(engine: Engine, ref: RunRef) -> tuple[dict[str, Any], Ledger]:
    """(views, ledger) of the run's current version; both describe the same version."""
    with engine.connect() as conn:
        run = get_run(conn, ref)
    return views_for_row(engine, run)


def views_for_row(engine: Engine, run: RunRow) -> tuple[dict[str, Any], Ledger]:
    current = current_views(engine, run)
    return current.views, current.ledger


def current_views(engine: Engine, run: RunRow) -> StoredViews:
    """The build of at least the version `run` was read at."""
    return _current(engine, run, _stored(engine, run.pk))


def _current(engine: Engine, run: RunRow, stored: StoredViews | None) -> StoredViews:
    while stored is None or stored.version < run.version:
        built = ANALYSES.submit(run_key(engine, run.pk), lambda: _build(engine, run.pk)).result()
        if isinstance(built, StoredViews):
            stored = built
        # else we joined a build of the ledger alone: the next round builds the views (with that ledger)
    return stored


def recent_views(engine: Engine, run: RunRow, *, budget_s: float) -> tuple[StoredViews, bool]:
    """(the newest build of the run's views that is ready within `budget_s`, whether it is stale)."""
    stored = _stored(engine, run.pk)
    if stored is not None and stored.version >= run.version:
        return stored, False
    if stored is None:  # never built: nothing to show meanwhile
        return _current(engine, run, None), False
    built = build_within(engine, run.pk, lambda: _build(engine, run.pk), budget_s)
    if isinstance(built, StoredViews):  # (a build of the ledger alone has no views)
        if built.version >= run.version:
            return built, False
        stored = built if built.version > stored.version else stored
    return stored, True


def _stored(engine: Engine, run_pk: int) -> StoredViews | None:
    with engine.connect() as conn:
        row = conn.execute(select(RunViews.version, RunViews.analysed_at, RunViews.analysis_seconds,
                                  RunViews.ledger_json, RunViews.views_json).where(RunViews.run_pk == run_pk)).first()
    if row is None:
        return None
    return StoredViews(version=row[0], analysed_at=row[1], analysis_seconds=row[2], ledger=Ledger.model_validate_json(row[3]),
                       views=json.loads(row[4]))


def _build(engine: Engine, run_pk: int) -> StoredViews:
    started = time.perf_counter()
    with engine.connect() as conn:
        run = get_run_by_pk(conn, run_pk)  # read again: the newest version when the build starts
        data = load_run_data(conn, run)
    loaded = time.perf_counter()
    structure = build_run_structure(data)
    if run.ledger_json is not None and run.ledger_version == run.version:
        ledger = Ledger.model_validate_json(run.ledger_json)
    else:
        ledger = build_ledger(data, structure)
        store_ledger(engine, run, ledger)
    views = build_run_views(data, ledger, run=structure)
    views["version"] = run.version
    finished = time.perf_counter()
    built = StoredViews(version=run.version, analysed_at=time.time(), analysis_seconds=finished - started,
                        ledger=ledger, views=views)
    _store(engine, run_pk, built)
    ANALYSIS_PACE.record(run_key(engine, run_pk), time.monotonic(), finished - started)
    logger.info("views built for run %s (version %d): load %.2f s, ledger and views %.2f s", run.run_id,
                run.version, loaded - started, finished - loaded)
    return built


def _store(engine: Engine, run_pk: int, built: StoredViews) -> None:
    """Keep the newest build: an older one (a slower concurrent build in another process) never replaces it."""
    values = {"version": built.version, "analysed_at": built.analysed_at, "analysis_seconds": built.analysis_seconds,
              "ledger_json": built.ledger.model_dump_json(), "views_json": json.dumps(built.views)}
    with engine.begin() as conn:
        replaced = conn.execute(update(RunViews).where(RunViews.run_pk == run_pk, RunViews.version < built.version)
                                .values(**values)).rowcount
        if replaced:
            return
        exists = conn.execute(select(RunViews.version).where(RunViews.run_pk == run_pk)).first()
        if exists is not None:
            return
    try:
        with engine.begin() as conn:
            conn.execute(insert(RunViews).values(run_pk=run_pk, **values))
    except IntegrityError:
        pass  # another process stored its build first
