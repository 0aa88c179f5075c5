"""Revision 0017: on PostgreSQL the block summaries are TOAST-compressed with lz4 (pglz spent milliseconds on each
only to store it uncompressed); a summary stored before reads the same after, and after the downgrade. SQLite: the
revision changes nothing."""

from __future__ import annotations

import numpy as np
from sqlalchemy import Engine, text

from services.analysis.step_blocks import summarize_block
from services.storage.block_codec import block_from_bytes, block_to_bytes
from services.storage.db import make_engine
from services.storage.migrate import current_revision, downgrade, head_revision, schema_drift, upgrade
from tests.analysis.scenarios import T0


def _summary(block: int, seed: int) -> bytes:
    """A real block's summary: 256 ranks x 128 steps with jittered times and collective seconds."""
    rng = np.random.default_rng(seed)
    rank, step = np.repeat(np.arange(256), 128), np.tile(np.arange(128) + 128 * block, 256)
    start = T0 + step * 1.1 + rng.random(len(step)) / 100
    return block_to_bytes(summarize_block(0, block, rank, step, start, start + 0.9 + rng.random(len(step)) / 20,
                                          rng.random(len(step)) / 5))


def _write(engine: Engine, block: int, summary: bytes) -> None:
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO step_blocks (run_pk, attempt, block, changes, summary) "
                          "VALUES (1, 0, :b, 1, :s)"), {"b": block, "s": summary})


def _stored(engine: Engine) -> dict[int, bytes]:
    """Each block's summary as read back."""
    with engine.connect() as conn:
        return {int(b): bytes(s) for b, s in conn.execute(text("SELECT block, summary FROM step_blocks"))}


def _stored_size(engine: Engine, block: int) -> int:
    """PostgreSQL: the bytes a block's summary takes as stored (TOAST-compressed or not)."""
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT pg_column_size(summary) FROM step_blocks WHERE block = :b"),
                                {"b": block}).scalar_one())


def _compression(engine: Engine) -> set[str]:
    with engine.connect() as conn:
        return {str(c) for c, in conn.execute(text(
            "SELECT attcompression FROM pg_attribute WHERE attrelid = 'step_blocks'::regclass "
            "AND attname IN ('summary', 'pruned')"))}


def test_summaries_are_compressed_with_lz4_and_read_the_same_across_the_revision(database_url: str) -> None:
    engine = make_engine(database_url)
    postgres = engine.dialect.name == "postgresql"
    upgrade(engine, "0016")
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO runs (id, run_id, project, status, version, ledger_version) "
                          "VALUES (1, 'r1', 'default', 'running', 1, -1)"))
    before, after = _summary(0, 1), _summary(1, 2)
    _write(engine, 0, before)
    if postgres:
        assert _compression(engine) == {""}  # the server's default: pglz
        assert _stored_size(engine, 0) >= len(before)  # pglz gave up: stored as it was

    upgrade(engine)
    assert current_revision(engine) == head_revision() and schema_drift(engine) == []
    _write(engine, 1, after)
    assert _stored(engine) == {0: before, 1: after}
    assert block_from_bytes(_stored(engine)[1]).block == 1
    if postgres:
        assert _compression(engine) == {"l"}
        assert _stored_size(engine, 1) < 0.95 * len(after)  # lz4 keeps it smaller than the value itself

    downgrade(engine, "0016")
    assert current_revision(engine) == "0016"
    assert _stored(engine) == {0: before, 1: after}
    if postgres:
        assert _compression(engine) == {""}
    engine.dispose()
