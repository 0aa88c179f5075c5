"""Two hand-written shortcuts on every record's path, held to what they stand for: `IngestRecord.renumbered` to
dataclasses.replace, and the launch attempts gathered in plain lists to LaunchAttempt.merged over one LaunchAttempt
per record (what services.storage.attempt_numbers did before)."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from services.analysis.attempt_numbers import LEGACY, LaunchAttempt
from services.storage.attempt_numbers import RunKey, _launch_attempts
from services.storage.records import CollectiveRows, IngestRecord, StepRows, column_min


def _every_field_set() -> IngestRecord:
    steps = StepRows(step=np.array([4, 5]), start=np.array([1.0, 2.0]), end=np.array([2.0, 3.0]),
                     loss=np.array([0.5, 0.4]), lr=np.array([1e-3, 1e-3]), comm=np.array([0.1, 0.2]))
    collectives = CollectiveRows(step=np.array([4]), op=["all_reduce"], start=np.array([1.5]), end=np.array([1.6]))
    return IngestRecord(run_id="run", event_id="e1", kind="steps", time=3.0, attempt=2, rank=7, step=5,
                        data={"n": 2}, launch="node-a", step_rows=steps, collective_rows=collectives)


def test_renumbered_is_replace_of_the_attempt_and_launch() -> None:
    record = _every_field_set()
    for field in dataclasses.fields(IngestRecord):  # a field added later must be set above, and carried over
        assert getattr(record, field.name) != field.default, f"set {field.name} in _every_field_set"
    mine, theirs = record.renumbered(9), dataclasses.replace(record, attempt=9, launch=None)
    for field in dataclasses.fields(IngestRecord):
        assert getattr(mine, field.name) is getattr(theirs, field.name) or \
            getattr(mine, field.name) == getattr(theirs, field.name), field.name


def _merged_one_by_one(records: list[tuple[int, IngestRecord]]) -> dict[RunKey, LaunchAttempt]:
    out: dict[RunKey, LaunchAttempt] = {}
    for run_pk, r in records:
        if r.attempt is None:
            continue
        start = r.time
        for rows in (r.step_rows, r.collective_rows):
            if rows is not None and len(rows.start):
                start = min(start, column_min(rows.start))
        world = r.data.get("world_size") if r.kind == "attempt_start" and r.data else None
        said = LaunchAttempt(launch=r.launch or LEGACY, attempt=r.attempt, start=start,
                             world_size=int(world) if world is not None else None, rank_lo=r.rank, rank_hi=r.rank)
        key = (run_pk, r.launch or LEGACY, r.attempt)
        out[key] = said if key not in out else out[key].merged(said)
    return out


@st.composite
def _records(draw: st.DrawFn) -> tuple[int, IngestRecord]:
    kind = draw(st.sampled_from(["steps", "attempt_start", "heartbeat", "run_end"]))
    time = draw(st.floats(1e9, 1e9 + 100))
    attempt = None if kind == "run_end" else draw(st.integers(0, 2))
    rank = None if kind == "run_end" else draw(st.integers(0, 5))
    rows = None
    if kind == "steps":
        starts = np.array(draw(st.lists(st.floats(1e9 - 50, 1e9 + 100), min_size=1, max_size=4)))
        rows = StepRows(step=np.arange(len(starts)), start=starts, end=starts + 1.0, loss=starts * 0, lr=starts * 0,
                        comm=starts * 0)
    data = {"world_size": draw(st.integers(1, 8)), "host": "h"} if kind == "attempt_start" else None
    return draw(st.integers(1, 2)), IngestRecord(
        run_id="run", event_id=f"e{time}", kind=kind, time=time, attempt=attempt, rank=rank, data=data,
        launch=draw(st.sampled_from([None, "node-a", "node-b"])), step_rows=rows)


@given(st.lists(_records(), max_size=12))
def test_launch_attempts_gathered_are_the_records_merged_one_by_one(records) -> None:
    assert _launch_attempts(records) == _merged_one_by_one(records)
