"""A block's summary survives its trip through the database's bytes, read without a copy."""

from __future__ import annotations

import dataclasses
import io
import zipfile
from typing import Any

import numpy as np
import pytest

from services.analysis.step_blocks import StepBlock, summarize_block
from services.storage.block_codec import _read_npz, block_from_bytes, block_to_bytes


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


def test_arrays_of_any_shape_order_and_dtype_read_as_numpy_reads_them() -> None:
    """The stored arrays' headers are read with a pattern (numpy's reader is ast.literal_eval); what it does not
    know (a structured dtype) goes to numpy's reader: either way the arrays np.load reads."""
    arrays: dict[str, Any] = {
        "scalar": np.int64(7), "empty": np.zeros(0, dtype=bool), "one": np.arange(1, dtype=np.int32),
        "matrix": np.arange(12.0).reshape(3, 4), "fortran": np.asfortranarray(np.arange(12.0).reshape(3, 4)),
        "cube": np.arange(24, dtype=">i8").reshape(2, 3, 4), "text": np.array(["a", "bc"]),
        "structured": np.array([(1, 2.5)], dtype=[("a", "<i4"), ("b", "<f8")])}
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    with zipfile.ZipFile(buffer, "a") as archive, archive.open("version2.npy", "w") as member:
        np.lib.format.write_array(member, np.arange(5.0), version=(2, 0))  # a 4-byte header length
    data = buffer.getvalue()
    read = _read_npz(data)
    with np.load(io.BytesIO(data)) as expected:
        assert sorted(read) == sorted(expected.files)
        for name in expected.files:
            mine, theirs = read[name], expected[name]
            assert mine.dtype == theirs.dtype and mine.shape == theirs.shape, name
            assert mine.flags.f_contiguous == theirs.flags.f_contiguous, name
            np.testing.assert_array_equal(mine, theirs, err_msg=name)
