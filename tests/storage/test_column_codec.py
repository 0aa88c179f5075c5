"""A block of step rows encoded by services.storage.column_codec comes back bit for bit, whatever its values, in
either of its formats (zstd, what the collector writes; zlib, what it wrote before and what a standard-library
encoder writes)."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from services.storage.column_codec import (
    FORMAT_VERSION,
    ZLIB_FORMAT,
    ZSTD_FORMAT,
    decode_blocks,
    decode_step_rows,
    encode_step_rows,
)
from services.storage.records import StepRows

COLUMNS = ("step", "start", "end", "loss", "lr", "comm")


def bits(rows: StepRows) -> dict[str, bytes]:
    """Every column's bytes: equal bits, NaN payloads and -0.0 included (== would say NaN != NaN, -0.0 == 0.0)."""
    return {c: np.ascontiguousarray(getattr(rows, c)).tobytes() for c in COLUMNS}


def assert_round_trip(rows: StepRows) -> bytes:
    """Both formats give the rows back; returns the block as the collector writes it."""
    for format_version in (ZLIB_FORMAT, ZSTD_FORMAT):
        data = encode_step_rows(rows, format_version=format_version)
        assert data[0] == format_version
        back = decode_step_rows(data)
        assert bits(back) == bits(rows)
        assert back.step.dtype == np.int64 and all(getattr(back, c).dtype == np.float64 for c in COLUMNS[1:])
    return encode_step_rows(rows)


def regular_rows(n: int, *, first_step: int = 0, t0: float = 1.7e9, seed: int = 0) -> StepRows:
    """A rank's steps as a run sends them: one a second with a jitter, a noisy loss, a constant lr."""
    rng = np.random.default_rng(seed)
    start = t0 + np.arange(n) * 1.0 + rng.random(n) * 1e-3
    return StepRows(step=np.arange(first_step, first_step + n, dtype=np.int64), start=start,
                    end=start + 0.9 + rng.random(n) * 1e-2, loss=2.0 + rng.random(n), lr=np.full(n, 3e-4),
                    comm=rng.random(n) * 0.1)


def test_a_rank_s_regular_steps_come_back_exactly_and_take_a_fraction_of_their_raw_bytes():
    rows = regular_rows(128)
    data = assert_round_trip(rows)
    assert data[0] == FORMAT_VERSION == ZSTD_FORMAT
    # raw: 6 columns x 8 bytes; the noisy loss and comm mantissas are most of what is left
    assert len(data) < 0.5 * 6 * 8 * 128
    # and zstd keeps them in about the bytes zlib did
    assert len(data) < 1.05 * len(encode_step_rows(rows, format_version=ZLIB_FORMAT))


def test_no_rows_is_a_block_of_no_rows():
    empty = StepRows(*(np.zeros(0, dtype=d) for d in (np.int64, *[np.float64] * 5)))
    assert len(decode_step_rows(assert_round_trip(empty)).step) == 0


def test_inexact_floats_nan_payloads_infinities_and_negative_zero_come_back_bit_for_bit():
    odd = np.array([0.1, 1 / 3, np.nan, -np.nan, np.inf, -np.inf, -0.0, 5e-324, np.finfo(np.float64).max,
                    struct.unpack("<d", struct.pack("<Q", 0x7FF8_0000_DEAD_BEEF))[0]])
    n = len(odd)
    rows = StepRows(step=np.arange(n, dtype=np.int64), start=odd, end=odd[::-1].copy(), loss=odd,
                    lr=np.roll(odd, 3), comm=np.full(n, np.nan))
    assert_round_trip(rows)


def test_64_bit_steps_out_of_order_and_repeated_come_back_in_the_order_given():
    top, bottom = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    steps = np.array([top, bottom, 0, top, top - 1, bottom + 1, 7, 7, 7, -1], dtype=np.int64)
    rows = regular_rows(len(steps))
    assert_round_trip(StepRows(step=steps, start=rows.start, end=rows.end, loss=rows.loss, lr=rows.lr,
                               comm=rows.comm))


def test_a_resent_record_s_rows_stay_two_rows_each():
    rows = regular_rows(5)
    twice = StepRows(*(np.concatenate([getattr(rows, c), getattr(rows, c)]) for c in COLUMNS))
    back = decode_step_rows(assert_round_trip(twice))
    assert back.step.tolist() == [0, 1, 2, 3, 4] * 2


