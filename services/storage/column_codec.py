"""A block of step rows as bytes and back, exact to the bit: the storage form of docs/storage.md "Column blocks".

Each column is turned into unsigned 64-bit words that are mostly zero for a regular series, then the words of every
column are byte-shuffled (byte k of every word together, as HDF5's and Blosc's shuffle filter do) and compressed
in one stream: with Zstandard (format 2, what the collector writes) or zlib (format 1: blocks written before, and
what an encoder with only Python's standard library writes, benchmarks/client_blocks.py). Both are read. On a run's
blocks zstd (level 3) takes the same bytes as zlib (level 6) and a seventh of the time to compress, a ninth to
inflate (benchmarks/column_blocks.py), which is most of loading a run's steps:

- `step` (int64): delta of delta. A rank's steps counting up by one give zeros after the first two.
- `start` (float64): delta of delta of the IEEE-754 bit patterns read as int64. Times of one run share their
  exponent, so the bit patterns are in the order of the values and a regular cadence gives small words.
- `end` (float64): the difference of its bit pattern from `start`'s (the duration in units of the last place), then
  its delta: steps of a similar length give small words.
- `loss`, `lr`, `comm` (float64, NaN where not reported): XOR with the previous value's bits (Gorilla's float
  encoding, without its bit packing, which the compressor's entropy coding replaces): a constant gives zeros, a
  slowly moving value zeros in its sign and exponent bytes.

Integer arithmetic wraps modulo 2**64 both ways, so every value comes back bit for bit, whatever it is: NaN payloads,
infinities, -0.0, steps out of order, repeated or anywhere in the int64 range. A block holds its rows in the order
given: duplicates and order are the caller's (a resend stays a duplicate).
"""

from __future__ import annotations

import itertools
import struct
import threading
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import zstandard

from services.storage.records import StepRows

ZLIB_FORMAT = 1
ZSTD_FORMAT = 2
FORMAT_VERSION = ZSTD_FORMAT  # what encode_step_rows writes unless told otherwise
_HEADER = struct.Struct("<BI")  # format version, rows
_ZLIB_LEVEL = 6  # zlib's default: level 9 saves under 1% on step blocks at twice the time
_ZSTD_LEVEL = 3  # zstd's default: level 9 saves 2 % at three times the time; 1 takes 0.5 % more bytes
_zstd = threading.local()  # a compressor and a decompressor per thread (neither may be shared by two at once)

@dataclass(frozen=True, slots=True)
class _Column:
    name: str
    encode: Callable[[np.ndarray, dict[str, np.ndarray]], np.ndarray]  # values (as int64), earlier columns -> words
    # words, earlier columns, where each block's rows start -> values (int64)
    decode: Callable[[np.ndarray, dict[str, np.ndarray], _Segments], np.ndarray]


def _delta(values: np.ndarray) -> np.ndarray:
    out = values.copy()
    out[1:] -= values[:-1]
    return out


def _xor_previous(values: np.ndarray) -> np.ndarray:
    out = values.copy()
    out[1:] ^= values[:-1]
    return out


def _zigzag(values: np.ndarray) -> np.ndarray:
    """Small negative and positive int64 to small unsigned words: 0, -1, 1, -2 ... -> 0, 1, 2, 3 ..."""
    return ((values << 1) ^ (values >> 63)).view(np.uint64)


def _unzigzag(words: np.ndarray) -> np.ndarray:
    return ((words >> np.uint64(1)) ^ (np.uint64(0) - (words & np.uint64(1)))).view(np.int64)


