"""What a rank posts to its node relay (:mod:`ingest_client.launcher.relay`), read within the collector's limits.

The relay listens on 127.0.0.1, where any local process can post to it. It checks the token before it reads a
body (the caller's job), and it reads a body as the collector does (services/collector/batch.py): at most
``MAX_BODY_BYTES``, compressed or inflated, inflated as it arrives by a bounded inflater that stops at the limit,
so a gzip bomb costs the relay the limit and no more. The events are then parsed one at a time and re-encoded as
the records the spool keeps, at most ``MAX_EVENTS`` of them: the parse tree of the whole body is never in memory.

The limits are the collector's defaults (``GOODPUT_MAX_BODY_BYTES``, ``GOODPUT_MAX_EVENTS_PER_BATCH`` in
services/settings.py; the client imports nothing from services): a rank's batch that the relay takes is one the
collector would take too. Standard library only.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Callable

from ingest_client.common.events import SCHEMA_VERSION

MAX_BODY_BYTES = 32 << 20  # the collector's GOODPUT_MAX_BODY_BYTES: a body, compressed or inflated
MAX_EVENTS = 20_000  # the collector's GOODPUT_MAX_EVENTS_PER_BATCH
READ_CHUNK_BYTES = 64 * 1024
INFLATE_PIECE_BYTES = 1 << 20

_BLANK = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


class RefusedBody(ValueError):
    """A body the relay cannot take (the rank's client quarantines it, as it would the collector's 400)."""

    status = 400


class BodyTooLarge(RefusedBody):
    """More than the limits (the rank's client halves its batches, as after the collector's 413)."""

    status = 413


class UnsupportedEncoding(RefusedBody):
    status = 415


def read_body(read: Callable[[int], bytes], length: int, encoding: str | None) -> bytes | bytearray:
    """The ``length`` bytes that ``read`` (a stream's read) gives, inflated when ``encoding`` says gzip or deflate.
    Raises RefusedBody."""
    if length > MAX_BODY_BYTES:
        raise BodyTooLarge(f"the body is larger than the {MAX_BODY_BYTES}-byte limit; send smaller batches")
    encoding = (encoding or "identity").strip().lower()
    if encoding in ("", "identity"):
        body = read(length)
        if len(body) < length:
            raise RefusedBody("the body ended before its Content-Length")
        return body
    if encoding not in ("gzip", "deflate"):
        raise UnsupportedEncoding(f"unsupported Content-Encoding {encoding!r}; send gzip, deflate or identity")
    return _inflate(read, length, encoding)


def _inflate(read: Callable[[int], bytes], length: int, encoding: str) -> bytearray:
    inflater = zlib.decompressobj(wbits=47)  # gzip or zlib header, detected
    out = bytearray()
    left = length
    while left:
        chunk = read(min(READ_CHUNK_BYTES, left))
        if not chunk:
            raise RefusedBody("the body ended before its Content-Length")
        left -= len(chunk)
        while chunk and not inflater.eof:  # a MiB of output at a time: no second copy of the body's size
            try:
                out += inflater.decompress(chunk, min(INFLATE_PIECE_BYTES, MAX_BODY_BYTES + 1 - len(out)))
            except zlib.error as exc:
                raise RefusedBody(f"the body is not valid {encoding} data: {exc}") from None
            if len(out) > MAX_BODY_BYTES:
                raise BodyTooLarge(f"the inflated body is larger than the {MAX_BODY_BYTES}-byte limit; send smaller "
                                   "batches")
            chunk = inflater.unconsumed_tail
        if inflater.eof and (inflater.unused_data or left):
            raise RefusedBody(f"the body has bytes after the end of its {encoding} stream; send one stream")
    if not inflater.eof:
        raise RefusedBody(f"the {encoding} stream is truncated (it ends before its checksum)")
    return out


def split_events(body: bytes | bytearray) -> list[bytes]:
    """Each event of ``{"schema_version": 1, "events": [...]}`` (keys in any order) or of a bare ``[...]``, encoded
    as the spool keeps it. Raises RefusedBody (BodyTooLarge past MAX_EVENTS)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RefusedBody(f"the body is not UTF-8 JSON: {exc}") from None
    pos = _skip(text, 0)
    if text.startswith("[", pos):
        records, pos = _events(text, pos + 1)
    else:
        records, pos = _envelope(text, pos)
    if _skip(text, pos) != len(text):
        raise RefusedBody(f"the body has data after its JSON value (at character {_skip(text, pos)})")
    if not records:
        raise RefusedBody('expected {"events": [one or more event objects]}')
    return records


def _envelope(text: str, pos: int) -> tuple[list[bytes], int]:
    pos = _after(text, pos, "{")
    records: list[bytes] | None = None
    seen: set[str] = set()
    if text.startswith("}", _skip(text, pos)):
        raise RefusedBody('expected {"events": [one or more event objects]}')
    while True:
        key, pos = _value(text, pos)
        if not isinstance(key, str) or key in seen or key not in ("events", "schema_version"):
            raise RefusedBody(f'expected {{"schema_version": {SCHEMA_VERSION}, "events": [...]}}, found the key '
                              f"{key!r}")
        seen.add(key)
        pos = _after(text, pos, ":")
        if key == "events":
            records, pos = _events(text, _after(text, pos, "["))
        else:
            version, pos = _value(text, pos)
            if version != SCHEMA_VERSION:
                raise RefusedBody(f"schema_version {version!r}: this relay sends version {SCHEMA_VERSION}; run the "
                                  "same goodput version on the node")
        pos = _skip(text, pos)
        if text.startswith("}", pos):
            return records or [], pos + 1
        pos = _after(text, pos, ",")


def _events(text: str, pos: int) -> tuple[list[bytes], int]:
    """The events of an array whose ``[`` ends before ``pos``, one at a time; the position after its ``]``."""
    records: list[bytes] = []
    if text.startswith("]", _skip(text, pos)):
        return records, _skip(text, pos) + 1
    while True:
        event, pos = _value(text, pos)
        if not isinstance(event, dict):
            raise RefusedBody(f"event {len(records)} is not a JSON object")
        if len(records) == MAX_EVENTS:
            raise BodyTooLarge(f"more than {MAX_EVENTS} events in one batch; send smaller batches")
        try:
            records.append(json.dumps(event, separators=(",", ":"), allow_nan=False).encode())
        except ValueError as exc:  # NaN or Infinity, which JSON has not
            raise RefusedBody(f"event {len(records)}: {exc}") from None
        pos = _skip(text, pos)
        if text.startswith("]", pos):
            return records, pos + 1
        pos = _after(text, pos, ",")


def _value(text: str, pos: int) -> tuple[object, int]:
    pos = _skip(text, pos)
    try:
        return _DECODER.raw_decode(text, pos)
    except ValueError as exc:
        raise RefusedBody(f"the body is not JSON: {exc}") from None


def _skip(text: str, pos: int) -> int:
    match = _BLANK.match(text, pos)
    return match.end() if match else pos


def _after(text: str, pos: int, char: str) -> int:
    pos = _skip(text, pos)
    if not text.startswith(char, pos):
        raise RefusedBody(f"the body is not the JSON of a batch: expected {char!r} at character {pos}")
    return pos + 1
