"""Frames, the unit of the spool and the quarantine: u32 length, u32 CRC32(payload), payload (one JSON record).

A bad frame costs itself, not the frames after it. A frame whose CRC does not match is skipped when its length
leads to a good frame (or exactly to the end): a flipped payload byte. Otherwise the length itself is wrong, and
the reader looks for the next good frame: a header whose length fits and whose CRC matches a payload that is a
JSON object (a record always is), which garbage passes by chance about once in 2**32 tries, and then still has to
parse. What lies between is skipped and counted; no frame after it is read as garbage, nor garbage as a record.
Nothing good after a bad frame: the rest is a torn tail (a write cut short by a crash), skipped and counted.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

FRAME_HEADER = struct.Struct("<II")
MAX_FRAME_BYTES = 64 * 1024 * 1024
_RECORD_START = b'{"'  # every record is a JSON object with at least one key


def encode_frame(payload: bytes) -> bytes:
    return FRAME_HEADER.pack(len(payload), zlib.crc32(payload)) + payload


@dataclass(slots=True)
class FrameBatch:
    payloads: list[bytes]
    end_offset: int
    torn: bool  # no good frame after end_offset: the rest (to stop_at or the end) is unreadable
    corrupt_frames: int = 0  # bad frames skipped before end_offset (each run of bad bytes counts as one)
    skipped_bytes: int = 0  # their bytes


def read_frames(
    path: Path, offset: int, *, max_events: int, max_bytes: int, stop_at: int | None = None
) -> FrameBatch:
    """Read whole, CRC-checked frames from ``offset``; stop at a limit, the end, or a torn tail. Bad frames on the
    way are skipped and counted (see the module's docstring)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        end = size if stop_at is None else min(stop_at, size)
        batch = FrameBatch([], offset, False)
        total = 0
        pos = offset
        f.seek(offset)
        while len(batch.payloads) < max_events and pos < end:
            payload, length = _frame_at(f, pos, end)  # the file is at pos: read on, no seek
            if payload is not None:
                if batch.payloads and total + length > max_bytes:
                    break
                batch.payloads.append(payload)
                total += length
                pos += FRAME_HEADER.size + length
                batch.end_offset = pos
                continue
            after = pos + FRAME_HEADER.size + length
            good: int | None = after  # a bad payload (or CRC) under a good length: skip exactly this frame
            if length < 0 or (after != end and _frame_at(f, after, end, seek=True)[0] is None):
                good = _next_good_frame(f, pos + 1, end)
            if good is None:
                batch.torn = True
                break
            batch.corrupt_frames += 1
            batch.skipped_bytes += good - pos
            pos = batch.end_offset = good
            f.seek(pos)
    return batch


def _frame_at(f: BinaryIO, pos: int, end: int, *, seek: bool = False) -> tuple[bytes | None, int]:
    """The payload of the good frame at ``pos`` (where ``f`` is, unless ``seek``) and its length; (None, length)
    when its CRC fails, (None, -1) when its length cannot be right (past ``end`` or the bound) or the header is
    cut short."""
    if seek:
        f.seek(pos)
    header = f.read(FRAME_HEADER.size)
    if len(header) < FRAME_HEADER.size or pos + FRAME_HEADER.size > end:
        return None, -1
    length, crc = FRAME_HEADER.unpack(header)
    if length > MAX_FRAME_BYTES or pos + FRAME_HEADER.size + length > end:
        return None, -1
    payload = f.read(length)
    if len(payload) < length:
        return None, -1
    return (payload if zlib.crc32(payload) == crc else None), length


def _next_good_frame(f: BinaryIO, start: int, end: int) -> int | None:
    """The offset of the first good frame at or after ``start``, or None: a candidate is a header just before a
    record's first bytes, whose length fits and whose CRC and JSON hold."""
    if end - start < FRAME_HEADER.size + len(_RECORD_START):
        return None
    with mmap.mmap(f.fileno(), end, access=mmap.ACCESS_READ) as data:
        at = data.find(_RECORD_START, start + FRAME_HEADER.size, end)
        while at != -1:
            length, crc = FRAME_HEADER.unpack_from(data, at - FRAME_HEADER.size)
            if len(_RECORD_START) <= length <= min(MAX_FRAME_BYTES, end - at):
                payload = data[at:at + length]
                if payload.endswith(b"}") and zlib.crc32(payload) == crc and _is_object(payload):
                    return at - FRAME_HEADER.size
            at = data.find(_RECORD_START, at + 1, end)
    return None


def _is_object(payload: bytes) -> bool:
    try:
        return isinstance(json.loads(payload), dict)
    except ValueError:
        return False
