"""The run index: find a run (by what a caller named, by its key), list runs, keep a run's ledger.

A run is identified by (project, run id) (`RunRef`); `resolve_run` turns what a caller named (a run id, maybe a
project) into the run's row, for the callers a principal allows (services.collector.auth). The run's ledger is
stored here, in `runs`, with the version it describes; it is fresh while `ledger_version == version`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, case, select, update

from services.analysis.run_figures import figures_of, usage_bytes
from services.errors import RunInSeveralProjects, RunNotFound
from services.schemas.ledger import Ledger
from services.storage.tables import Run, RunViews

DEFAULT_PROJECT = "default"  # the project of runs written without a token (local clients)
_UNSTORABLE = re.compile(r"[\x00-\x1f\x7f]")  # ingest refuses control characters in run ids (and PostgreSQL NUL)


@dataclass(frozen=True, slots=True)
class RunRef:
    """A run as it is identified: (project, run id)."""

    project: str
    run_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RunRow:
    pk: int
    run_id: str
    project: str
    status: str
    first_time: float | None
    last_time: float | None
    received_at: float | None
    version: int
    ledger_version: int
    ledger_json: str | None
    detail_pruned_at: float | None = None  # retention deleted its raw rows then
    detail_pruned_version: int | None = None  # its version whose rows were all in its step blocks then

    @property
    def ref(self) -> RunRef:
        return RunRef(self.project, self.run_id)

    @property
    def analysed_from_blocks(self) -> bool:
        """Whether its ledger and views can be built: never pruned, or pruned with its step blocks kept (from
        revision 0009 on). A run pruned before lost its blocks: its stored analyses are final."""
        return self.detail_pruned_at is None or self.detail_pruned_version is not None


_RUN_COLUMNS = (Run.id, Run.run_id, Run.project, Run.status, Run.first_time, Run.last_time, Run.received_at,
                Run.version, Run.ledger_version, Run.ledger_json, Run.detail_pruned_at, Run.detail_pruned_version)


def _run_row(row: Any) -> RunRow:
    return RunRow(pk=row[0], run_id=row[1], project=row[2], status=row[3], first_time=row[4], last_time=row[5],
                  received_at=row[6], version=row[7], ledger_version=row[8], ledger_json=row[9],
                  detail_pruned_at=row[10], detail_pruned_version=row[11])


def get_run(conn: Connection, run: RunRef | str) -> RunRow:
    """The run's row; a bare run id names the run of project "default" (what local clients write)."""
    ref = run if isinstance(run, RunRef) else RunRef(DEFAULT_PROJECT, run)
    row = conn.execute(select(*_RUN_COLUMNS).where(Run.run_id == ref.run_id, Run.project == ref.project)).first()
    if row is None:
        raise RunNotFound(ref.run_id)
    return _run_row(row)


def resolve_run(conn: Connection, run_id: str, *, own_project: str | None, project: str | None) -> RunRow:
    """The run a caller names. `own_project`: the only project the caller may see (None = every project);
    `project`: the one it asked for (`?project=`), if any.

    A caller of one project gets its project's run, and RunNotFound for anything else, worded exactly as for a
    run that does not exist (another project's runs are never hinted at). A caller of every project gets the
    run of `project`, or, without it, the only project that has the run id; RunInSeveralProjects when several
    have it (the message lists them: a caller of every project may list them anyway)."""
    if (own_project is not None and project is not None and project != own_project) or _UNSTORABLE.search(run_id):
        raise RunNotFound(run_id)
    wanted = own_project if own_project is not None else project
    query = select(*_RUN_COLUMNS).where(Run.run_id == run_id)
    if wanted is not None:
        query = query.where(Run.project == wanted)
    found = conn.execute(query.limit(100)).all()
    if not found:
        raise RunNotFound(run_id)
    if len(found) > 1:
        raise RunInSeveralProjects(run_id, sorted(row[2] for row in found))
    return _run_row(found[0])


