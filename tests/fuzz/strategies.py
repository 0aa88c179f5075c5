"""Hypothesis strategies for event batches: valid ones (every kind, hostile but legal strings) and mutations."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

T0 = 1_700_000_000.0
INJECTIONS = [
    "'; DROP TABLE runs; --",
    "\"; DELETE FROM events WHERE '1'='1",
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    "run' OR '1'='1",
    "${jndi:ldap://x}",
    "../../etc/passwd",
    "Zürich-训练-🚀",
    "a\u202eb",  # right-to-left override
    "%00%2F..%2F",
    "{{7*7}}",
    "\\x00",
]
_CONTROL = "".join(chr(c) for c in range(0x20)) + "\x7f"
printable = st.text(st.characters(exclude_categories=["Cs"], exclude_characters=_CONTROL), min_size=1,
                    max_size=40)
names = st.one_of(st.sampled_from(INJECTIONS), printable)
MAX_WORLD = 65_536  # GOODPUT_MAX_WORLD_SIZE's default: valid events stay within the collector's limits


def reachable(run_id: str) -> bool:
    """A run id the API can address: not only dots, no `.` or `..` path segment (refused at ingest)."""
    return run_id.strip(".") != "" and not any(part in (".", "..") for part in run_id.split("/"))


run_ids = names.filter(reachable)
times = st.floats(T0, T0 + 86_400, allow_nan=False, allow_infinity=False)
ranks = st.integers(0, 7)
attempts = st.integers(0, 3)
steps_ = st.integers(0, 2**53)
finite = st.floats(allow_nan=False, allow_infinity=False)


@st.composite
def events(draw: st.DrawFn, run_id: str | None = None) -> dict[str, Any]:
    event_id = draw(st.text(min_size=1, max_size=20).filter(lambda s: not set(s) & set(_CONTROL)))
    base: dict[str, Any] = {"event_id": event_id, "run_id": run_id or draw(run_ids), "time": draw(times)}
    rank = {"attempt": draw(attempts), "rank": draw(ranks)}
    kind = draw(st.sampled_from(["step", "steps", "collective", "collectives", "attempt_start", "heartbeat",
                                 "checkpoint_start", "checkpoint_end", "attempt_end", "run_end", "client_stats",
                                 "allocation_start", "run_submitted", "resume"]))
    start = draw(times)
    end = start + draw(st.floats(0, 100, allow_nan=False))
    if kind == "step":
        extra = {"step": draw(steps_), "start": start, "end": end, "loss": draw(st.none() | finite),
                 "comm": draw(st.none() | st.floats(0, 1e9))}
        return {**base, **rank, "kind": kind, **{k: v for k, v in extra.items() if v is not None}}
    if kind in ("steps", "collectives"):
        n = draw(st.integers(1, 20))
        starts = [start + i for i in range(n)]
        record = {**base, **rank, "kind": kind, "step": draw(st.lists(steps_, min_size=n, max_size=n)),
                  "start": starts, "end": [s + 0.5 for s in starts]}
        if kind == "collectives":
            record["op"] = draw(st.lists(st.sampled_from(["all_reduce", "<b>op</b>", "x'--"]), min_size=n,
                                         max_size=n))
        return record
    if kind == "collective":
        return {**base, **rank, "kind": kind, "step": draw(steps_), "op": draw(names), "start": start, "end": end}
    if kind == "attempt_start":
        world = draw(st.integers(1, MAX_WORLD))
        return {**base, "attempt": rank["attempt"], "rank": draw(st.integers(0, world - 1)), "kind": kind,
                "world_size": world, "host": draw(names)}
    if kind == "heartbeat":
        return {**base, **rank, "kind": kind}
    if kind in ("checkpoint_start", "resume"):
        record = {**base, **rank, "kind": kind, "step": draw(steps_)}
        if kind == "resume" and draw(st.booleans()):
            record["digest"] = draw(names)  # of the state it loaded
        return record
    if kind == "checkpoint_end":
        return {**base, **rank, "kind": kind, "step": draw(steps_), "ok": draw(st.booleans())}
    if kind == "attempt_end":
        return {**base, **rank, "kind": kind, "reason": draw(st.sampled_from(["completed", "failed", "preempted"])),
                "detail": draw(names)}
    if kind == "run_end":
        return {**base, "kind": kind, "status": draw(st.sampled_from(["finished", "failed", "cancelled"]))}
    if kind == "client_stats":
        return {**base, **rank, "kind": kind, "dropped_events": draw(st.integers(0, 2**62))}
    if kind == "allocation_start":
        return {**base, "kind": kind, "gpus": draw(st.integers(1, MAX_WORLD)),
                "hosts": draw(st.lists(names, max_size=5))}
    return {**base, "kind": kind, "name": draw(names), "gpus": draw(st.integers(1, MAX_WORLD))}


@st.composite
def implausible(draw: st.DrawFn) -> tuple[list[dict[str, Any]], str]:
    """A batch with an event that breaks a plausibility limit on its own; the field the 422 must name. Times are
    near the collector's clock (`time.time()` at draw)."""
    import time as _time

    now = _time.time()
    t = now - draw(st.floats(10, 1e6))
    run = draw(run_ids)
    rank = {"attempt": draw(attempts), "rank": draw(ranks)}
    how = draw(st.sampled_from(["world", "gpus", "rank", "future", "long_step", "dots"]))
    if how == "world":
        return [{"event_id": "w", "run_id": run, "kind": "attempt_start", "time": t, **rank, "host": "h",
                 "world_size": draw(st.integers(MAX_WORLD + 1, 1 << 20))}], "world_size"
    if how == "gpus":
        return [{"event_id": "g", "run_id": run, "kind": "allocation_start", "time": t,
                 "gpus": draw(st.integers(MAX_WORLD + 1, 1 << 20))}], "gpus"
    if how == "rank":
        big = draw(st.integers(MAX_WORLD, (1 << 20) - 1))
        return [{"event_id": "r", "run_id": run, "kind": "heartbeat", "time": t, "attempt": 0, "rank": big}], "rank"
    if how == "future":
        late = now + draw(st.floats(2 * 86_400, 1e9))  # (bounds independent of the clock: replays draw alike)
        return [{"event_id": "f", "run_id": run, "kind": "heartbeat", "time": late, **rank}], "time"
    if how == "long_step":
        start = t - draw(st.floats(2 * 86_400, 7e8))
        kind = draw(st.sampled_from(["step", "collective"]))
        extra = {"op": "all_reduce"} if kind == "collective" else {}
        return [{"event_id": "s", "run_id": run, "kind": kind, "time": t, **rank, "step": 1, "start": start,
                 "end": t, **extra}], "end"
    dots = draw(st.sampled_from([".", "..", "...", "a/..", "../a", "a/./b"]))
    return [{"event_id": "d", "run_id": dots, "kind": "run_end", "time": t, "status": "finished"}], "run_id"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30) | st.sampled_from(INJECTIONS),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)


