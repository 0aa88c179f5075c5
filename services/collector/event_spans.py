"""Where each event of a batch body lies, found without parsing the events themselves.

Validating a whole batch at once builds a parse tree of the whole body first (about 3x its size natively), so a
large body is validated one event at a time instead: this module finds the byte span of each element of the
top-level `"events"` array with a scan over the JSON's structural characters (braces, brackets and strings;
numbers, which make up most of a compact record, are skipped by the regex engine). Anything but the plain
shape `{"schema_version": <int>, "events": [{...}, ...]}` (keys in any order) returns None, and the caller
validates the body as a whole, which explains what is wrong with it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_WS = re.compile(rb"[ \t\r\n]*")
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_STRUCTURAL = re.compile(rb'[{}\[\]"]')
_INTEGER = re.compile(rb"-?(?:0|[1-9][0-9]*)(?![0-9.eE])")


@dataclass(frozen=True, slots=True)
class BatchLayout:
    schema_version: int | None  # None: not given (the default applies)
    events: list[tuple[int, int]]  # [start, end) of each event object


def find_event_spans(body: bytes | bytearray) -> BatchLayout | None:
    try:
        return _scan(body)
    except _NotPlain:
        return None


class _NotPlain(Exception):
    pass


def _skip_ws(body: bytes | bytearray, pos: int) -> int:
    match = _WS.match(body, pos)
    return match.end() if match else pos


def _expect(body: bytes | bytearray, pos: int, char: bytes) -> int:
    pos = _skip_ws(body, pos)
    if body[pos:pos + 1] != char:
        raise _NotPlain
    return pos + 1


def _scan(body: bytes | bytearray) -> BatchLayout:
    pos = _expect(body, 0, b"{")
    version: int | None = None
    events: list[tuple[int, int]] | None = None
    seen: set[bytes] = set()
    while True:
        pos = _skip_ws(body, pos)
        key = _STRING.match(body, pos)
        if key is None:
            raise _NotPlain
        name = key.group()[1:-1]
        if name in seen:
            raise _NotPlain
        seen.add(name)
        pos = _expect(body, key.end(), b":")
        pos = _skip_ws(body, pos)
        if name == b"events":
            events, pos = _scan_events(body, pos)
        elif name == b"schema_version":
            number = _INTEGER.match(body, pos)
            if number is None:
                raise _NotPlain
            version, pos = int(number.group()), number.end()
        else:
            raise _NotPlain  # an unknown key: the whole-body validation names it
        pos = _skip_ws(body, pos)
        if body[pos:pos + 1] == b",":
            pos += 1
            continue
        pos = _expect(body, pos, b"}")
        break
    if _skip_ws(body, pos) != len(body) or events is None:
        raise _NotPlain
    return BatchLayout(schema_version=version, events=events)


def _scan_events(body: bytes | bytearray, pos: int) -> tuple[list[tuple[int, int]], int]:
    pos = _expect(body, pos, b"[")
    spans: list[tuple[int, int]] = []
    pos = _skip_ws(body, pos)
    if body[pos:pos + 1] == b"]":
        return spans, pos + 1
    while True:
        pos = _skip_ws(body, pos)
        if body[pos:pos + 1] != b"{":
            raise _NotPlain
        end = _end_of_object(body, pos)
        spans.append((pos, end))
        pos = _skip_ws(body, end)
        separator = body[pos:pos + 1]
        if separator == b"]":
            return spans, pos + 1
        if separator != b",":
            raise _NotPlain
        pos += 1


def _end_of_object(body: bytes | bytearray, start: int) -> int:
    """Index just past the `}` that closes the object opened at `start`."""
    depth = 0
    pos = start
    while True:
        match = _STRUCTURAL.search(body, pos)
        if match is None:
            raise _NotPlain
        char = match.group()
        if char == b'"':
            string = _STRING.match(body, match.start())
            if string is None:
                raise _NotPlain
            pos = string.end()
            continue
        pos = match.end()
        if char in (b"{", b"["):
            depth += 1
        else:
            depth -= 1
            if depth == 0:
                if char != b"}":
                    raise _NotPlain
                return pos
            if depth < 0:
                raise _NotPlain
