"""runs.figures_json and runs.usage_bytes: what the run lists show of a run's ledger, stored with it

`GET /v1/runs` and `GET /v1/fleet/window` parsed every listed run's whole stored ledger (its attempts,
allocations, clocks, usage...) on every request: 3,000 runs took seconds (benchmarks/fleet_listing.py). From this
revision the ledger is stored with its list figures (services.analysis.run_figures): the totals, status and
times as JSON, the usage pieces as little-endian float64 columns (start, end, then each usage key in the order
`figures_json.usage_keys` lists them). Upgrading copies them out of every stored ledger: the same values, JSON
numbers read back to the same doubles. A ledger these fields cannot be read from (an older shape) gets none; its run
is listed from its whole ledger, as before, until its ledger is built again.

Downgrade drops both columns.

Revision ID: 0012
Revises: 0011
Create Date: 2027-01-06 12:00:00
"""

from __future__ import annotations

import json
import sys
from array import array
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_FIGURES = ("status", "first_time", "latest_time", "allocated_gpu_seconds", "productive_gpu_seconds",
            "eval_gpu_seconds", "goodput", "waste_gpu_seconds", "restarts")
_CHUNK = 200


def upgrade() -> None:
    op.add_column("runs", sa.Column("figures_json", sa.Text(), nullable=True))
    op.add_column("runs", sa.Column("usage_bytes", sa.LargeBinary(), nullable=True))
    conn = op.get_bind()
    runs = sa.table("runs", sa.column("id", sa.Integer()), sa.column("ledger_json", sa.Text()),
                    sa.column("figures_json", sa.Text()), sa.column("usage_bytes", sa.LargeBinary()))
    after = -1
    while True:
        rows = conn.execute(sa.select(runs.c.id, runs.c.ledger_json)
                            .where(runs.c.id > after, runs.c.ledger_json.is_not(None))
                            .order_by(runs.c.id).limit(_CHUNK)).all()
        if not rows:
            break
        for pk, ledger_json in rows:
            stored = _figures(json.loads(ledger_json))
            if stored is not None:
                conn.execute(sa.update(runs).where(runs.c.id == pk)
                             .values(figures_json=stored[0], usage_bytes=stored[1]))
        after = rows[-1][0]


def _figures(ledger: dict[str, Any]) -> tuple[str, bytes | None] | None:
    if any(key not in ledger for key in _FIGURES):
        return None
    usage = ledger.get("usage")
    figures = {key: ledger[key] for key in _FIGURES}
    figures["provisional"] = None
    figures["usage_keys"] = None if usage is None else list(usage["gpu_seconds"])
    if usage is None:
        return json.dumps(figures), None
    columns = array("d")
    for column in (usage["start"], usage["end"], *usage["gpu_seconds"].values()):
        columns.extend(float(v) for v in column)
    if sys.byteorder == "big":
        columns.byteswap()
    return json.dumps(figures), columns.tobytes()


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("usage_bytes")
        batch.drop_column("figures_json")