@st.composite
def mutated(draw: st.DrawFn) -> tuple[dict[str, Any], str]:
    """A valid event with one thing broken, and the field broken (or "" when the whole event is)."""
    event = draw(events())
    how = draw(st.sampled_from(["drop", "replace", "add", "kind", "absurd"]))
    keys = sorted(event)
    if how == "drop":
        key = draw(st.sampled_from(keys))
        del event[key]
        return event, key
    if how == "replace":
        key = draw(st.sampled_from(keys))
        event[key] = draw(json_values)
        return event, key
    if how == "add":
        key = draw(st.text(min_size=1, max_size=12).filter(lambda k: k not in event))
        event[key] = draw(json_values)
        return event, key
    if how == "kind":
        event["kind"] = draw(st.text(max_size=20))
        return event, "kind"
    key, value = draw(st.sampled_from([
        ("time", 0.0), ("time", -1e300), ("time", 1e300), ("time", 4_102_444_801.0), ("attempt", 2**31),
        ("rank", -1), ("rank", 1 << 20), ("run_id", ""), ("run_id", "r" * 257), ("event_id", "e" * 129),
        ("run_id", "tab\there"), ("time", "1700000000"), ("time", True),
    ]))
    event[key] = value
    return event, key


def body(events_: list[dict[str, Any]]) -> bytes:
    return json.dumps({"events": events_}).encode()
