"""An independent reading of docs/events.md (schema v1), used by the fake collector.

Deliberately not built from ingest_client.common.events, so that a mistake there shows up here.
"""

from __future__ import annotations

import math
from typing import Any

INT, FLOAT, STR, BOOL, STR_LIST = "int", "float", "str", "bool", "[str]"
AR = {"attempt": INT, "rank": INT}
KINDS: dict[str, tuple[dict[str, str], dict[str, str]]] = {
    # kind: (required extra fields, optional extra fields)
    "run_submitted": ({}, {"job_id": STR, "name": STR, "gpus": INT}),
    "allocation_start": ({"gpus": INT}, {"job_id": STR, "hosts": STR_LIST}),
    "allocation_end": ({}, {"job_id": STR}),
    "attempt_start": ({**AR, "world_size": INT, "host": STR},
                      {"local_rank": INT, "pid": INT, "restart_count": INT, "generation": INT}),
    "resume": ({**AR, "step": INT}, {"checkpoint_step": INT, "checkpoint": STR, "digest": STR}),
    "step": ({**AR, "step": INT, "start": FLOAT, "end": FLOAT}, {"loss": FLOAT, "lr": FLOAT, "comm": FLOAT}),
    "steps": ({**AR, "step": "[int]", "start": "[float]", "end": "[float]"},
              {"loss": "[float?]", "lr": "[float?]", "comm": "[float?]"}),
    "checkpoint_start": ({**AR, "step": INT}, {"request_id": INT}),
    "checkpoint_end": ({**AR, "step": INT, "ok": BOOL}, {"request_id": INT}),
    "collective": ({**AR, "step": INT, "op": STR, "start": FLOAT, "end": FLOAT}, {}),
    "collectives": ({**AR, "step": "[int]", "op": "[str]", "start": "[float]", "end": "[float]"}, {}),
    "heartbeat": (AR, {"step": INT, "collectives": INT}),
    "digest": ({**AR, "step": INT, "value": STR}, {}),
    "attempt_end": ({**AR, "reason": STR}, {"detail": STR}),
    "run_end": ({"status": STR}, {"detail": STR}),
    "client_stats": ({**AR, "dropped_events": INT, "spool_dropped_events": INT, "send_failures": INT},
                     {"rejected_events": INT, "unspooled_events": INT, "step_clock": STR, "collective_clock": STR}),
    "phase_start": ({**AR, "name": STR, "step": INT}, {}),
    "phase_end": ({**AR, "name": STR, "step": INT, "ok": BOOL}, {}),
}
for _required, _optional in KINDS.values():  # every record of a rank may name its launch
    if "attempt" in _required:
        _optional["launch"] = STR
ENUMS = {"reason": {"completed", "failed", "preempted"}, "status": {"finished", "failed", "cancelled"},
         "step_clock": {"cpu", "cuda"}, "collective_clock": {"cpu", "cuda", "nccl", "off"}}
PHASES = {"eval", "init_process_group"}  # a phase_start's / phase_end's `name`


def _check_scalar(kind: str, value: Any) -> bool:
    if kind == INT:
        return type(value) is int
    if kind == FLOAT:
        return type(value) in (int, float) and math.isfinite(value)
    if kind == STR:
        return isinstance(value, str)
    if kind == BOOL:
        return type(value) is bool
    raise AssertionError(kind)


def validate_event(event: Any) -> str | None:
    """None if ``event`` is valid, else a message naming the problem."""
    if not isinstance(event, dict):
        return "event is not an object"
    for name in ("event_id", "run_id", "kind", "time"):
        if name not in event:
            return f"missing {name}"
    event_id = event["event_id"]
    if not (isinstance(event_id, str) and 1 <= len(event_id) <= 128 and event_id.isprintable()):
        return "bad event_id"
    if not (isinstance(event["run_id"], str) and 1 <= len(event["run_id"]) <= 256):
        return "bad run_id"
    if not _check_scalar(FLOAT, event["time"]) or not 946684800 <= event["time"] <= 4102444800:
        return f"bad time {event['time']!r}"
    kind = event["kind"]
    if kind not in KINDS:
        return f"unknown kind {kind!r}"
    required, optional = KINDS[kind]
    allowed = {"event_id", "run_id", "kind", "time", *required, *optional}
    unknown = set(event) - allowed
    if unknown:
        return f"unknown fields {sorted(unknown)} for {kind}"
    for name in required:
        if name not in event:
            return f"{kind} lacks {name}"
    length = None
    for name, typ in {**required, **optional}.items():
        if name not in event:
            continue
        value = event[name]
        if typ.startswith("["):
            inner = typ[1:-1]
            nullable = inner.endswith("?")
            inner = inner.rstrip("?")
            if not isinstance(value, list):
                return f"{kind}.{name} is not a list"
            if any(not ((nullable and v is None) or _check_scalar(inner, v)) for v in value):
                return f"{kind}.{name} has a bad element"
            if kind in ("steps", "collectives") and name != "hosts":
                if length is None:
                    length = len(value)
                elif len(value) != length:
                    return f"{kind}.{name} length {len(value)} != {length}"
        elif not _check_scalar(typ, value):
            return f"{kind}.{name} has a bad value {value!r}"
        if name in ENUMS and value not in ENUMS[name]:
            return f"{kind}.{name} = {value!r} not allowed"
        if kind.startswith("phase_") and name == "name" and value not in PHASES:
            return f"{kind}.name = {value!r} is not a phase"
    steps = event.get("step")
    for s in steps if isinstance(steps, list) else [steps] if steps is not None else []:
        if not 0 <= s <= 2**53:
            return f"step {s} out of range"
    if kind in ("steps", "collectives") and any(e < s for s, e in zip(event["start"], event["end"], strict=True)):
        return "end < start"
    if kind == "step" and event["end"] < event["start"]:
        return "end < start"
    if kind == "digest" and not (1 <= len(event["value"]) <= 128 and event["value"].isprintable()):
        return f"digest value {event['value']!r} is not 1-128 printable characters"
    return None
