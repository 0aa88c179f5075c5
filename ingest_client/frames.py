"""Frames, the unit of the spool and the quarantine: u32 length, u32 CRC32(payload), payload (one JSON record)."""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

FRAME_HEADER = struct.Struct("<II")
MAX_FRAME_BYTES = 64 * 1024 * 1024


def encode_frame(payload: bytes) -> bytes:
    return FRAME_HEADER.pack(len(payload), zlib.crc32(payload)) + payload


@dataclass(slots=True)
class FrameBatch:
    payloads: list[bytes]
    end_offset: int
    torn: bool  # a short or corrupt frame stopped the read at end_offset


def read_frames(
    path: Path, offset: int, *, max_events: int, max_bytes: int, stop_at: int | None = None
) -> FrameBatch:
    """Read whole, CRC-checked frames from ``offset``; stop at a limit, the end, or a bad frame."""
    payloads: list[bytes] = []
    pos = offset
    total = 0
    torn = False
    with open(path, "rb") as f:
        f.seek(offset)
        while len(payloads) < max_events and (stop_at is None or pos < stop_at):
            header = f.read(FRAME_HEADER.size)
            if not header:
                break
            if len(header) < FRAME_HEADER.size:
                torn = True
                break
            length, crc = FRAME_HEADER.unpack(header)
            if length > MAX_FRAME_BYTES:
                torn = True
                break
            if payloads and total + length > max_bytes:
                break
            payload = f.read(length)
            if len(payload) < length or zlib.crc32(payload) != crc:
                torn = True
                break
            payloads.append(payload)
            pos += FRAME_HEADER.size + length
            total += length
    return FrameBatch(payloads, pos, torn)
