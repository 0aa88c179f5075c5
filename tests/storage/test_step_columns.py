"""A rank's rows of the blocks it has left live in one block row each (services.storage.step_columns), and every
reader finds them there: the rank drill-down and the live tail see every step as sent, a late row for a block
already moved is kept in `steps` until the rank's next block, and nothing is stored twice: a record sent again once
its rows moved (its event row gone with them) is recognised by its rows (services.storage.moved_repeats)."""

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
from services.storage.step_columns import MOVE_CHUNK_STEPS, stored_step_keys
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
    for first in range(0, last, 10):  # ten steps per record, as a client posts them; rank 1's step 5 comes late
        batch = [record(f"r{rank}-{first}", rank, [s for s in range(first, min(first + 10, last))
                                                  if (rank, s) != (1, 5)]) for rank in range(RANKS)]
        assert write(engine, batch) == (RANKS, 0)
    late = record("late", 1, [5])  # a row of a block already moved, sent late
    assert write(engine, [late]) == (1, 0)
    # sent again after their rows moved, under their ids or regrouped under new ones: duplicates, stored once
    assert write(engine, [record("r1-0", 1, [0, 1, 2, 3, 4, 6, 7, 8, 9])]) == (0, 1)
    assert write(engine, [record("regrouped", 2, list(range(100, 140)))]) == (0, 1)
    assert write(engine, [record("r0-10", 0, list(range(10, 20))), record("late", 1, [5])]) == (0, 2)

    with engine.connect() as conn:
        blocks = conn.execute(text("SELECT rank, block, rows FROM step_columns ORDER BY rank, block")).all()
        head = conn.execute(text("SELECT rank, step FROM steps ORDER BY rank, step")).all()
        run = get_run(conn, "cols")
        rank_steps = load_rank_steps(conn, run.pk, 1)
        keys = stored_step_keys(conn)
        state = load_live_state(conn, run, now=T0 + last * 1.25 + 2)
    assert [tuple(b) for b in blocks] == [(r, b, BLOCK_STEPS - ((r, b) == (1, 0))) for r in range(RANKS)
                                          for b in range(3)]
    # each rank's current block stays in `steps`, with the late row until the rank's next block
    assert [tuple(h) for h in head] == sorted([(r, s) for r in range(RANKS) for s in range(3 * BLOCK_STEPS, last)]
                                              + [(1, 5)])
    assert len(keys) == RANKS * last  # every row once, the late one included: nothing stored twice

    sent = record("sent", 1, list(range(last)))
    assert rank_steps["step"].tolist() == list(range(last))
    unique = rank_steps.drop_duplicates("step")
    assert np.array_equal(unique["start"].to_numpy(), np.array(sent["start"]))  # bit for bit
    assert np.array_equal(unique["end"].to_numpy(), np.array(sent["end"]))

    # the live tail: the furthest rank's last steps, reaching back into the block it left
    leader = record("leader", 0, list(range(last - 33, last)))  # the lowest of the ranks furthest ahead
    assert state.leader_step_ends == tuple(leader["end"])
    assert state.leader_step_seconds == tuple(e - s for s, e in zip(leader["start"], leader["end"], strict=True))


def test_a_record_sent_again_after_its_rows_moved_stores_only_the_rows_not_held(engine) -> None:
    steps = list(range(BLOCK_STEPS + 1))  # block 0 moves when the rank enters block 1
    assert write(engine, [record(f"s{s}", 0, [s]) for s in steps]) == (len(steps), 0)
    other_times = record("other", 0, [3])
    other_times["start"] = [t + 0.5 for t in other_times["start"]]  # step 3 reported again, with other times
    mixed = record("mixed", 0, [BLOCK_STEPS - 1, BLOCK_STEPS + 1])  # one held row, one new
    assert write(engine, [record("s7", 0, [7]), other_times, mixed]) == (2, 1)

    with engine.connect() as conn:
        keys = stored_step_keys(conn)["step"].tolist()
        ids = conn.execute(text("SELECT event_id FROM events WHERE kind = 'steps' ORDER BY event_id")).scalars().all()
    # the resume check's "repeated step" (other times) is kept; the held row of `mixed` is not stored twice
    assert sorted(keys) == sorted([*steps, 3, BLOCK_STEPS + 1])
    # event rows stay for the records with rows in `steps`: the current block's and the late one's
    assert ids == sorted(["mixed", "other", f"s{BLOCK_STEPS}"])


