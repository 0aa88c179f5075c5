"""runs.figures_json keeps the ledger's running tail

A hung running run's list figures (`GET /v1/runs`, `GET /v1/fleet/window`) were taken from its whole stored ledger,
parsed on every request, to book its hang so far on the ledger's running tail. From this revision the figures
stored with a ledger hold that tail too (services.analysis.run_figures: `running_tail`), and the hang is booked on
them. Upgrading copies each stored ledger's running tail into its figures (null when it has none); figures without
the key (a ledger these could not be read from) keep listing their run from its whole ledger, as before.

Downgrade removes the key again.

Revision ID: 0014
Revises: 0013
Create Date: 2027-01-08 12:00:00
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

_CHUNK = 200
_RUNS = sa.table("runs", sa.column("id", sa.Integer()), sa.column("ledger_json", sa.Text()),
                 sa.column("figures_json", sa.Text()))


def _rewrite(with_tail: bool) -> None:
    conn = op.get_bind()
    after = -1
    while True:
        rows = conn.execute(sa.select(_RUNS.c.id, _RUNS.c.ledger_json, _RUNS.c.figures_json)
                            .where(_RUNS.c.id > after, _RUNS.c.figures_json.is_not(None))
                            .order_by(_RUNS.c.id).limit(_CHUNK)).all()
        if not rows:
            break
        for pk, ledger_json, figures_json in rows:
            figures = json.loads(figures_json)
            figures.pop("running_tail", None)
            if with_tail:
                ledger = json.loads(ledger_json) if ledger_json else {}
                if "running_tail" not in ledger:
                    continue
                figures["running_tail"] = ledger["running_tail"]
            conn.execute(sa.update(_RUNS).where(_RUNS.c.id == pk).values(figures_json=json.dumps(figures)))
        after = rows[-1][0]


def upgrade() -> None:
    _rewrite(with_tail=True)


def downgrade() -> None:
    _rewrite(with_tail=False)
