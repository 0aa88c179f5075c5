"""Revision 0016: block rows written in zlib (format 1) stay as they are on upgrade and read alongside those the
collector writes in zstd (format 2) from then on; downgrade writes the zstd ones back in zlib. Every row of every
block bit for bit, a rank's second row of a replayed block included."""

from __future__ import annotations

import numpy as np
from sqlalchemy import Engine, text

from services.analysis.step_blocks import BLOCK_STEPS
from services.storage.column_codec import ZLIB_FORMAT, ZSTD_FORMAT, decode_step_rows, encode_step_rows
from services.storage.db import make_engine
from services.storage.migrate import current_revision, downgrade, head_revision, schema_drift, upgrade
from services.storage.records import StepRows
from tests.analysis.scenarios import T0

Block = tuple[int, int, int, int, bytes]  # run_pk, attempt, rank, block, the rows' bytes


def _block_rows(rng: np.random.Generator, block: int, n: int) -> StepRows:
    step = block * BLOCK_STEPS + rng.permutation(BLOCK_STEPS)[:n].astype(np.int64)
    start = T0 + step * 1.1 + rng.random(n) / 3
    loss = np.where(rng.random(n) < 0.2, np.nan, rng.random(n) / 10 + 2 / 3)
    return StepRows(step=step, start=start, end=start + 0.7 + rng.random(n) / 7, loss=loss,
                    lr=np.where(step % 2 == 1, 3e-4, np.nan), comm=rng.random(n) / 10)


def _stored(engine: Engine) -> tuple[list[Block], set[int]]:
    """Each block row's key and decoded rows (every column's bytes), sorted; the formats found."""
    with engine.connect() as conn:
        fetched = conn.execute(text("SELECT run_pk, attempt, rank, block, rows, data FROM step_columns")).all()
    out, formats = [], set()
    for run_pk, attempt, rank, block, n, data in fetched:
        rows = decode_step_rows(bytes(data))
        assert len(rows.step) == n
        formats.add(bytes(data)[0])
        out.append((run_pk, attempt, rank, block, b"".join(np.ascontiguousarray(getattr(rows, c)).tobytes()
                                                           for c in ("step", "start", "end", "loss", "lr", "comm"))))
    return sorted(out), formats


def _insert(engine: Engine, blocks: list[dict[str, object]]) -> None:
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO step_columns (run_pk, attempt, rank, block, end_time, rows, data) "
                          "VALUES (:pk, :a, :r, :b, :e, :n, :d)"), blocks)


def _blocks(rng: np.random.Generator, format_version: int, runs: tuple[int, ...]) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for run_pk in runs:
        for attempt in (0, 1):
            for rank in range(3):
                for block in range(int(rng.integers(1, 4))):
                    rows = _block_rows(rng, block, int(rng.integers(1, BLOCK_STEPS + 1)))
                    out.append({"pk": run_pk, "a": attempt, "r": rank, "b": block, "e": float(rows.end.max()),
                                "n": len(rows.step), "d": encode_step_rows(rows, format_version=format_version)})
    return out


def test_upgrade_keeps_the_zlib_blocks_and_downgrade_writes_the_zstd_ones_back_in_zlib(database_url: str) -> None:
    engine = make_engine(database_url)
    upgrade(engine, "0015")
    rng = np.random.default_rng(16)
    with engine.begin() as conn:
        for run_pk in (1, 2, 3):
            conn.execute(text("INSERT INTO runs (id, run_id, project, status, version, ledger_version) "
                              "VALUES (:pk, :id, 'default', 'running', 1, -1)"), {"pk": run_pk, "id": f"r{run_pk}"})
    old = _blocks(rng, ZLIB_FORMAT, (1, 2))
    replay = _block_rows(rng, 0, 3)  # a replayed block's second row
    old.append({"pk": 1, "a": 0, "r": 0, "b": 0, "e": float(replay.end.max()), "n": 3,
                "d": encode_step_rows(replay, format_version=ZLIB_FORMAT)})
    _insert(engine, old)
    stored_before, formats = _stored(engine)
    assert formats == {ZLIB_FORMAT} and len(stored_before) == len(old) > 10

    upgrade(engine)
    assert current_revision(engine) == head_revision() and schema_drift(engine) == []
    assert _stored(engine) == (stored_before, {ZLIB_FORMAT})  # not rewritten: read as they are
    new = _blocks(rng, ZSTD_FORMAT, (2, 3))  # what the collector writes from now on, in runs old and new
    _insert(engine, new)
    both, formats = _stored(engine)
    assert formats == {ZLIB_FORMAT, ZSTD_FORMAT} and len(both) == len(old) + len(new)

    downgrade(engine, "0015")
    assert current_revision(engine) == "0015"
    assert _stored(engine) == (both, {ZLIB_FORMAT})
    engine.dispose()
