"""benchmarks.block_fold seeds one block of every rank, and the old read it compares the fold with reads the rows
the fold summarises."""

from __future__ import annotations

import random

import pytest
from sqlalchemy import Engine, text

from benchmarks.block_fold import old_read, seed
from services.analysis.step_blocks import BLOCK_STEPS
from services.storage import step_blocks


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)  # the old read is psycopg's
def test_the_seed_is_one_block_of_every_rank_and_the_old_read_returns_the_rows_the_fold_counts(
        engine: Engine) -> None:
    run_pk = seed(engine, 70, random.Random(1))  # more ranks than one request holds
    with engine.begin() as conn:
        changes, summary = step_blocks._fold_block(conn, run_pk, 0, 0)
        matrix = old_read(run_pk)(conn)
        counts = conn.execute(text("SELECT count(*), count(DISTINCT rank) FROM steps")).one()
    assert changes == 70 and summary is not None
    assert tuple(counts) == (70 * BLOCK_STEPS, 70)
    assert matrix.shape == (70 * BLOCK_STEPS, 5)
    assert sorted(set(matrix[:, 0].astype(int))) == list(range(70))
