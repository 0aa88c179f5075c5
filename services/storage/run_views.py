"""The last build of each run's dashboard views (`run_views`), shared by every collector process and kept across
restarts. The ledger a build drew from is the run's, in `runs` (services.storage.runs.store_ledger)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, case, select
from sqlalchemy.dialects import postgresql, sqlite

from services.storage.tables import Run, RunViews


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredViewsRow:
    version: int  # the run's version the views describe
    analysed_at: float  # server clock when the build finished
    analysis_seconds: float  # what the build took (load + ledger + views)
    views_json: str | None  # None: older than the version asked for (not read)
    ledger_version: int  # the run's stored ledger, read with them
    ledger_json: str | None


def load_views(conn: Connection, run_pk: int, at_least: int = -1) -> StoredViewsRow | None:
    """The run's stored views and ledger; their JSON only when the views are of version `at_least` or later (a
    stale build's JSON is not fetched for a caller that would throw it away)."""
    fresh = RunViews.version >= at_least
    row = conn.execute(select(RunViews.version, RunViews.analysed_at, RunViews.analysis_seconds,
                              case((fresh, RunViews.views_json)), Run.ledger_version,
                              case((fresh, Run.ledger_json)))
                       .join(Run, Run.id == RunViews.run_pk).where(RunViews.run_pk == run_pk)).first()
    if row is None:
        return None
    return StoredViewsRow(version=row[0], analysed_at=row[1], analysis_seconds=row[2], views_json=row[3],
                          ledger_version=row[4], ledger_json=row[5])


def store_views(conn: Connection, run_pk: int, *, version: int, analysed_at: float, analysis_seconds: float,
                views_json: str) -> None:
    """Keep the newest build: an older one (a slower concurrent build in another process) never replaces it."""
    insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
    values = {"version": version, "analysed_at": analysed_at, "analysis_seconds": analysis_seconds,
              "views_json": views_json}
    statement = insert(RunViews).values(run_pk=run_pk, **values)
    conn.execute(statement.on_conflict_do_update(index_elements=[RunViews.run_pk], set_=values,
                                                 where=RunViews.version < statement.excluded.version))
