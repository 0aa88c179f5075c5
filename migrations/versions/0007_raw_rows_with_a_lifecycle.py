"""raw rows with a lifecycle: day partitions of steps and collectives (PostgreSQL), runs.detail_pruned_at,
run_products

PostgreSQL: `steps` and `collectives` become tables partitioned by RANGE (end_time), one partition per UTC day
(`steps_pYYYYMMDD`) and a DEFAULT partition for every other time. Upgrading renames each old table aside,
creates the partitioned one with the same columns and index, a partition for each day of the last
PARTITIONED_BACK_DAYS that has rows and for today and the next days, copies the rows over (older rows land in
the DEFAULT partition, where retention deletes them by rows) and drops the old table. The copy takes about as
long as writing the rows did (a few seconds per million rows), under a lock that holds ingestion back.

Downgrade: plain tables again, every row copied back (the partitions are dropped with their table). The runs'
pruned mark and the kept products (`run_products`) are dropped; a pruned run then has its stored ledger and
views but would be analysed again from what is left of its rows.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-20 10:00:00
"""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

DAY_S = 86_400
PARTITIONED_BACK_DAYS = 31
AHEAD_DAYS = 3
TABLES = {
    "steps": (["run_pk", "attempt", "rank", "step", "start_time", "end_time", "loss", "lr", "comm"],
              "ix_steps_run_attempt_rank_step", ["run_pk", "attempt", "rank", "step"]),
    "collectives": (["run_pk", "attempt", "rank", "step", "op", "start_time", "end_time"],
                    "ix_collectives_run_attempt_step", ["run_pk", "attempt", "step"]),
}


def _columns(table: str) -> list[sa.Column[Any]]:
    types: dict[str, sa.types.TypeEngine[Any]] = {
        "run_pk": sa.Integer(), "attempt": sa.Integer(), "rank": sa.Integer(), "step": sa.BigInteger(),
        "op": sa.String(length=64), "start_time": sa.Double(), "end_time": sa.Double(), "loss": sa.Double(),
        "lr": sa.Double(), "comm": sa.Double()}
    nullable = {"loss", "lr", "comm"}
    return [sa.Column(name, types[name], nullable=name in nullable) for name in TABLES[table][0]]


def _partition_name(table: str, day: int) -> str:
    return f"{table}_p{time.strftime('%Y%m%d', time.gmtime(day * DAY_S))}"


def upgrade() -> None:
    op.add_column("runs", sa.Column("detail_pruned_at", sa.Double(), nullable=True))
    op.create_table(
        "run_products",
        sa.Column("run_pk", sa.Integer(), nullable=False),
        sa.Column("product", sa.String(length=32), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("product_json", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["run_pk"], ["runs.id"], name="fk_run_products_run_pk_runs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_pk", "product", name="pk_run_products"),
    )
    if op.get_bind().dialect.name != "postgresql":
        return
    today = int(time.time() // DAY_S)
    for table, (columns, index, index_columns) in TABLES.items():
        old = f"{table}_unpartitioned"
        op.rename_table(table, old)
        op.execute(f'ALTER INDEX "{index}" RENAME TO "{index}_unpartitioned"')
        op.create_table(table, *_columns(table), postgresql_partition_by="RANGE (end_time)")
        op.create_index(index, table, index_columns)
        op.execute(f'CREATE TABLE "{table}_default" PARTITION OF "{table}" DEFAULT')
        days = {int(d) for (d,) in op.get_bind().execute(sa.text(
            f'SELECT DISTINCT floor(end_time / {DAY_S}) FROM "{old}" WHERE end_time >= :since AND end_time < :until'),
            {"since": float((today - PARTITIONED_BACK_DAYS) * DAY_S), "until": float(today * DAY_S)})}
        for day in sorted(days | set(range(today, today + AHEAD_DAYS + 1))):
            op.execute(f'CREATE TABLE "{_partition_name(table, day)}" PARTITION OF "{table}" '
                       f"FOR VALUES FROM ({float(day * DAY_S)!r}) TO ({float((day + 1) * DAY_S)!r})")
        listed = ", ".join(columns)
        op.execute(f'INSERT INTO "{table}" ({listed}) SELECT {listed} FROM "{old}"')
        op.drop_table(old)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for table, (columns, index, index_columns) in TABLES.items():
            old = f"{table}_partitioned"
            op.rename_table(table, old)
            op.execute(f'ALTER INDEX "{index}" RENAME TO "{index}_partitioned"')
            op.create_table(table, *_columns(table))
            listed = ", ".join(columns)
            op.execute(f'INSERT INTO "{table}" ({listed}) SELECT {listed} FROM "{old}"')
            op.create_index(index, table, index_columns)
            op.drop_table(old)  # its partitions with it
    op.drop_table("run_products")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("detail_pruned_at")