def test_a_late_row_moves_when_its_rank_leaves_its_next_block_into_a_second_row_of_its_block(engine) -> None:
    """The usual move takes the block a rank just left and finds, in the same statement, the rows it still has
    further below: a late row of a block already moved goes into a second row of that block when the rank leaves
    its next block, and no row is moved twice."""
    first = [s for s in range(BLOCK_STEPS) if s != 7]  # step 7 comes late
    assert write(engine, [record("b0", 0, first), record("b1-first", 0, [BLOCK_STEPS])]) == (2, 0)
    assert write(engine, [record("late-0", 0, [7])]) == (1, 0)  # block 0 moved already: this one waits in `steps`
    with engine.connect() as conn:
        assert [tuple(b) for b in conn.execute(text("SELECT block, rows FROM step_columns")).all()] == \
            [(0, BLOCK_STEPS - 1)]
    # the rank leaves block 1 for block 2: block 1's rows and the late row of block 0 move, each once
    assert write(engine, [record("b1-rest", 0, list(range(BLOCK_STEPS + 1, 2 * BLOCK_STEPS + 1)))]) == (1, 0)
    # then a step far ahead: the rank enters block 5, and nothing is left to move below block 2's rows
    assert write(engine, [record("ahead", 0, [5 * BLOCK_STEPS + 3])]) == (1, 0)

    with engine.connect() as conn:
        blocks = conn.execute(text("SELECT block, rows FROM step_columns ORDER BY block, rows")).all()
        head = conn.execute(text("SELECT step FROM steps ORDER BY step")).scalars().all()
        keys = stored_step_keys(conn)
    assert [tuple(b) for b in blocks] == [(0, 1), (0, BLOCK_STEPS - 1), (1, BLOCK_STEPS), (2, 1)]
    assert head == [5 * BLOCK_STEPS + 3]
    assert keys["step"].tolist() == [*range(2 * BLOCK_STEPS + 1), 5 * BLOCK_STEPS + 3]  # every row once


def test_heartbeats_are_thinned_to_each_ranks_earliest_and_latest_when_it_moves_a_block(engine) -> None:
    beats: list[dict[str, Any]] = [
        {"event_id": f"hb{rank}-{s}", "run_id": "cols", "kind": "heartbeat", "time": T0 + s * 1.25, "attempt": 0,
         "rank": rank, "step": s} for rank in range(2) for s in range(0, BLOCK_STEPS + 10, 5)]
    before = [b for b in beats if b["step"] <= BLOCK_STEPS]
    after = [b for b in beats if b["step"] > BLOCK_STEPS]
    starts = [{"event_id": f"start{r}", "run_id": "cols", "kind": "attempt_start", "time": T0 - 5, "attempt": 0,
               "rank": r, "world_size": 2, "host": f"node{r}"} for r in range(2)]
    assert write(engine, starts + before) == (2 + len(before), 0)
    assert write(engine, [record(f"r{rank}", rank, list(range(BLOCK_STEPS + 2))) for rank in range(2)]) == (2, 0)
    assert write(engine, after) == (len(after), 0)
    with engine.connect() as conn:
        kept = conn.execute(text("SELECT event_id FROM events WHERE kind = 'heartbeat' ORDER BY event_id")).all()
        run = get_run(conn, "cols")
        state = load_live_state(conn, run, now=T0 + (BLOCK_STEPS + 10) * 1.25)
    # at the move: the first and the latest of each rank; then every later one until its next block
    later = {rank: [b["step"] for b in after if b["rank"] == rank] for rank in range(2)}
    assert [k[0] for k in kept] == sorted(f"hb{rank}-{s}" for rank in range(2)
                                          for s in [0, BLOCK_STEPS - 3, *later[rank]])
    assert {r.rank: r.heartbeat_time for r in state.ranks} == {rank: T0 + (BLOCK_STEPS + 7) * 1.25
                                                                    for rank in range(2)}


def test_a_group_of_many_ranks_entering_blocks_and_one_far_behind_moves_every_row_once(engine) -> None:
    """The group's moves go together, MOVE_CHUNK_STEPS steps per round trip: 70 ranks leaving blocks 0 and 1 (more
    than one round trip's worth: each rank's block just left, then what it has below) and, in the same group, a rank
    bringing 130 blocks at once (moved a slice at a time)."""
    ranks, far = 70, 70
    far_steps = list(range(2 * MOVE_CHUNK_STEPS + 2 * BLOCK_STEPS + 5))
    batch = [record(f"r{rank}", rank, list(range(2 * BLOCK_STEPS + 2))) for rank in range(ranks)]
    assert write(engine, [*batch, record("far", far, far_steps)]) == (ranks + 1, 0)

    with engine.connect() as conn:
        blocks = conn.execute(text("SELECT rank, block, rows FROM step_columns ORDER BY rank, block")).all()
        head = conn.execute(text("SELECT rank, step FROM steps ORDER BY rank, step")).all()
        far_rows = load_rank_steps(conn, get_run(conn, "cols").pk, far)
        keys = stored_step_keys(conn)
    left = len(far_steps) // BLOCK_STEPS
    assert [tuple(b) for b in blocks] == ([(r, b, BLOCK_STEPS) for r in range(ranks) for b in (0, 1)]
                                          + [(far, b, BLOCK_STEPS) for b in range(left)])
    assert [tuple(h) for h in head] == ([(r, s) for r in range(ranks) for s in (2 * BLOCK_STEPS, 2 * BLOCK_STEPS + 1)]
                                        + [(far, s) for s in far_steps[left * BLOCK_STEPS:]])
    assert len(keys) == ranks * (2 * BLOCK_STEPS + 2) + len(far_steps)  # every row once
    sent = record("sent", far, far_steps)
    assert far_rows["step"].tolist() == far_steps
    assert np.array_equal(far_rows["start"].to_numpy(), np.array(sent["start"]))  # bit for bit
    assert np.array_equal(far_rows["end"].to_numpy(), np.array(sent["end"]))
