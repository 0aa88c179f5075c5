"""What the writer stores is what the records say, to the bit: text with the characters that need escaping on the way
(quotes, backslashes, braces, commas, non-ASCII, an escaped NUL inside JSON), times that no decimal writes exactly,
64-bit steps; and the same records sent again are duplicates, never conflicts (their stored digests match)."""

from __future__ import annotations

import json
import math
import struct

import numpy as np
from sqlalchemy import select

from services.analysis.step_blocks import BLOCK_STEPS
from services.storage.records import IngestRecord, StepRows
from services.storage.tables import Event, step_marks
from services.storage.write import write_batches

T = 1_700_000_000.1  # not a binary fraction: its decimal form must read back to the same double
AWKWARD = ['quote " and \\ backslash', "{braces},commas", "NULL", "über—🚀", " padded ", "tab\tnew\nline"]


def steps_record(event_id: str, rank: int, first_step: int, time: float) -> IngestRecord:
    step = np.array([first_step, first_step + 1], dtype=np.int64)
    start = np.array([time, math.nextafter(time, math.inf)])
    nan = np.full(2, np.nan)
    return IngestRecord(run_id="round-trip", event_id=event_id, kind="steps", time=time, attempt=0, rank=rank,
                        step=int(step.max()), data={"n": 2},
                        step_rows=StepRows(step=step, start=start, end=start + 0.5, loss=nan, lr=nan, comm=nan))


def records() -> list[IngestRecord]:
    out = [IngestRecord(run_id="round-trip", event_id=f"note-{i}-{text}", kind="client_stats",
                        time=math.nextafter(T, math.inf) + i, attempt=0, rank=i,
                        data={"note": text, "escaped_nul": "a\u0000b", "nested": {"k": [text, 1.5, None]}})
               for i, text in enumerate(AWKWARD)]
    out += [steps_record(f"steps-{rank}", rank, first_step=2**40 + rank * BLOCK_STEPS, time=T + 1 / 3)
            for rank in range(3)]
    return out


def bits(value: float) -> bytes:
    return struct.pack("<d", value)


def test_event_rows_and_block_marks_round_trip_exactly_and_a_resend_is_all_duplicates(engine) -> None:
    sent = records()
    [result] = write_batches(engine, [sent])
    assert (result.accepted, result.duplicates, result.conflict) == (len(sent), 0, None)

    with engine.connect() as conn:
        stored = {r.event_id: r for r in conn.execute(select(Event.event_id, Event.kind, Event.time, Event.attempt,
                                                             Event.rank, Event.step, Event.data))}
        marks = sorted(tuple(r) for r in conn.execute(select(step_marks.c.rank, step_marks.c.block,
                                                             step_marks.c.changes)))
    assert sorted(stored) == sorted(r.event_id for r in sent)
    for record in sent:
        row = stored[record.event_id]
        assert (row.kind, row.attempt, row.rank, row.step) == (record.kind, record.attempt, record.rank, record.step)
        assert bits(row.time) == bits(record.time)
        assert json.loads(row.data) == record.data
    # each steps record's 2 steps lie in one block, 2**40 // BLOCK_STEPS + rank
    assert marks == [(rank, 2**40 // BLOCK_STEPS + rank, 1) for rank in range(3)]

    [again] = write_batches(engine, [records()])
    assert (again.accepted, again.duplicates, again.conflict) == (0, len(sent), None)