def get_run_by_pk(conn: Connection, run_pk: int) -> RunRow:
    row = conn.execute(select(*_RUN_COLUMNS).where(Run.id == run_pk)).first()
    if row is None:
        raise RunNotFound(str(run_pk))
    return _run_row(row)


def get_runs_by_pk(conn: Connection, run_pks: list[int]) -> dict[int, RunRow]:
    """The rows of the runs `run_pks` that exist, by key (one query: a list reads many at once)."""
    if not run_pks:
        return {}
    return {row[0]: _run_row(row) for row in conn.execute(select(*_RUN_COLUMNS).where(Run.id.in_(run_pks)))}


def list_runs(conn: Connection, *, since: float | None = None, until: float | None = None,
              status: str | None = None, limit: int = 1000, project: str | None = None) -> list[RunRow]:
    query = _listing(select(*_RUN_COLUMNS), since=since, until=until, status=status, limit=limit, project=project)
    return [_run_row(r) for r in conn.execute(query).all()]


@dataclass(frozen=True, slots=True)
class StoredFigures:
    """A run as the run lists read it: its row without the ledger (`row.ledger_json` is None, not read), and the
    figures stored with its ledger (of `row.ledger_version`; None when none were stored)."""

    row: RunRow
    figures_json: str | None
    usage: bytes | None


def list_run_figures(conn: Connection, *, since: float | None = None, until: float | None = None,
                     limit: int = 1000, project: str | None = None, with_usage: bool = False) -> list[StoredFigures]:
    """The runs `list_runs` lists, each with the figures stored with its ledger (and its usage: `with_usage`)."""
    columns: list[Any] = [c for c in _RUN_COLUMNS if c is not Run.ledger_json]
    if with_usage:
        columns.append(Run.usage_bytes)
    query = _listing(select(*columns, Run.figures_json), since=since, until=until, status=None, limit=limit,
                     project=project)
    out = []
    for r in conn.execute(query).all():
        row = RunRow(pk=r[0], run_id=r[1], project=r[2], status=r[3], first_time=r[4], last_time=r[5],
                     received_at=r[6], version=r[7], ledger_version=r[8], ledger_json=None, detail_pruned_at=r[9],
                     detail_pruned_version=r[10])
        out.append(StoredFigures(row, r[-1], r[11] if with_usage else None))
    return out


def _listing(query: Any, *, since: float | None, until: float | None, status: str | None, limit: int,
             project: str | None) -> Any:
    if project is not None:
        query = query.where(Run.project == project)
    if since is not None:
        query = query.where(Run.last_time >= since)
    if until is not None:
        query = query.where(Run.first_time <= until)
    if status is not None:
        query = query.where(Run.status == status)
    return query.order_by(Run.last_time.desc()).limit(limit)


def store_ledger(conn: Connection, run_pk: int, version: int, ledger: Ledger) -> None:
    """Keep the ledger of `version` (with the figures the run lists show of it) unless a newer one is stored; the
    run's status follows it only while no event arrived since (the writer sets the status of a run that ended)."""
    conn.execute(
        update(Run).where(Run.id == run_pk, Run.ledger_version < version)
        .values(ledger_json=ledger.model_dump_json(), ledger_version=version,
                figures_json=figures_of(ledger).model_dump_json(), usage_bytes=usage_bytes(ledger),
                status=case((Run.version == version, ledger.status), else_=Run.status))
    )


def runs_analysed_before_their_last_change(conn: Connection, *, received_since: float, limit: int) -> list[int]:
    """Keys of the runs that received events since `received_since` and whose stored views are older than the run
    (or missing), the most recently active first; never a run pruned before its step blocks were kept (its
    analyses are final)."""
    query = (select(Run.id).select_from(Run).outerjoin(RunViews, RunViews.run_pk == Run.id)
             .where(Run.received_at >= received_since,
                    Run.detail_pruned_at.is_(None) | Run.detail_pruned_version.is_not(None),
                    (RunViews.version.is_(None)) | (RunViews.version < Run.version))
             .order_by(Run.received_at.desc()).limit(limit))
    return [row[0] for row in conn.execute(query)]
