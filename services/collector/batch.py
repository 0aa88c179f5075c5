"""Request body -> validated IngestRecords, or an InvalidBatch naming the event, its id and the field."""

from __future__ import annotations

import re
import zlib
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from services.collector.event_spans import find_event_spans
from services.collector.records import record_of
from services.errors import InvalidBatch
from services.schemas.events import EVENT_ADAPTER, EVENT_KINDS, SCHEMA_VERSION, EventBatch
from services.storage.records import IngestRecord


def decompress(body: bytes | bytearray, encoding: str | None, max_bytes: int) -> bytes | bytearray:
    """Undo Content-Encoding gzip/deflate, refusing to inflate past max_bytes (a zip bomb costs nothing).

    The stream must be whole and alone: a truncated stream (no CRC trailer), a wrong CRC, trailing bytes or a
    second gzip member are refused, since any of them means the batch is not the one the client wrote.
    CPU-bound (zlib releases the GIL): call it from a worker thread, never on the event loop.
    """
    encoding = (encoding or "identity").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise InvalidBatch(f"unsupported Content-Encoding {encoding!r}; send gzip, deflate or identity",
                           status=415, code="unsupported_encoding")
    inflater = zlib.decompressobj(wbits=47)  # gzip or zlib header, detected
    try:
        out = inflater.decompress(body, max_bytes + 1)
    except zlib.error as exc:
        raise InvalidBatch(f"the body is not valid {encoding} data: {exc}", status=400, code="bad_encoding") from exc
    if len(out) > max_bytes or inflater.unconsumed_tail:
        raise InvalidBatch(f"the decompressed body is larger than the {max_bytes}-byte limit; send smaller batches",
                           status=413, code="body_too_large")
    if not inflater.eof:
        raise InvalidBatch(f"the {encoding} stream is truncated (it ends before its checksum); nothing was stored, "
                           "send the batch again", status=400, code="bad_encoding")
    if inflater.unused_data:
        raise InvalidBatch(f"the body has {len(inflater.unused_data)} bytes after the end of its {encoding} stream "
                           "(trailing data or a second member); send one stream per request",
                           status=400, code="bad_encoding")
    return out


def decompress_within(body: bytes | bytearray, encoding: str | None, max_bytes: int,
                      within_bytes: int) -> bytes | bytearray | None:
    """`decompress`, for a body that inflates to at most `within_bytes`; None, having inflated no more than that, for
    one that inflates to more (inflate it again with `decompress`, where a long inflate holds up nothing)."""
    if within_bytes >= max_bytes:
        return decompress(body, encoding, max_bytes)
    try:
        return decompress(body, encoding, within_bytes)
    except InvalidBatch as exc:
        if exc.code == "body_too_large":
            return None
        raise


# Above this size a batch is validated one event at a time (services.collector.event_spans): memory stays near
# the body's size instead of a parse tree of the whole body on top of it.
SLICED_PARSE_MIN_BYTES = 1 << 20
_BLANK = re.compile(rb"\s*")


def parse_batch(body: bytes | bytearray, *, max_events: int, max_rows: int) -> list[IngestRecord]:
    if _BLANK.fullmatch(body):  # (body.strip() would copy the whole body)
        raise InvalidBatch('the body is empty; send {"events": [...]}', status=400, code="malformed_json")
    layout = find_event_spans(body) if len(body) >= SLICED_PARSE_MIN_BYTES else None
    if layout is not None and (layout.schema_version is None or 1 <= layout.schema_version <= SCHEMA_VERSION):
        _check_count(len(layout.events), max_events)
        records = [_event_record(body, i, start, end) for i, (start, end) in enumerate(layout.events)]
    else:
        try:
            batch = EventBatch.model_validate_json(body)
        except ValidationError as exc:
            raise _explain(exc, body) from None
        _check_count(len(batch.events), max_events)
        records = [record_of(event) for event in batch.events]
    rows = sum(len(r.step_rows.step) if r.step_rows is not None else
               len(r.collective_rows.step) if r.collective_rows is not None else 0 for r in records)
    if rows > max_rows:
        raise InvalidBatch(f"the batch holds {rows} step/collective rows, more than the limit of {max_rows}; split it",
                           status=413, code="batch_too_large", field="events")
    return records


