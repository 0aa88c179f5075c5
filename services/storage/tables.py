"""The database schema. Alembic (migrations/) is generated from and checked against this metadata.

`steps` and `collectives` hold one row per step / collective call and are written with PostgreSQL COPY: they have no
primary key (duplicates are removed when a run is analysed; a replay that regroups steps counts nothing twice). A
rank's step rows of the blocks of steps it has left move into `step_columns`, one encoded row per block
(services.storage.step_columns, docs/storage.md): `steps` keeps each rank's current block. Missing loss / lr / comm
values are NaN on PostgreSQL and NULL on SQLite.

On PostgreSQL all three are partitioned by day of `end_time` (RANGE, epoch seconds; partitions `steps_pYYYYMMDD`
plus `steps_default` for any time outside them), so that retention drops whole days
(services/storage/retention.py). SQLite keeps plain tables and deletes rows.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Double,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class Run(Base):
    """A run is identified by (project, run id): two projects may use the same run id without seeing or affecting
    each other. `id` is the key every other table references. The unique index leads with `run_id`, so it also
    serves the lookup of a run id across projects (a '*' reader naming a run without its project)."""

    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(256))
    project: Mapped[str] = mapped_column(String(64), default="default")
    status: Mapped[str] = mapped_column(String(16), default="running")
    first_time: Mapped[float | None] = mapped_column(Double)
    last_time: Mapped[float | None] = mapped_column(Double)
    received_at: Mapped[float | None] = mapped_column(Double)  # server clock of the latest ingest
    # Bumped by every write to the run; a stored ledger is valid while ledger_version == version.
    version: Mapped[int] = mapped_column(BigInteger, default=0)
    ledger_version: Mapped[int] = mapped_column(BigInteger, default=-1)
    ledger_json: Mapped[str | None] = mapped_column(Text)
    # What the run lists show of that ledger, stored with it (services.analysis.run_figures): its totals as JSON and
    # its usage pieces as float64 columns, read by the lists instead of parsing every run's whole ledger.
    figures_json: Mapped[str | None] = mapped_column(Text)
    usage_bytes: Mapped[bytes | None] = mapped_column(LargeBinary)
    # Server clock when the run's raw rows (steps, collectives, step and heartbeat events) were deleted by
    # retention (services/storage/retention.py).
    detail_pruned_at: Mapped[float | None] = mapped_column(Double)
    # The run's version whose rows were all summarised in its step blocks when they went: the run is analysed from
    # its blocks from then on, and has rows not pruned yet while `version` is larger. NULL on a pruned run: pruned
    # before revision 0009, which deleted its blocks too; its stored analyses are final.
    detail_pruned_version: Mapped[int | None] = mapped_column(BigInteger)

    __table_args__ = (UniqueConstraint("run_id", "project", name="uq_runs_run_id_project"),)


class RunViews(Base):
    """The dashboard's read models of one version of a run (its ledger is the run's: `runs.ledger_json`).

    Building them reads every step of the run, so the last build is kept here (shared by every collector
    process, kept across restarts) and served while a newer one is built: services/derive/views.py.
    """

    __tablename__ = "run_views"

    run_pk: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    version: Mapped[int] = mapped_column(BigInteger)  # the run's version the views describe
    analysed_at: Mapped[float] = mapped_column(Double)  # server clock when the build finished
    analysis_seconds: Mapped[float] = mapped_column(Double)  # what the build took (load + ledger + views)
    views_json: Mapped[str] = mapped_column(Text)


class RunProduct(Base):
    """An analysis of a run kept for good when its raw rows are pruned (the straggler report, the resume check):
    what the API serves for the run from then on. The ledger and views are kept where they always are."""

    __tablename__ = "run_products"

    run_pk: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    product: Mapped[str] = mapped_column(String(32), primary_key=True)  # services.derive.cache.Product.name
    version: Mapped[int] = mapped_column(BigInteger)  # the run's version it describes
    product_json: Mapped[str] = mapped_column(Text)


STEP_RECORDS = "kind IN ('step', 'steps')"
HEARTBEATS = "kind = 'heartbeat'"


class Event(Base):
    """Every event as received (compact records as one row, without their arrays); the idempotency key."""

    __tablename__ = "events"

    run_pk: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    event_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))
    time: Mapped[float] = mapped_column(Double)
    attempt: Mapped[int | None] = mapped_column(Integer)
    rank: Mapped[int | None] = mapped_column(Integer)
    step: Mapped[int | None] = mapped_column(BigInteger)
    data: Mapped[str | None] = mapped_column(Text)  # JSON of the kind's other fields
    # blake2b-128 (hex) of the validated record, arrays included (services.storage.write.content_hash): a repeat
    # of the event id with other content is refused (409). NULL for events stored before revision 0005.
    content_hash: Mapped[str | None] = mapped_column(String(32))

    __table_args__ = (
        Index("ix_events_run_kind_time", "run_pk", "kind", "time"),
        # A rank's step records and heartbeats, for deleting those its block rows made redundant when it moves a
        # block (services.storage.moved_repeats): partial, so they cover only the rows of the current blocks.
        Index("ix_events_step_records", "run_pk", "attempt", "rank", "step",
              postgresql_where=text(STEP_RECORDS), sqlite_where=text(STEP_RECORDS)),
        Index("ix_events_heartbeats", "run_pk", "attempt", "rank", "time",
              postgresql_where=text(HEARTBEATS), sqlite_where=text(HEARTBEATS)),
    )


def _rank_rows(name: str, position: str, *columns: Column[Any] | Index) -> Table:
    """A table of the rows ranks send, partitioned by day of `end_time` on PostgreSQL: each row leads with its run,
    attempt, rank and `position` (the step, or the block of steps), none of them NULL, then `columns` (its other
    columns and its index) in order."""
    return Table(
        name,
        Base.metadata,
        Column("run_pk", Integer, nullable=False),
        Column("attempt", Integer, nullable=False),
        Column("rank", Integer, nullable=False),
        Column(position, BigInteger, nullable=False),
        *columns,
        postgresql_partition_by="RANGE (end_time)",
    )


steps = _rank_rows(
    "steps",
    "step",
    Column("start_time", Double, nullable=False),
    Column("end_time", Double, nullable=False),
    Column("loss", Double),
    Column("lr", Double),
    Column("comm", Double),
    Index("ix_steps_run_attempt_rank_step", "run_pk", "attempt", "rank", "step"),
)

step_columns = _rank_rows(
    # A rank's step rows of one closed block of steps (services.storage.step_columns): the rows a rank sent for
    # steps below the block it is in now, moved out of `steps` and encoded column-wise (services.storage.column_codec)
    # in one row. Late rows for a block already moved add another row of the same key. Partitioned as `steps`, by
    # the latest end of the block's rows.
    "step_columns",
    "block",
    Column("end_time", Double, nullable=False),
    Column("rows", Integer, nullable=False),
    Column("data", LargeBinary, nullable=False),
    Index("ix_step_columns_run_attempt_rank_block", "run_pk", "attempt", "rank", "block"),
)

collectives = _rank_rows(
    "collectives",
    "step",
    Column("op", String(64), nullable=False),
    Column("start_time", Double, nullable=False),
    Column("end_time", Double, nullable=False),
    Index("ix_collectives_run_attempt_step", "run_pk", "attempt", "step"),
)


class ClockReading(Base):
    """What the requests that carried a (run, attempt, rank)'s events said of its clock, by the collector's clock
    (services.storage.clock_readings): live hang detection measures the run's times against the collector's with
    them. Per minute of receipt (`window_index`), the largest `time - received` of its events (`lead_s`) and the
    largest `Goodput-Sent-At - received` of the requests that carried fresh events of it (`offset_s`), and the
    previous minute's; attempt and rank -1: run-level events. `received_at`: the arrival of the latest request
    that raised a reading (a request that raises none is not written)."""

    __tablename__ = "clock_readings"

    run_pk: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    window_index: Mapped[int] = mapped_column(BigInteger)
    lead_s: Mapped[float] = mapped_column(Double)
    lead_prev_s: Mapped[float | None] = mapped_column(Double)
    offset_s: Mapped[float | None] = mapped_column(Double)
    offset_prev_s: Mapped[float | None] = mapped_column(Double)
    received_at: Mapped[float] = mapped_column(Double)


class ApiToken(Base):
    """An access token: `gpw_<token_id>_<secret>` (write) or `gpr_<token_id>_<secret>` (read), scoped to a project.

    Only a salted SHA-256 of the secret is stored (services/storage/tokens.py); the token is shown once, at
    creation. Project "*" (read tokens only) reads every project: for operators, /metrics and the fleet view.
    """

    __tablename__ = "api_tokens"

    token_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    kind: Mapped[str] = mapped_column(String(8))  # "write" or "read"
    project: Mapped[str] = mapped_column(String(64))
    name: Mapped[str | None] = mapped_column(String(128))
    salt: Mapped[str] = mapped_column(String(64))  # hex
    secret_sha256: Mapped[str] = mapped_column(String(64))  # hex of sha256(salt || secret)
    created_at: Mapped[float] = mapped_column(Double)
    revoked_at: Mapped[float | None] = mapped_column(Double)


class CheckpointRequest(Base):
    """A scheduler's request that a running run checkpoint now (POST /v1/runs/{run_id}/checkpoint-request).

    Fulfilled by the first ok `checkpoint_end` of the run that carries its id as `request_id`.
    """

    __tablename__ = "checkpoint_requests"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_pk: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    requested_at: Mapped[float] = mapped_column(Double)  # server clock
    reason: Mapped[str | None] = mapped_column(String(256))
    requested_by: Mapped[str | None] = mapped_column(String(128))
    fulfilled_at: Mapped[float | None] = mapped_column(Double)  # time of the checkpoint_end that answered it
    fulfilled_step: Mapped[int | None] = mapped_column(BigInteger)

    __table_args__ = (Index("ix_checkpoint_requests_run_fulfilled", "run_pk", "fulfilled_at"),)


class AttemptNumber(Base):
    """The run's attempt number of each (launch, attempt within the launch) its processes reported
    (services.storage.attempt_numbers, docs/events.md "Attempt numbers"), with what numbering it needs: the
    launch attempt's earliest time, world size and ranks. Launch "" holds the records that name no launch, whose
    numbers are the run's. Every stored row of a launch attempt carries its run number in `attempt`; when the
    numbering changes (an earlier launch arrives late) the rows are renumbered and `renumbered` set to the run's
    next renumbering, so that what a collector process kept of the run is read again."""

    __tablename__ = "attempt_numbers"

    run_pk: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    launch: Mapped[str] = mapped_column(String(128), primary_key=True)
    client_attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer)
    start_time: Mapped[float] = mapped_column(Double)
    world_size: Mapped[int | None] = mapped_column(Integer)
    rank_lo: Mapped[int | None] = mapped_column(Integer)
    rank_hi: Mapped[int | None] = mapped_column(Integer)
    renumbered: Mapped[int] = mapped_column(BigInteger, default=0)


# -- the step rows reduced per block of steps (services.storage.step_blocks) -----------------------------------

step_marks = Table(
    # Which ranks sent rows for which block of steps (services.analysis.step_blocks: steps // BLOCK_STEPS of one
    # attempt), and how many times: written with the rows, in the same transaction. The ranks of a block say
    # which rows to read when it is summarised again; its count, against the one its summary was made at, that it
    # changed since.
    "step_marks",
    Base.metadata,
    Column("run_pk", Integer, primary_key=True),
    Column("attempt", Integer, primary_key=True),
    Column("block", BigInteger, primary_key=True),
    Column("rank", Integer, primary_key=True),
    Column("changes", BigInteger, nullable=False),
    # a rank's highest block in one probe (services.storage.moved_repeats)
    Index("ix_step_marks_run_attempt_rank_block", "run_pk", "attempt", "rank", "block"),
)

step_blocks = Table(
    # One block's summary (services.analysis.step_blocks.StepBlock, as bytes) and the sum of its marks' changes
    # when the rows it was made from were read.
    "step_blocks",
    Base.metadata,
    Column("run_pk", Integer, primary_key=True),
    Column("attempt", Integer, primary_key=True),
    Column("block", BigInteger, primary_key=True),
    Column("changes", BigInteger, nullable=False),
    Column("summary", LargeBinary, nullable=False),
    # NULL: the summary is of rows that exist. Retention deleted the block's rows: empty, the summary is theirs;
    # else the summary of the deleted rows, which rows received since are summarised onto (`summary` holds both).
    Column("pruned", LargeBinary),
)


metadata = Base.metadata
