"""The client-blocks benchmark's standard-library encoder writes services.storage.column_codec's zlib blocks exactly,
so its byte and CPU figures are those of a correct encoder."""

from __future__ import annotations

import math
import struct

import numpy as np

from benchmarks.client_blocks import encode_block
from services.storage.column_codec import ZLIB_FORMAT, decode_step_rows, encode_step_rows
from services.storage.records import StepRows


def _columns() -> tuple[list[int], list[float], list[float], list[float | None], list[float | None], list[float]]:
    rng = np.random.default_rng(7)
    n = 300
    step = list(range(n))
    step[50], step[51] = step[51], step[50]  # out of order
    step[100] = step[99]  # a duplicate (a resend)
    step[200] = 2**63 - 1  # the int64 range's edge
    step[201] = -(2**63)
    start = (1767225600.0 + np.cumsum(rng.uniform(0.9, 1.1, n))).tolist()  # inexact floats
    end = [s + d for s, d in zip(start, rng.uniform(0.5, 0.9, n).tolist(), strict=True)]
    end[10] = start[10]  # a zero-length step
    loss: list[float | None] = rng.uniform(1.0, 3.0, n).tolist()
    loss[5] = None  # not reported
    loss[6] = -0.0
    loss[7] = math.inf
    loss[8] = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000123))[0]  # a NaN with a payload
    lr: list[float | None] = [None] * n
    comm = rng.uniform(0.0, 0.1, n).tolist()
    return step, start, end, loss, lr, comm


def _bits(values: np.ndarray) -> list[int]:
    return np.ascontiguousarray(values, dtype=np.float64).view(np.uint64).tolist()


def test_stdlib_encoder_writes_the_codecs_bytes_and_they_decode_to_the_columns_bit_for_bit() -> None:
    step, start, end, loss, lr, comm = _columns()
    nan = float("nan")
    rows = StepRows(step=np.array(step, dtype=np.int64), start=np.array(start), end=np.array(end),
                    loss=np.array([nan if v is None else v for v in loss]),
                    lr=np.array([nan if v is None else v for v in lr]), comm=np.array(comm))

    block = encode_block(step, start, end, loss, lr, comm)

    assert block == encode_step_rows(rows, format_version=ZLIB_FORMAT)
    back = decode_step_rows(block)
    assert back.step.tolist() == step
    for name in ("start", "end", "loss", "lr", "comm"):
        assert _bits(getattr(back, name)) == _bits(getattr(rows, name)), name
    assert _bits(back.loss)[8] == 0x7FF0000000000123


def test_stdlib_encoder_of_one_row_and_of_none() -> None:
    one = encode_block([5], [1767225600.5], [1767225601.25], [2.5], [None], [0.0])
    assert decode_step_rows(one).end.tolist() == [1767225601.25]
    assert len(decode_step_rows(encode_block([], [], [], [], [], [])).step) == 0
