"""Consecutive compact records of a process go as one record (ingest_client.worker.coalesce), exactly and
deterministically; a send that failed in flight goes again as first sent, so it merges into the same records."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ingest_client.common.events import MAX_ROWS_PER_RECORD
from ingest_client.transport.base import SendResult, SendStatus
from ingest_client.transport.memory import InMemoryTransport
from ingest_client.worker.coalesce import coalesce
from ingest_client.worker.spool import encode_record
from services.schemas.events import EVENT_ADAPTER

T0 = 1.7e9

_floats = st.floats(min_value=T0, max_value=T0 + 1e6, allow_nan=False)
_maybe = st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False))
_seconds = st.one_of(st.none(), st.floats(min_value=0.0, max_value=1e3))


@st.composite
def _records(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A spool's worth of records of two processes' streams: steps (with and without loss, lr, comm), collectives,
    heartbeats between them, another rank's steps, and a few hand-edited records the builder would not write."""
    out: list[dict[str, Any]] = []
    seq = 0
    for _ in range(draw(st.integers(0, 30))):
        seq += 1
        rank = draw(st.sampled_from([0, 0, 0, 1]))
        kind = draw(st.sampled_from(["steps", "steps", "steps", "collectives", "heartbeat"]))
        head = {"event_id": f"p{rank}-{seq}", "run_id": "r", "kind": kind, "time": draw(_floats), "attempt": 0,
                "rank": rank}
        if kind == "heartbeat":
            out.append({**head, "step": seq})
            continue
        n = draw(st.sampled_from([1, 1, 2, 3, 400]))
        steps = draw(st.lists(st.integers(0, 2**53), min_size=n, max_size=n))
        starts = draw(st.lists(_floats, min_size=n, max_size=n))
        record = {**head, "step": steps, "start": starts, "end": [s + 0.5 for s in starts]}
        if kind == "collectives":
            record["op"] = ["all_reduce"] * n
        else:
            for column in ("loss", "lr", "comm"):
                if draw(st.booleans()):
                    values = _seconds if column == "comm" else _maybe
                    record[column] = draw(st.lists(values, min_size=n, max_size=n))
        if draw(st.integers(0, 19)) == 0:
            record["extra"] = 1  # not what the builder writes: sent as it is
        out.append(record)
    return out


def _rows(records: Sequence[dict[str, Any]]) -> dict[tuple[str, int], list[tuple[Any, ...]]]:
    """Every row of every compact record, per (kind, rank), in order; other records as themselves."""
    out: dict[tuple[str, int], list[tuple[Any, ...]]] = {}
    for r in records:
        if r["kind"] in ("steps", "collectives"):
            columns = ["step", "start", "end", "op", "loss", "lr", "comm"]
            n = len(r["step"])
            rows = zip(*[r.get(c) or [None] * n for c in columns], strict=True)
            out.setdefault((r["kind"], r["rank"]), []).extend(rows)
        else:
            out.setdefault((r["kind"], r["rank"]), []).append((r["event_id"],))
    return out


@settings(max_examples=300, deadline=None)
@given(_records())
def test_merging_keeps_every_row_once_in_order_and_each_lone_record_as_it_was(records: list[dict[str, Any]]) -> None:
    payloads = [encode_record(r) for r in records]
    sent = coalesce(payloads)
    assert coalesce(payloads) == sent, "the same frames always merge into the same records"
    decoded = [json.loads(p) for p in sent]
    assert _rows(decoded) == _rows(records)
    assert len({r["event_id"] for r in decoded}) == len(decoded)
    lone = {r["event_id"] for r in records}
    for payload, record in zip(sent, decoded, strict=True):
        if record["event_id"] in lone:
            assert payload in payloads, "a record not merged goes byte for byte as spooled"
            continue
        first, n = record["event_id"].rsplit("+", 1)
        assert first in lone and int(n) >= 2
        assert len(record["step"]) <= MAX_ROWS_PER_RECORD and len(record["event_id"]) <= 128
        assert "extra" not in record
        start = [r["event_id"] for r in records].index(first)
        stream = (record["kind"], record["rank"])
        span = records[start:]
        span = span[:[i for i, r in enumerate(span) if (r["kind"], r["rank"]) == stream][int(n) - 1] + 1]
        constituents = [r for r in span if (r["kind"], r["rank"]) == stream]
        assert all(r["kind"] == "heartbeat" and r["rank"] == record["rank"] for r in span if r not in constituents)
        assert record["time"] == max(r["time"] for r in constituents)
        EVENT_ADAPTER.validate_python(record)  # the collector takes it