def _check_count(n: int, max_events: int) -> None:
    if n == 0:
        raise InvalidBatch("the batch has no events; send at least one", status=422, code="empty_batch", field="events")
    if n > max_events:
        raise InvalidBatch(f"the batch has {n} events, more than the limit of {max_events}; split it",
                           status=413, code="batch_too_large", field="events")


def _event_record(body: bytes | bytearray, index: int, start: int, end: int) -> IngestRecord:
    raw = body[start:end]
    try:
        event = EVENT_ADAPTER.validate_json(raw, strict=True)
    except ValidationError as exc:
        raise _explain(exc, raw, at_index=index) from None
    return record_of(event)


def _explain(exc: ValidationError, body: bytes | bytearray, *, at_index: int | None = None) -> InvalidBatch:
    """`at_index`: `body` is that one event of the batch (the sliced parse), not the whole batch."""
    first = exc.errors(include_url=False)[0]
    loc = tuple(first.get("loc", ()))
    if at_index is not None:
        loc = ("events", at_index, *loc)
    kind = first.get("type", "")
    if kind == "json_invalid":
        return InvalidBatch(f"the body is not valid JSON: {first.get('msg')}", status=400, code="malformed_json")
    if not loc or loc[0] != "events" or len(loc) < 2 or not isinstance(loc[1], int):
        where = ".".join(str(p) for p in loc) or "body"
        status = 400 if kind in ("model_type", "model_attributes_type", "dict_type") else 422
        return InvalidBatch(f"{where}: {first.get('msg')}", status=status, code="invalid_batch", field=where)
    index = loc[1]
    event = _raw_event(body, index) if at_index is None else _raw_single_event(body)
    event_id = event.get("event_id") if isinstance(event, dict) else None
    event_id = event_id if isinstance(event_id, str) else None
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        got = event.get("kind") if isinstance(event, dict) else None
        field = "kind"
        msg = (f"unknown kind {got!r}; expected one of {', '.join(EVENT_KINDS)}" if got is not None
               else "missing field 'kind'")
    else:
        # loc = ("events", i, <kind tag>, field, [index]); a whole-event check has no field after the tag
        parts = [str(p) for p in loc[3:]]
        ctx_field = (first.get("ctx") or {}).get("field")
        field = ".".join(parts) if parts else (ctx_field or "event")
        msg = first.get("msg", "invalid")
        if kind == "missing":
            msg = "missing required field"
        elif kind == "extra_forbidden":
            msg = "unknown field (not in schema version 1; see docs/events.md)"
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
    who = f"event {index}" + (f" (event_id {event_id!r})" if event_id else "")
    return InvalidBatch(f"{who}: field {field!r}: {msg}; the whole batch was rejected, nothing stored",
                        status=422, code="invalid_event", index=index, event_id=event_id, field=field)


class _EventIdentity(BaseModel):
    """Only what names an event in an error message; every other field is skipped by the parser, not built."""

    model_config = ConfigDict(extra="ignore")
    event_id: Any = None
    kind: Any = None


class _BatchIdentities(BaseModel):
    model_config = ConfigDict(extra="ignore")
    events: list[_EventIdentity | Any]


def _raw_single_event(body: bytes | bytearray) -> Any:
    try:
        return _EventIdentity.model_validate_json(body).model_dump()
    except Exception:  # best effort, only to name the event in the message
        return None


def _raw_event(body: bytes | bytearray, index: int) -> Any:
    try:
        event = _BatchIdentities.model_validate_json(body).events[index]
    except Exception:  # best effort, only to name the event in the message
        return None
    return event.model_dump() if isinstance(event, _EventIdentity) else event
