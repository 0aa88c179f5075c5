"""Revision 0013: the step rows of several runs move into block rows (each rank's highest block stays in `steps`)
and back, every row kept bit for bit, NaN / NULL values, repeats and out-of-order steps included."""

from __future__ import annotations

import struct
from collections import Counter
from typing import Any

import numpy as np
from sqlalchemy import Engine, text

from services.analysis.step_blocks import BLOCK_STEPS
from services.storage.db import make_engine
from services.storage.migrate import current_revision, downgrade, head_revision, schema_drift, upgrade
from services.storage.step_columns import column_rows
from tests.analysis.scenarios import T0

Row = tuple[int, int, int, int, bytes]  # run_pk, attempt, rank, step, the five floats' bits


def _bits(*values: float | None) -> bytes:
    return b"".join(struct.pack("<d", np.nan if v is None else v) for v in values)


def _rows(rng: np.random.Generator, postgres: bool) -> list[dict[str, Any]]:
    """Three runs of two attempts of three ranks, each rank a random number of steps (0 to 3 blocks and a bit),
    a few repeated and the order shuffled; loss and lr sometimes not reported, with inexact floats."""
    out = []
    for run_pk in (1, 2, 3):
        for attempt in (0, 1):
            for rank in range(3):
                n = int(rng.integers(0, 3 * BLOCK_STEPS + 40))
                steps = list(range(n)) + [int(s) for s in rng.integers(0, max(n, 1), size=min(n, 5))]
                rng.shuffle(steps)
                for step in steps:
                    start = T0 + step * 1.1 + float(rng.random()) / 3
                    loss = None if rng.random() < 0.2 else float(rng.random()) * 0.1 + 2 / 3
                    missing = np.nan if postgres else None
                    out.append({"pk": run_pk, "a": attempt, "r": rank, "s": step, "t0": start,
                                "t1": start + 0.7 + float(rng.random()) / 7,
                                "loss": missing if loss is None else loss, "lr": 3e-4 if step % 2 else missing,
                                "comm": float(rng.random()) / 10})
    return out


def _stored(engine: Engine) -> Counter[Row]:
    """Every step row, from `steps` and, once they exist, from the block rows (decoded)."""
    with engine.connect() as conn:
        rows: Counter[Row] = Counter(
            (pk, a, r, s, _bits(t0, t1, loss, lr, comm)) for pk, a, r, s, t0, t1, loss, lr, comm in conn.execute(
                text("SELECT run_pk, attempt, rank, step, start_time, end_time, loss, lr, comm FROM steps")))
        if current_revision(engine) == head_revision():
            for run_pk in (1, 2, 3):
                moved = column_rows(conn, run_pk)
                values = moved.rows
                rows.update((run_pk, int(a), int(r), int(s), _bits(*v)) for a, r, s, *v in zip(
                    moved.attempt, moved.rank, values.step, values.start, values.end, values.loss, values.lr,
                    values.comm, strict=True))
    return rows


def test_upgrade_moves_the_left_blocks_into_block_rows_and_downgrade_puts_every_row_back(database_url: str) -> None:
    engine = make_engine(database_url)
    upgrade(engine, "0012")
    postgres = engine.dialect.name == "postgresql"
    with engine.begin() as conn:
        for run_pk in (1, 2, 3):
            conn.execute(text("INSERT INTO runs (id, run_id, project, status, version, ledger_version) "
                              "VALUES (:pk, :id, 'default', 'running', 1, -1)"), {"pk": run_pk, "id": f"r{run_pk}"})
        conn.execute(text("INSERT INTO steps (run_pk, attempt, rank, step, start_time, end_time, loss, lr, comm) "
                          "VALUES (:pk, :a, :r, :s, :t0, :t1, :loss, :lr, :comm)"),
                     _rows(np.random.default_rng(12), postgres))
    before = _stored(engine)

    upgrade(engine)
    assert current_revision(engine) == head_revision() and schema_drift(engine) == []
    assert _stored(engine) == before
    with engine.connect() as conn:
        head = conn.execute(text("SELECT run_pk, attempt, rank, min(step), max(step) FROM steps "
                                 "GROUP BY run_pk, attempt, rank")).all()
        moved = conn.execute(text("SELECT count(*), coalesce(sum(rows), 0) FROM step_columns")).one()
        kept = conn.execute(text("SELECT count(*) FROM steps")).scalar_one()
    # each rank keeps its highest block in `steps`, nothing below it
    assert all(lo // BLOCK_STEPS == hi // BLOCK_STEPS for _, _, _, lo, hi in head)
    assert moved[0] > 0 and moved[1] + kept == sum(before.values())

    downgrade(engine, "0012")
    assert current_revision(engine) == "0012"
    assert _stored(engine) == before
    engine.dispose()
