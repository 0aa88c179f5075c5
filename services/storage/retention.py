"""Raw rows with a lifecycle: day partitions of `steps`, `step_columns` and `collectives` on PostgreSQL, and the
deletes of retention.

What is raw: a run's `steps`, `step_columns` (its steps' block rows) and `collectives` rows and its high-volume
events (step and collective records, heartbeats). Everything else of a run is kept for good: its row in `runs` (with
the stored ledger), its views (`run_views`), its frozen products (`run_products`: straggler report, resume check,
the live tail), its step blocks (`step_marks`, `step_blocks`: what the ledger and the views are built from), each
rank's first and last heartbeat of each attempt (what the analysis reads of them) and its other events (attempts,
checkpoints, resumes, the run's end, client stats: a few per attempt). So a pruned run that receives events again
(its last steps, a relaunch) goes on being analysed from what was kept, and the rows received since go in turn.

A run's raw rows go when the run has been quiet for the whole retention window (no event received, by the
server's clock, since `cutoff`): a run that is still going keeps all of its rows. Services.derive.retention stores
the run's analyses, then `mark_pruned` marks it `detail_pruned_at` with the version its step blocks were summarised
at (`detail_pruned_version`), only if no event arrived since, and marks its blocks pruned (`step_blocks.pruned`);
then `prune_raw_rows` deletes, never a row of a run that received events since it was marked (`version` larger).

PostgreSQL: `steps` and `collectives` are partitioned by day of `end_time` (UTC days of the epoch seconds the
client reports). `ensure_partitions` creates today's partition and `PARTITIONS_AHEAD_DAYS` more ahead, and a
DEFAULT partition takes any row outside them (a clock far off, a day not created yet), so no write ever fails
for its time. `prune_raw_rows` drops every day partition that ends before the cutoff, moving out first the rows
of runs that are not pruned (still going, or received events since they were) into the DEFAULT partition, then
deletes the pruned runs' rows left elsewhere (DEFAULT, partitions of days after the cutoff when a clock was ahead)
by index. Dropping a partition is a catalog change: no dead rows, no vacuum, the space is back at once. SQLite
deletes the pruned runs' rows.

Runs pruned before revision 0009 lost their step blocks with their rows (`detail_pruned_version` NULL): their
stored analyses are final, and rows they receive later are deleted at the next prune (`mark_pruned_again`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, CursorResult, bindparam, select, text, update

from services.storage.tables import Run, step_blocks

DAY_S = 86_400
PARTITIONED_TABLES = ("steps", "step_columns", "collectives")
PARTITIONS_AHEAD_DAYS = 3  # partitions exist for today and this many days ahead (the background job runs hourly)
# Per-block summaries of the raw rows (services.storage.step_blocks): deleted only with the rows of a run pruned
# before revision 0009, whose blocks went with its first rows (a pruned run keeps them: it is built from them).
DERIVED_FROM_RAW_TABLES = ("step_marks", "step_blocks")
SERIES_EVENT_KINDS = ("step", "steps", "collective", "collectives")
# The partitions of the partitioned tables: not in the models (services.storage.tables), never schema drift.
PARTITION_NAME = re.compile(r"^(steps|step_columns|collectives)_(p\d{8}|default)$")
_DAY_PARTITION = re.compile(r"^(steps|step_columns|collectives)_p(\d{8})$")


def include_name(name: str | None, type_: str, _parents: object) -> bool:
    """What Alembic compares with the models (services.storage.migrate.schema_drift, migrations/env.py): not the
    partitions of steps and collectives, which retention creates and drops."""
    return not (type_ == "table" and name is not None and PARTITION_NAME.match(name))


def day_of(t: float) -> int:
    """Days since the epoch (UTC) of epoch seconds `t`."""
    return int(t // DAY_S)


def partition_name(table: str, day: int) -> str:
    return f"{table}_p{datetime.fromtimestamp(day * DAY_S, UTC):%Y%m%d}"


def partition_day(name: str) -> int | None:
    """The day a partition named by `partition_name` holds (None: not a day partition)."""
    match = _DAY_PARTITION.match(name)
    if match is None:
        return None
    return day_of(datetime.strptime(match.group(2), "%Y%m%d").replace(tzinfo=UTC).timestamp())


def is_partitioned(conn: Connection) -> bool:
    return conn.dialect.name == "postgresql"


def day_partitions(conn: Connection, table: str) -> dict[int, str]:
    """PostgreSQL: the day partitions of `table` attached now, by day."""
    rows = conn.execute(text(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = :table"), {"table": table}).scalars()
    out = {}
    for name in rows:
        day = partition_day(name)
        if day is not None:
            out[day] = name
    return out


def create_day_partition(conn: Connection, table: str, day: int) -> str:
    """Attach the partition of `day` to `table`, moving into it the rows of that day the DEFAULT partition holds
    (PostgreSQL refuses a new partition while the DEFAULT has rows of its range)."""
    name = partition_name(table, day)
    bounds = {"lo": float(day * DAY_S), "hi": float((day + 1) * DAY_S)}
    conn.execute(text(f'CREATE TABLE "{name}" (LIKE "{table}" INCLUDING DEFAULTS INCLUDING CONSTRAINTS)'))
    moved = text(f'WITH moved AS (DELETE FROM "{table}_default" WHERE end_time >= :lo AND end_time < :hi '
                 f'RETURNING *) INSERT INTO "{name}" SELECT * FROM moved')
    conn.execute(moved, bounds)
    conn.execute(text(f'ALTER TABLE "{table}" ATTACH PARTITION "{name}" '
                      f"FOR VALUES FROM ({bounds['lo']!r}) TO ({bounds['hi']!r})"))
    return name


def ensure_partitions(conn: Connection, *, now: float, ahead_days: int = PARTITIONS_AHEAD_DAYS,
                      days: Sequence[int] = ()) -> list[str]:
    """PostgreSQL: the partitions of today .. today + `ahead_days` (and of `days`) for both tables; returns the
    names created. The caller commits. Nothing on SQLite."""
    if not is_partitioned(conn):
        return []
    today = day_of(now)
    wanted = {*range(today, today + ahead_days + 1), *days}
    created = []
    for table in PARTITIONED_TABLES:
        have = day_partitions(conn, table)
        for day in sorted(wanted - have.keys()):
            created.append(create_day_partition(conn, table, day))
    return created


@dataclass(frozen=True, slots=True)
class RawRowsPlan:
    """What a prune removes (a dry run stops here)."""

    cutoff: float
    runs: tuple[int, ...]  # runs whose raw rows go (quiet since before the cutoff), if marked pruned by then
    partitions: tuple[str, ...]  # day partitions ending at or before the cutoff (PostgreSQL)


@dataclass(slots=True)
class RawRowsPruned:
    partitions_dropped: list[str] = field(default_factory=list)
    rows_deleted: dict[str, int] = field(default_factory=dict)  # table -> rows deleted one by one
    rows_kept: int = 0  # rows of runs still going moved out of dropped partitions into the DEFAULT partition


def runs_to_prune(conn: Connection, cutoff: float, *, limit: int = 100_000) -> list[int]:
    """Runs that received nothing since `cutoff` and have raw rows not deleted yet: never pruned, or received
    events after they were pruned."""
    changed = Run.detail_pruned_at.is_(None) | (Run.version > Run.detail_pruned_version) | (
        Run.detail_pruned_version.is_(None) & (Run.detail_pruned_at < Run.received_at))
    query = select(Run.id).where(Run.received_at < cutoff, changed).order_by(Run.received_at).limit(limit)
    return list(conn.execute(query).scalars())


def plan_raw_rows(conn: Connection, cutoff: float) -> RawRowsPlan:
    partitions: list[str] = []
    if is_partitioned(conn):
        for table in PARTITIONED_TABLES:
            partitions += [name for day, name in sorted(day_partitions(conn, table).items())
                           if (day + 1) * DAY_S <= cutoff]
    return RawRowsPlan(cutoff, tuple(runs_to_prune(conn, cutoff)), tuple(partitions))


def mark_pruned(conn: Connection, run_pk: int, *, version: int, now: float) -> bool:
    """Mark the run pruned at `version` (its analyses were stored and its step blocks summarised for that version)
    and its step blocks as the summaries of rows deleted; False when an event arrived meanwhile (the run is going
    again: it is left alone). The caller commits, after storing what else goes with the mark: until then the run's
    row is locked, so no write of the run commits in between (PostgreSQL; SQLite writes one at a time)."""
    done = conn.execute(update(Run).where(Run.id == run_pk, Run.version == version)
                        .values(detail_pruned_at=now, detail_pruned_version=version))
    if done.rowcount != 1:
        return False
    # empty: each block's summary is its deleted rows' own (a later fold keeps it as the base: step_blocks.py)
    conn.execute(update(step_blocks).where(step_blocks.c.run_pk == run_pk).values(pruned=b""))
    return True


def mark_pruned_again(conn: Connection, run_pks: Sequence[int], *, now: float) -> None:
    """Runs pruned before revision 0009 that received events since: their new raw rows go too (their analyses stay
    final: their step blocks are gone)."""
    if run_pks:
        conn.execute(update(Run).where(Run.id.in_(list(run_pks)), Run.detail_pruned_at.is_not(None),
                                       Run.detail_pruned_version.is_(None)).values(detail_pruned_at=now))


# Runs whose raw rows must stay: not pruned, or received events since (rows not in their step blocks' summaries yet).
_KEPT_RUNS = "SELECT id FROM runs WHERE detail_pruned_at IS NULL OR version > detail_pruned_version"
# Of the plan's runs, those whose rows go: pruned and unchanged since, read in the deleting statement itself, so a
# run written meanwhile keeps every row (its new ones are not summarised yet).
_PRUNED = "SELECT id FROM runs WHERE id IN :pks AND version = detail_pruned_version"
_PRUNED_BEFORE_0009 = ("SELECT id FROM runs WHERE id IN :pks AND detail_pruned_at IS NOT NULL "
                       "AND detail_pruned_version IS NULL")
# Every heartbeat of the pruned runs but each (attempt, rank)'s earliest and latest, which the analysis reads
# (services.storage.load: the same order) and live detection finds as the rank's latest.
_HEARTBEATS_BETWEEN = (
    "DELETE FROM events WHERE kind = 'heartbeat' AND run_pk IN ({runs}) AND (run_pk, event_id) NOT IN ("
    "SELECT run_pk, event_id FROM (SELECT run_pk, event_id, "
    "row_number() OVER (PARTITION BY run_pk, attempt, rank ORDER BY time, event_id) AS earliest, "
    "row_number() OVER (PARTITION BY run_pk, attempt, rank ORDER BY time DESC, event_id DESC) AS latest "
    "FROM events WHERE kind = 'heartbeat' AND run_pk IN ({runs})) AS beats WHERE earliest = 1 OR latest = 1)")


def prune_raw_rows(conn: Connection, plan: RawRowsPlan) -> RawRowsPruned:
    """Drop the plan's partitions (keeping the rows of runs not pruned or written since) and delete the raw rows
    left of the plan's runs that are marked pruned and unchanged since. The caller commits."""
    out = RawRowsPruned()
    for name in plan.partitions:
        table = name.rsplit("_p", 1)[0]
        conn.execute(text(f'ALTER TABLE "{table}" DETACH PARTITION "{name}"'))
        # rows of runs still going: back into the parent, which routes them to the DEFAULT partition now
        kept = conn.execute(text(f'INSERT INTO "{table}" SELECT * FROM "{name}" WHERE run_pk IN ({_KEPT_RUNS})'))
        out.rows_kept += max(kept.rowcount, 0)
        conn.execute(text(f'DROP TABLE "{name}"'))
        out.partitions_dropped.append(name)
    if not plan.runs:
        return out
    pks = {"pks": list(plan.runs)}
    pruned = f"{_PRUNED} UNION {_PRUNED_BEFORE_0009}"
    statements = {table: f"DELETE FROM {table} WHERE run_pk IN ({pruned})" for table in PARTITIONED_TABLES}
    statements |= {table: f"DELETE FROM {table} WHERE run_pk IN ({_PRUNED_BEFORE_0009})"
                   for table in DERIVED_FROM_RAW_TABLES}
    deleted: dict[str, int] = {}
    for table, sql in statements.items():
        deleted[table] = _execute(conn, sql, pks).rowcount
    events = _execute(conn, f"DELETE FROM events WHERE run_pk IN ({pruned}) AND kind IN :kinds",
                      {**pks, "kinds": list(SERIES_EVENT_KINDS)}).rowcount
    events += _execute(conn, f"DELETE FROM events WHERE run_pk IN ({_PRUNED_BEFORE_0009}) AND kind = 'heartbeat'",
                       pks).rowcount
    events += _execute(conn, _HEARTBEATS_BETWEEN.format(runs=_PRUNED), pks).rowcount
    deleted["events"] = events
    out.rows_deleted = {table: n for table, n in deleted.items() if n}
    return out


def _execute(conn: Connection, sql: str, params: dict[str, Any]) -> CursorResult[Any]:
    statement = text(sql).bindparams(*(bindparam(name, expanding=True) for name in params))
    return conn.execute(statement, params)