@dataclass(frozen=True, slots=True)
class _Segments:
    """Where each block's rows start among the rows of several blocks decoded together: a running sum or XOR is
    undone per block in one pass over all of them."""

    first: np.ndarray  # int64 per block: its first row
    counts: np.ndarray  # int64 per block: its rows

    def undelta(self, values: np.ndarray) -> np.ndarray:
        total = np.cumsum(values, dtype=np.int64)
        out: np.ndarray = total - self._before_each(total)
        return out

    def unxor(self, values: np.ndarray) -> np.ndarray:
        total = np.bitwise_xor.accumulate(values) if len(values) else values
        out: np.ndarray = total ^ self._before_each(total)
        return out

    def _before_each(self, total: np.ndarray) -> np.ndarray:
        """Per row, the running value just before its block's first row (0 for the first block)."""
        if not len(total):
            return total
        before = np.where(self.first > 0, total[np.clip(self.first - 1, 0, len(total) - 1)], 0)
        return np.repeat(before.astype(total.dtype), self.counts)


_STEP_COLUMNS = (
    _Column("step", lambda v, _: _zigzag(_delta(_delta(v))), lambda w, _, seg: seg.undelta(seg.undelta(_unzigzag(w)))),
    _Column("start", lambda v, _: _zigzag(_delta(_delta(v))),
            lambda w, _, seg: seg.undelta(seg.undelta(_unzigzag(w)))),
    _Column("end", lambda v, done: _zigzag(_delta(v - done["start"])),
            lambda w, done, seg: seg.undelta(_unzigzag(w)) + done["start"]),
    _Column("loss", lambda v, _: _xor_previous(v).view(np.uint64), lambda w, _, seg: seg.unxor(w.view(np.int64))),
    _Column("lr", lambda v, _: _xor_previous(v).view(np.uint64), lambda w, _, seg: seg.unxor(w.view(np.int64))),
    _Column("comm", lambda v, _: _xor_previous(v).view(np.uint64), lambda w, _, seg: seg.unxor(w.view(np.int64))),
)
_FLOAT_COLUMNS = frozenset({"start", "end", "loss", "lr", "comm"})


def encode_step_rows(rows: StepRows, *, format_version: int = FORMAT_VERSION) -> bytes:
    """The rows, in their order, as one compressed block (see the module docstring) of the given format."""
    n = len(rows.step)
    values = {c.name: _as_int64(getattr(rows, c.name), c.name, n) for c in _STEP_COLUMNS}
    with np.errstate(over="ignore"):  # int64 differences wrap modulo 2**64, on purpose: undone exactly
        words = [c.encode(values[c.name], values) for c in _STEP_COLUMNS]
    shuffled = _shuffle(words)
    if format_version == ZSTD_FORMAT:
        return _HEADER.pack(ZSTD_FORMAT, n) + _zstd_coders()[0].compress(shuffled)
    if format_version == ZLIB_FORMAT:
        return _HEADER.pack(ZLIB_FORMAT, n) + zlib.compress(shuffled, _ZLIB_LEVEL)
    raise ValueError(f"step block format {format_version} is not one this collector writes "
                     f"({ZLIB_FORMAT}: zlib, {ZSTD_FORMAT}: zstd)")


def decode_step_rows(data: bytes | memoryview) -> StepRows:
    """`encode_step_rows`'s bytes back to the rows, bit for bit. Bytes that are not such a block raise ValueError."""
    return decode_blocks([data])[1]


def decode_blocks(blocks: Sequence[bytes | memoryview]) -> tuple[np.ndarray, StepRows]:
    """Several blocks' rows, one block after the other, and the rows of each block (int64). Each block is inflated on
    its own, then every column of all of them is put back in a few passes over all the rows: a run's thousands of
    blocks cost little more than their rows."""
    counts: list[int] = []
    raws: list[bytes] = []
    for data in blocks:
        n, raw = _inflate(data)
        counts.append(n)
        raws.append(raw)
    sizes = np.array(counts, dtype=np.int64)
    first = np.cumsum(sizes) - sizes
    total = int(sizes.sum())
    columns = len(_STEP_COLUMNS)
    words = _unshuffle(raws, counts).view("<u8").reshape(columns, total).astype(np.uint64, copy=False)
    segments = _Segments(first=first, counts=sizes)
    done: dict[str, np.ndarray] = {}
    with np.errstate(over="ignore"):
        for column, column_words in zip(_STEP_COLUMNS, words, strict=True):
            done[column.name] = column.decode(column_words, done, segments)
    out = {name: v.view(np.float64) if name in _FLOAT_COLUMNS else v for name, v in done.items()}
    return sizes, StepRows(**out)


