"""A block's summary survives its trip through the database's bytes, read without a copy."""

from __future__ import annotations

import dataclasses
import io

import numpy as np
import pytest

from services.analysis.step_blocks import StepBlock, summarize_block
from services.storage.block_codec import block_from_bytes, block_to_bytes


def _block(ranks: int, steps: int, seed: int, *, unknown_share: float = 0.0) -> StepBlock:
    rng = np.random.default_rng(seed)
    rank = np.repeat(np.arange(ranks), steps)
    step = np.tile(np.arange(steps) + 3 * 128, ranks)
    start = rng.uniform(0, 1, ranks * steps)
    end = start + 1 + rng.uniform(0, 0.1, ranks * steps)
    comm = np.where(rng.random(ranks * steps) < unknown_share, np.nan, rng.uniform(0, 0.05, ranks * steps))
    return summarize_block(2, 3, rank, step, start, end, comm)


@pytest.mark.parametrize(("ranks", "steps", "unknown_share"), [(1, 1, 0.0), (4, 128, 0.0), (7, 50, 0.3)])
def test_a_block_read_back_from_its_bytes_is_the_block(ranks: int, steps: int, unknown_share: float) -> None:
    block = _block(ranks, steps, seed=ranks, unknown_share=unknown_share)
    back = block_from_bytes(block_to_bytes(block))
    fields = [(f.name, getattr(block, f.name), getattr(back, f.name)) for f in dataclasses.fields(StepBlock)]
    fields += [(f"clocks.{f.name}", getattr(block.clocks, f.name), getattr(back.clocks, f.name))
               for f in dataclasses.fields(block.clocks)]
    for name, mine, theirs in fields:
        if isinstance(mine, np.ndarray):
            assert mine.dtype == theirs.dtype and mine.shape == theirs.shape, name
            np.testing.assert_array_equal(mine, theirs, err_msg=name)
        elif name != "clocks":
            assert mine == theirs, name
    assert (back.excess is None) == (block.excess is None)


def test_a_compressed_npz_is_read_too() -> None:
    block = _block(3, 10, seed=1)
    plain = np.load(io.BytesIO(block_to_bytes(block)))
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **{name: plain[name] for name in plain.files})
    back = block_from_bytes(buffer.getvalue())
    np.testing.assert_array_equal(back.compute, block.compute)