def test_runs_of_one_process_merge_past_its_heartbeats_and_another_record_ends_a_run() -> None:
    def steps(seq: int, step: int, **extra: Any) -> dict[str, Any]:
        return {"event_id": f"p-{seq}", "run_id": "r", "kind": "steps", "time": T0 + step, "attempt": 0, "rank": 0,
                "step": [step], "start": [T0 + step - 1], "end": [T0 + step], **extra}

    heartbeat = {"event_id": "p-hb", "run_id": "r", "kind": "heartbeat", "time": T0 + 1.5, "attempt": 0, "rank": 0,
                 "step": 2}
    records = [steps(1, 1, comm=[0.1]), heartbeat, steps(2, 2, loss=[2.5]), steps(3, 3),
               {"event_id": "p-4", "run_id": "r", "kind": "checkpoint_start", "time": T0 + 3, "attempt": 0,
                "rank": 0, "step": 3},
               steps(5, 4), {**steps(6, 5), "attempt": 1}]
    sent = [json.loads(p) for p in coalesce([encode_record(r) for r in records])]
    assert sent.pop(1) == heartbeat, "right after the record it was merged past"
    assert sent[0] == {"event_id": "p-1+3", "run_id": "r", "kind": "steps", "time": T0 + 3, "attempt": 0, "rank": 0,
                       "step": [1, 2, 3], "start": [T0, T0 + 1, T0 + 2], "end": [T0 + 1, T0 + 2, T0 + 3],
                       "loss": [None, 2.5, None], "comm": [0.1, None, None]}
    assert sent[1:] == records[4:], "the checkpoint keeps its place; another attempt is another stream"


def test_a_run_longer_than_the_row_limit_splits_where_the_limit_falls() -> None:
    n = MAX_ROWS_PER_RECORD // 4 + 1
    records = [{"event_id": f"p-{i}", "run_id": "r", "kind": "collectives", "time": T0, "attempt": 0, "rank": 0,
                "step": list(range(n)), "op": ["x"] * n, "start": [T0] * n, "end": [T0] * n} for i in range(1, 6)]
    sent = [json.loads(p) for p in coalesce([encode_record(r) for r in records])]
    assert [r["event_id"] for r in sent] == ["p-1+3", "p-4+2"]


class _StoredButUnanswered(InMemoryTransport):
    """Stores the first batch with steps in it, then answers as a timeout would (the answer lost after the
    commit); while that request is in flight the training loop goes on and its next steps reach the spool."""

    def __init__(self, while_in_flight: Any) -> None:
        super().__init__()
        self._while_in_flight = while_in_flight
        self._failed = False

    def send(self, events: Sequence[bytes], /, *, timeout_s: float | None = None) -> SendResult:
        result = super().send(events, timeout_s=timeout_s)
        if self._failed or not any(b'"kind":"steps"' in e for e in events):
            return SendResult(status=result.status, http_status=200, accepted=result.accepted,
                              duplicates=result.duplicates, send_interval_s=1.0)
        self._failed = True
        self._while_in_flight()
        return SendResult(status=SendStatus.RETRY, message="timed out after 10 s")


def test_a_batch_stored_but_unanswered_goes_again_as_first_sent(make_tracker: Any) -> None:
    tracker: Any = None

    def more_steps() -> None:
        for step in (6, 7, 8):
            tracker.record_step(step, time.time(), time.time())
            time.sleep(0.05)  # each in a flush interval of its own: three more records in the live segment

    transport = _StoredButUnanswered(more_steps)
    tracker = make_tracker(transport=transport, flush_interval_s=0.01)
    deadline = time.monotonic() + 5.0
    while not transport.batches and time.monotonic() < deadline:  # the first round: from now on one a second
        time.sleep(0.01)
    for step in range(1, 6):
        tracker.record_step(step, time.time(), time.time())
        time.sleep(0.05)
    assert not tracker.flush(10.0), "its answer was lost"
    assert tracker.flush(10.0)
    failed = next(i for i, batch in enumerate(transport.batches) if any(r["kind"] == "steps" for r in batch))
    first = transport.batches[failed]
    assert any("+" in r["event_id"] for r in first if r["kind"] == "steps")
    assert 5 <= sum(len(r["step"]) for r in first if r["kind"] == "steps") < 8
    assert transport.batches[failed + 1] == first, "sent again as first sent: the same records, absorbed"
    assert transport.duplicates == len(first)
    assert sorted(s for r in transport.of_kind("steps") for s in r["step"]) == list(range(1, 9))
