"""A step block's summary as stored in `step_blocks.summary`: an uncompressed .npz of its fields, read back as views
of the stored bytes. A summary stored before blocks kept their clock groups reads as one group (migration 0009
deletes them all, so that each block is summarised again from its rows)."""

from __future__ import annotations

import io
import math
import re
import struct
import zipfile
from functools import cache
from typing import Any

import numpy as np

from services.analysis.block_clocks import BlockClocks, single_clock
from services.analysis.step_blocks import StepBlock


def block_to_bytes(block: StepBlock) -> bytes:
    buffer = io.BytesIO()
    clocks = block.clocks
    arrays: dict[str, Any] = {  # Any: numpy's stubs type savez's keywords as its allow_pickle flag
        "attempt": np.int64(block.attempt), "block": np.int64(block.block), "steps": block.steps,
        "start": block.start, "end": block.end, "ranks_per_step": block.ranks_per_step, "slowest": block.slowest,
        "median": block.median, "slowest_rank": block.slowest_rank, "known_ranks": block.known_ranks,
        "ranks": block.ranks, "compute": block.compute, "known": block.known,
        "raw": np.array([block.raw_first_start, block.raw_last_end], dtype=np.float64),
        "clock_group": clocks.group, "clock_deviation": clocks.deviation,
        "clock_raw": np.stack([clocks.raw_first_start, clocks.raw_last_end])}
    if len(clocks.deviation) > 1:  # one group's spans are the block's own
        arrays.update(clock_start=clocks.start, clock_end=clocks.end)
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def block_from_bytes(data: bytes) -> StepBlock:
    z = _read_npz(data)
    raw = z["raw"]
    attempt, block = int(z["attempt"]), int(z["block"])
    if "clock_group" in z:  # one clock group: its spans are the block's
        clocks = BlockClocks(attempt=attempt, block=block, ranks=z["ranks"], group=z["clock_group"],
                             deviation=z["clock_deviation"], steps=z["steps"],
                             start=z["clock_start"] if "clock_start" in z else z["start"][None, :],
                             end=z["clock_end"] if "clock_end" in z else z["end"][None, :],
                             raw_first_start=z["clock_raw"][0], raw_last_end=z["clock_raw"][1])
    else:
        clocks = single_clock(attempt, block, z["ranks"], z["steps"], z["start"], z["end"], float(raw[0]),
                              float(raw[1]))
    return StepBlock(attempt=attempt, block=block, steps=z["steps"], start=z["start"],
                     end=z["end"], ranks_per_step=z["ranks_per_step"], slowest=z["slowest"], median=z["median"],
                     slowest_rank=z["slowest_rank"], known_ranks=z["known_ranks"], ranks=z["ranks"],
                     compute=z["compute"], known=z["known"], raw_first_start=float(raw[0]),
                     raw_last_end=float(raw[1]), clocks=clocks)


def _read_npz(data: bytes) -> dict[str, np.ndarray]:
    """The arrays of an uncompressed .npz (what `block_to_bytes` writes) as read-only views of `data`: no copy, and
    no CRC pass over a block's megabyte (`np.load` reads the same values). Anything else (a compressed member, an
    object array) goes through `np.load`."""
    out: dict[str, np.ndarray] = {}
    view = memoryview(data)
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        for info in archive.infolist():
            name_length, extra_length = struct.unpack_from("<HH", data, info.header_offset + 26)
            at = info.header_offset + 30 + name_length + extra_length
            if info.compress_type != zipfile.ZIP_STORED:
                break
            member = io.BytesIO(view[at:at + info.file_size])
            header = _array_header(member)
            if header is None:
                break
            shape, fortran, dtype = header
            if dtype.hasobject:
                break
            count = math.prod(shape)
            array = np.frombuffer(data, dtype=dtype, count=count, offset=at + member.tell())
            out[info.filename.removesuffix(".npy")] = array.reshape(shape, order="F" if fortran else "C")
        else:
            return out
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        return {name: z[name] for name in z.files}


# The header np.save writes: a dict literal, padded. Read with a pattern: numpy's own reader parses it with
# ast.literal_eval, ~33 us an array, 17 arrays a block (a 64-rank run of 969k steps: 123 blocks, 60 ms of the
# ~250 ms its summaries took to read). Any other header goes to numpy's reader.
_HEADER = re.compile(r"\{'descr': '([<>|=][a-zA-Z]\d*)', 'fortran_order': (True|False), "
                     r"'shape': \(((?:\d+, )*\d*,?)\), \}")


def _array_header(member: io.BytesIO) -> tuple[tuple[int, ...], bool, np.dtype[Any]] | None:
    """(shape, Fortran order, dtype) of the .npy array at the start of `member`, which is left at its data; None: a
    format this reader does not know."""
    version = np.lib.format.read_magic(member)
    if version not in ((1, 0), (2, 0)):
        return None
    start = member.tell()
    size_bytes = 2 if version == (1, 0) else 4
    (length,) = struct.unpack("<H" if size_bytes == 2 else "<I", member.read(size_bytes))
    match = _HEADER.match(member.read(length).decode("latin-1"))
    if match is None:
        member.seek(start)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read(member)
        return shape, fortran, dtype
    descr, fortran_order, dims = match.groups()
    return tuple(int(d) for d in dims.split(",") if d.strip()), fortran_order == "True", _dtype(descr)


@cache
def _dtype(descr: str) -> np.dtype[Any]:
    return np.dtype(descr)