def _unshuffle(raws: list[bytes], counts: list[int]) -> np.ndarray:
    """The blocks' shuffled bytes (each planes x columns x its rows, `_shuffle`) back to columns x rows x word bytes,
    the blocks' rows one after the other. Consecutive blocks of one size (a rank's full blocks) are joined and put
    back in one strided copy: two passes over the bytes, one of them a plain join."""
    columns = len(_STEP_COLUMNS)
    out = np.empty((columns, sum(counts), 8), dtype=np.uint8)
    row = 0
    for n, run in itertools.groupby(zip(counts, raws, strict=True), key=lambda block: block[0]):
        joined = [raw for _, raw in run]
        shuffled = np.frombuffer(b"".join(joined), dtype=np.uint8).reshape(len(joined), 8, columns, n)
        rows = len(joined) * n
        out[:, row:row + rows].reshape(columns, len(joined), n, 8)[...] = shuffled.transpose(2, 0, 3, 1)
        row += rows
    return out


def _inflate(data: bytes | memoryview) -> tuple[int, bytes]:
    """A block's rows and its shuffled words, checked."""
    if len(data) < _HEADER.size:
        raise ValueError("not a step block: shorter than its header")
    version, n = _HEADER.unpack_from(data)
    expected = 8 * len(_STEP_COLUMNS) * n
    compressed = memoryview(data)[_HEADER.size:]
    try:
        if version == ZSTD_FORMAT:
            # the frame states its size (the compressor writes it): checked first, so that a corrupt one cannot
            # make it allocate more than the block's header promises
            size = zstandard.frame_content_size(compressed)
            if size != expected:
                raise ValueError(f"corrupt step block: its frame holds {size} bytes, not the {expected} of {n} rows")
            raw = _zstd_coders()[1].decompress(compressed)
        elif version == ZLIB_FORMAT:
            raw = zlib.decompress(compressed)
        else:
            raise ValueError(f"step block format {version} is not known here (this collector reads "
                             f"{ZLIB_FORMAT}: zlib and {ZSTD_FORMAT}: zstd)")
    except (zlib.error, zstandard.ZstdError) as exc:
        raise ValueError(f"corrupt step block: {exc}") from exc
    if len(raw) != expected:
        raise ValueError(f"corrupt step block: {len(raw)} bytes for {n} rows of {len(_STEP_COLUMNS)} columns")
    return n, raw


def _zstd_coders() -> tuple[zstandard.ZstdCompressor, zstandard.ZstdDecompressor]:
    """This thread's compressor and decompressor (building one costs ~8 us, ten times a block's decompression)."""
    coders = getattr(_zstd, "coders", None)
    if coders is None:
        coders = _zstd.coders = (zstandard.ZstdCompressor(level=_ZSTD_LEVEL), zstandard.ZstdDecompressor())
    return coders


def _as_int64(values: np.ndarray, name: str, n: int) -> np.ndarray:
    """The column's values as int64 words (a float's bit pattern), one per row, in a fresh contiguous array."""
    array = np.asarray(values)
    if array.shape != (n,):
        raise ValueError(f"column {name!r} has shape {array.shape}; every column of a block holds one value per row")
    if name in _FLOAT_COLUMNS:
        return np.ascontiguousarray(array, dtype=np.float64).view(np.int64).copy()
    if array.dtype.kind not in "iu":
        raise ValueError(f"column {name!r} must hold integers, not {array.dtype}")
    return array.astype(np.int64, copy=True)


def _shuffle(words: Sequence[np.ndarray]) -> bytes:
    """Columns of n little-endian words -> byte plane k of every column's words together (k = 0..7)."""
    matrix = np.stack([w.astype("<u8", copy=False) for w in words]) if words else np.zeros((0, 0), "<u8")
    return np.ascontiguousarray(matrix.view(np.uint8).reshape(len(words), -1, 8).transpose(2, 0, 1)).tobytes()
