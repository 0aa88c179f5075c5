"""Large batches are validated one event at a time: the same records and the same errors as the whole-body
parse, with memory near the body's size."""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

import numpy as np
import pytest

from services.collector import batch as batch_module
from services.collector.batch import parse_batch
from services.collector.event_spans import find_event_spans
from services.errors import InvalidBatch
from tests.collector.test_invalid_batches import CASES, good

T = 1_700_000_000.0
LIMITS = {"max_events": 20_000, "max_rows": 2_000_000}


def _both(body: bytes, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """(whole-body outcome, sliced outcome): a list of records or the InvalidBatch raised."""
    outcomes: list[Any] = []
    for threshold in (1 << 62, 0):
        monkeypatch.setattr(batch_module, "SLICED_PARSE_MIN_BYTES", threshold)
        try:
            outcomes.append(parse_batch(body, **LIMITS))
        except InvalidBatch as exc:
            outcomes.append((exc.status, exc.code, str(exc), exc.details))
    return outcomes[0], outcomes[1]


def _same_records(a: list[Any], b: list[Any]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert (x.run_id, x.event_id, x.kind, x.time, x.attempt, x.rank, x.step, x.data) == \
               (y.run_id, y.event_id, y.kind, y.time, y.attempt, y.rank, y.step, y.data)
        for rows_x, rows_y in ((x.step_rows, y.step_rows), (x.collective_rows, y.collective_rows)):
            assert (rows_x is None) == (rows_y is None)
            if rows_x is not None:
                for name in rows_x.__dataclass_fields__:
                    vx, vy = getattr(rows_x, name), getattr(rows_y, name)
                    if isinstance(vx, np.ndarray):
                        np.testing.assert_array_equal(vx, vy)
                    else:
                        assert vx == vy


def _steps(event_id: str, rank: int, n: int) -> dict[str, Any]:
    return {"event_id": event_id, "run_id": "r {[\"]} \\ \u00e9", "kind": "steps", "time": T, "attempt": 0,
            "rank": rank, "step": list(range(1, n + 1)), "start": [T + i for i in range(n)],
            "end": [T + i + 0.5 for i in range(n)], "loss": [None if i % 7 == 0 else 1.0 / (i + 1) for i in range(n)]}


@pytest.mark.parametrize(("name", "bad", "field"), CASES, ids=[c[0] for c in CASES])
def test_an_invalid_event_gets_the_same_answer_either_way(name: str, bad: dict[str, Any], field: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    body = json.dumps({"events": [good(0), bad, good(1)]}).encode()
    whole, sliced = _both(body, monkeypatch)
    assert whole == sliced
    assert whole[3]["field"] == field


@pytest.mark.parametrize("text", [
    json.dumps({"events": [_steps("a", 0, 50), good(1), _steps("b", 1, 3)]}),
    json.dumps({"schema_version": 1, "events": [good(2)]}, indent=2),
    '{ "events" : [ ' + json.dumps(good(3)) + ' ] , "schema_version" : 1 }\n',
    json.dumps({"events": [{**good(4), "run_id": "quote \" brace } bracket ] backslash \\"}]}),
    json.dumps({"events": [{**good(5), "run_id": "\u6f22\u5b57"}]}, ensure_ascii=False),
])
def test_valid_batches_give_the_same_records_either_way(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    whole, sliced = _both(text.encode(), monkeypatch)
    assert isinstance(whole, list), whole
    _same_records(whole, sliced)


@pytest.mark.parametrize("text", [
    '{"events": [', '{"events": []}', '{"events": [], "extra": 1}', '{"schema_version": 9, "events": [{}]}',
    '{"schema_version": true, "events": [{}]}', '{"events": [1]}', '[1, 2]', '{"events": [{"a": 1}] } x',
    '{"events": [{"kind": "step", "x": [}]}', '{"events": [{"kind": "step"}, ]}', '{"events": {"a": 1}}',
])
def test_odd_bodies_get_the_same_answer_either_way(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    whole, sliced = _both(text.encode(), monkeypatch)
    assert whole == sliced


def test_spans_are_found_without_reading_into_strings() -> None:
    body = json.dumps({"events": [{**good(1), "run_id": "}]{[\"x"}, good(2)]}).encode()
    layout = find_event_spans(body)
    assert layout is not None and len(layout.events) == 2
    assert [json.loads(body[s:e])["event_id"] for s, e in layout.events] == ["ok-1", "ok-2"]


def test_a_large_batch_costs_less_than_its_body_in_memory() -> None:
    body = json.dumps({"events": [_steps(f"e{r}", r, 5000) for r in range(40)]}).encode()
    assert len(body) > batch_module.SLICED_PARSE_MIN_BYTES
    tracemalloc.start()
    try:
        records = parse_batch(body, **LIMITS)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(records) == 40
    assert peak < len(body), f"peak {peak / len(body):.2f}x the body"
