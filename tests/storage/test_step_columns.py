"""A rank's rows of the blocks it has left live in one block row each (services.storage.step_columns), and every
reader finds them there: the rank drill-down and the live tail see every step as sent, a late row for a block
already moved is kept in `steps` until the rank's next block, and nothing is stored twice."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from sqlalchemy import text

from services.analysis.step_blocks import BLOCK_STEPS
from services.collector.batch import parse_batch
from services.storage.live import load_live_state
from services.storage.rank_rows import load_rank_steps
from services.storage.runs import get_run
from services.storage.step_columns import stored_step_keys
from services.storage.write import write_batches
from tests.analysis.scenarios import T0

RANKS = 3


def record(event_id: str, rank: int, steps: list[int]) -> dict[str, Any]:
    """One rank's compact record: step s starts at T0 + 1.25 s + a rank's offset and lasts 1 - 1/7 s."""
    start = [T0 + s * 1.25 + rank / 3 for s in steps]
    return {"event_id": event_id, "run_id": "cols", "kind": "steps", "time": start[-1] + 1, "attempt": 0,
            "rank": rank, "step": steps, "start": start, "end": [t + 1 - 1 / 7 for t in start],
            "loss": [2 + 1 / (s + 3) for s in steps]}


def write(engine: Any, events: list[dict[str, Any]]) -> tuple[int, int]:
    (result,) = write_batches(engine, [parse_batch(json.dumps({"events": events}).encode(), max_events=10**6,
                                                   max_rows=10**8)])
    return result.accepted, result.duplicates


def test_left_blocks_are_one_row_each_and_every_reader_finds_their_steps(engine) -> None:
    starts = [{"event_id": f"start{r}", "run_id": "cols", "kind": "attempt_start", "time": T0 - 5, "attempt": 0,
             "rank": r, "world_size": RANKS, "host": f"node{r}"} for r in range(RANKS)]
    assert write(engine, starts) == (RANKS, 0)
    last = 3 * BLOCK_STEPS + 20  # three blocks left, the fourth current
    for first in range(0, last, 10):  # ten steps per record, as a client posts them
        steps = list(range(first, min(first + 10, last)))
        assert write(engine, [record(f"r{rank}-{first}", rank, steps) for rank in range(RANKS)]) == (RANKS, 0)
    late = record("late", 1, [5])  # a replay regrouped: a row of a block already moved, under a new id
    assert write(engine, [late]) == (1, 0)
    assert write(engine, [record("r1-0", 1, list(range(10)))]) == (0, 1)  # a resend stays a duplicate

    with engine.connect() as conn:
        blocks = conn.execute(text("SELECT rank, block, rows FROM step_columns ORDER BY rank, block")).all()
        head = conn.execute(text("SELECT rank, step FROM steps ORDER BY rank, step")).all()
        run = get_run(conn, "cols")
        rank_steps = load_rank_steps(conn, run.pk, 1)
        keys = stored_step_keys(conn)
        state = load_live_state(conn, run, now=T0 + last * 1.25 + 2)
    assert [tuple(b) for b in blocks] == [(r, b, BLOCK_STEPS) for r in range(RANKS) for b in range(3)]
    # each rank's current block stays in `steps`, with the late row until the rank's next block
    assert [tuple(h) for h in head] == sorted([(r, s) for r in range(RANKS) for s in range(3 * BLOCK_STEPS, last)]
                                              + [(1, 5)])
    assert len(keys) == RANKS * last + 1  # every row once, and the late one: nothing stored twice

    sent = record("sent", 1, list(range(last)))
    assert rank_steps["step"].tolist() == sorted([*range(last), 5])
    unique = rank_steps.drop_duplicates("step")
    assert np.array_equal(unique["start"].to_numpy(), np.array(sent["start"]))  # bit for bit
    assert np.array_equal(unique["end"].to_numpy(), np.array(sent["end"]))

    # the live tail: the furthest rank's last steps, reaching back into the block it left
    leader = record("leader", 0, list(range(last - 33, last)))  # the lowest of the ranks furthest ahead
    assert state.leader_step_ends == tuple(leader["end"])
    assert state.leader_step_seconds == tuple(e - s for s, e in zip(leader["start"], leader["end"], strict=True))
