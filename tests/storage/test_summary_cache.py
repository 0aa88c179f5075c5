"""The process's cache of decoded step blocks: keyed by the changes a summary was made at, bounded in bytes."""

from __future__ import annotations

import numpy as np
import pandas as pd

from services.analysis.step_blocks import StepBlock, summarize_block
from services.storage.summary_cache import KeptEvents, SummaryCache


def _block(block: int, ranks: int = 4, steps: int = 16) -> StepBlock:
    rank = np.repeat(np.arange(ranks), steps)
    step = np.tile(np.arange(steps) + block * 128, ranks)
    start = np.arange(ranks * steps, dtype=float)
    return summarize_block(0, block, rank, step, start, start + 1.0, np.full(ranks * steps, 0.1))


def test_a_block_is_found_only_at_the_changes_it_was_summarised_at() -> None:
    cache = SummaryCache()
    block = _block(1)
    cache.keep_block((7, 0, 1), 3, block)
    assert cache.block((7, 0, 1), 3) == (True, block)
    assert cache.block((7, 0, 1), 4) == (False, None)  # rows arrived since: read it again
    cache.keep_block((7, 0, 1), 2, _block(1))  # an older summary (another process, late) does not replace it
    assert cache.block((7, 0, 1), 3) == (True, block)
    cache.keep_block((7, 0, 2), 1, None)  # a block without rows is remembered as such
    assert cache.block((7, 0, 2), 1) == (True, None)


def test_the_least_recently_used_blocks_go_first_beyond_the_capacity() -> None:
    size = _block(0).nbytes
    cache = SummaryCache(capacity_bytes=3 * size)
    for b in range(3):
        cache.keep_block((1, 0, b), 1, _block(b))
    assert cache.block((1, 0, 0), 1)[0]  # used: the next to go is block 1
    cache.keep_block((1, 0, 3), 1, _block(3))
    assert [cache.block((1, 0, b), 1)[0] for b in range(4)] == [True, False, True, True]


def test_a_forgotten_run_keeps_nothing() -> None:
    cache = SummaryCache()
    cache.keep_block((1, 0, 0), 1, _block(0))
    cache.keep_block((2, 0, 0), 1, _block(0))
    cache.forget(1)
    assert cache.block((1, 0, 0), 1) == (False, None) and cache.block((2, 0, 0), 1)[0]


def _events(run: int, count: int = 20) -> KeptEvents:
    ids = [f"{run}-attempt-start-{i}" for i in range(count)]
    frame = pd.DataFrame({"event_id": ids, "kind": ["attempt_start"] * count, "time": np.arange(count, dtype=float),
                          "data": ['{"world_size":256,"host":"node-17"}'] * count})
    return KeptEvents(ids=frozenset(ids), frame=frame)


def test_a_fleets_live_runs_all_stay_warm_while_they_fit() -> None:
    """40 live runs (more than the 32 a count bound kept, which made them evict each other in turn): every one's
    events stay, and the bytes they hold are counted (and reported) with the blocks'."""
    cache = SummaryCache()
    reported: list[int] = []
    cache.report_size_to(reported.append)
    kept = {run: _events(run) for run in range(40)}
    for _ in range(3):  # the analyst's rounds, each building every run in turn
        for run, events in kept.items():
            cache.keep_events(run, events)
    assert all(cache.holds(run) and cache.events(run) is kept[run] for run in kept)
    assert cache.nbytes == sum(events.nbytes for events in kept.values()) == reported[-1]
    assert kept[0].nbytes > kept[0].frame.memory_usage(deep=True).sum()  # the ids too


def test_past_the_capacity_blocks_go_first_then_the_least_recently_used_runs_events() -> None:
    events = {run: _events(run) for run in range(4)}
    block = _block(0)
    cache = SummaryCache(capacity_bytes=sum(events[run].nbytes for run in range(3)) + block.nbytes - 1)
    for run in range(2):
        cache.keep_events(run, events[run])
    cache.keep_block((0, 0, 0), 1, block)
    assert cache.events(0) is events[0]  # run 0 used since: run 1 is the next run to go
    cache.keep_events(2, events[2])  # fits once the block is gone
    assert not cache.block((0, 0, 0), 1)[0] and all(cache.holds(run) for run in range(3))
    cache.keep_events(3, events[3])
    assert [cache.holds(run) for run in range(4)] == [True, False, True, True]
    assert cache.nbytes == sum(events[run].nbytes for run in (0, 2, 3))


def test_events_kept_again_replace_their_bytes_and_a_forgotten_run_returns_them() -> None:
    cache = SummaryCache()
    cache.keep_events(1, _events(1, count=10))
    more = _events(1, count=30)  # the run's new events read since
    cache.keep_events(1, more)
    assert cache.nbytes == more.nbytes
    cache.forget(1)
    assert cache.nbytes == 0 and not cache.holds(1)
