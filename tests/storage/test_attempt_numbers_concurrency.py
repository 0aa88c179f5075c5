"""Several writers numbering one run's attempts at once (PostgreSQL: collector processes and writer threads share the
database): batches of a multi-node run relaunched elsewhere, shuffled, written by 6 threads at a time, with
renumberings among them. Every row must end under the attempt the truth gives it, and no writer may deadlock."""

from __future__ import annotations

import json
import random
import threading
from typing import Any

import pytest
from sqlalchemy import Engine, text

from services.collector.batch import parse_batch
from services.storage.write import write_batches
from tests.collector.test_attempt_numbers_api import MULTI_NODE, run_events, stored


def write(engine: Engine, events: list[dict[str, Any]]) -> None:
    records = parse_batch(json.dumps({"events": events}).encode(), max_events=10**6, max_rows=10**8)
    (result,) = write_batches(engine, [records])
    assert result.conflict is None


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
@pytest.mark.parametrize("seed", range(11, 17))
def test_concurrent_writers_give_every_row_its_attempt(engine: Engine, seed: int) -> None:
    rng = random.Random(seed)
    events = run_events(MULTI_NODE, "nodes", tagged=True, finished_at=120)
    rng.shuffle(events)
    batches = []
    while events:
        n = rng.randint(1, 8)
        batches.append(events[:n])
        events = events[n:]
    errors: list[BaseException] = []

    def worker(mine: list[list[dict[str, Any]]]) -> None:
        try:
            for batch in mine:
                write(engine, batch)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(batches[k::6],)) for k in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    write(engine, run_events(MULTI_NODE, "truth", tagged=False, finished_at=120))
    assert stored(engine, "nodes") == stored(engine, "truth")


def test_a_database_emptied_under_the_writer_gets_its_numbers_again(engine: Engine) -> None:
    """What the process remembered of stored launch attempts is only a hint: with the run deleted (a database
    restored from a backup), the same events are numbered again from scratch."""
    events = run_events(MULTI_NODE, "nodes", tagged=True, finished_at=120)
    write(engine, events)
    write(engine, events)  # all duplicates: their launch attempts are now remembered as stored
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM runs"))
        for table in ("events", "steps", "collectives", "step_marks", "step_blocks", "attempt_numbers"):
            conn.execute(text(f"DELETE FROM {table}"))
    write(engine, events[::-1])
    write(engine, run_events(MULTI_NODE, "truth", tagged=False, finished_at=120))
    assert stored(engine, "nodes") == stored(engine, "truth")