def test_a_column_of_another_length_or_a_float_step_is_refused_by_name():
    rows = regular_rows(4)
    with pytest.raises(ValueError, match="'loss'"):
        encode_step_rows(StepRows(step=rows.step, start=rows.start, end=rows.end, loss=rows.loss[:3], lr=rows.lr,
                                  comm=rows.comm))
    with pytest.raises(ValueError, match="'step' must hold integers"):
        encode_step_rows(StepRows(step=rows.start, start=rows.start, end=rows.end, loss=rows.loss, lr=rows.lr,
                                  comm=rows.comm))


def test_bytes_that_are_not_a_block_are_refused_with_a_value_error():
    data = encode_step_rows(regular_rows(8))
    with pytest.raises(ValueError, match="header"):
        decode_step_rows(data[:3])
    with pytest.raises(ValueError, match="format 9"):
        decode_step_rows(bytes([9]) + data[1:])
    with pytest.raises(ValueError, match="corrupt"):
        decode_step_rows(data[:-4])
    with pytest.raises(ValueError, match="corrupt"):  # a row count that does not match the columns
        decode_step_rows(struct.pack("<BI", ZLIB_FORMAT, 9) + zlib.compress(bytes(8 * 6 * 8)))
    with pytest.raises(ValueError, match="corrupt"):
        decode_step_rows(struct.pack("<BI", ZSTD_FORMAT, 9) + zstandard.compress(bytes(8 * 6 * 8)))
    with pytest.raises(ValueError, match="corrupt"):
        decode_step_rows(struct.pack("<BI", ZSTD_FORMAT, 8) + b"not a zstd frame")
    with pytest.raises(ValueError, match="not one this collector writes"):
        encode_step_rows(regular_rows(8), format_version=9)


def test_a_zstd_frame_that_claims_more_than_its_rows_is_refused_before_it_is_inflated():
    """A frame states its inflated size; a corrupt block that claims 8 GiB must not allocate them."""
    big = zstandard.ZstdCompressor(level=1).compress(bytes(1 << 20))  # states 1 MiB
    with pytest.raises(ValueError, match="1048576 bytes, not the 384"):
        decode_step_rows(struct.pack("<BI", ZSTD_FORMAT, 8) + big)


_floats = hnp.arrays(np.float64, st.integers(0, 300), elements=st.floats(allow_nan=True, allow_infinity=True,
                                                                         allow_subnormal=True, width=64))


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_any_rows_come_back_bit_for_bit(data: st.DataObject):
    start = data.draw(_floats)
    n = len(start)
    column = hnp.arrays(np.float64, n, elements=st.floats(width=64))
    raw_bits = hnp.arrays(np.uint64, n)  # every bit pattern, NaN payloads included
    step = data.draw(hnp.arrays(np.int64, n, elements=st.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max)))
    rows = StepRows(step=step, start=start, end=data.draw(column), loss=data.draw(raw_bits).view(np.float64),
                    lr=data.draw(column), comm=data.draw(raw_bits).view(np.float64))
    assert_round_trip(rows)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 400), st.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max - 400),
       st.floats(0, 4e9), st.integers(0, 2**32 - 1))
def test_regular_runs_anywhere_in_step_and_time_come_back_bit_for_bit(n: int, first: int, t0: float, seed: int):
    assert_round_trip(regular_rows(n, first_step=first, t0=t0, seed=seed))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 200), st.integers(-2**40, 2**40), st.integers(0, 2**32 - 1)), max_size=12))
def test_blocks_decoded_together_are_each_block_s_rows_one_after_the_other(shapes: list[tuple[int, int, int]]):
    """Blocks of any lengths (none included): every running sum and XOR starts again at each block."""
    blocks = [regular_rows(n, first_step=first, seed=seed) for n, first, seed in shapes]
    odd = np.array([np.nan, -0.0, np.inf, 1 / 3])
    blocks.append(StepRows(np.array([7, -3, 7, 2**62], dtype=np.int64), odd, odd[::-1].copy(), odd, odd, odd))
    # a run's older blocks are zlib, its newer ones zstd: read together
    counts, rows = decode_blocks([encode_step_rows(b, format_version=(ZLIB_FORMAT, ZSTD_FORMAT)[k % 2])
                                  for k, b in enumerate(blocks)])
    assert counts.tolist() == [len(b.step) for b in blocks]
    for column in COLUMNS:
        together = np.concatenate([getattr(b, column) for b in blocks])
        assert np.ascontiguousarray(getattr(rows, column)).tobytes() == together.tobytes(), column
