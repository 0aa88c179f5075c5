"""The process's cache of decoded step blocks: keyed by the changes a summary was made at, bounded in bytes."""

from __future__ import annotations

import numpy as np

from services.analysis.step_blocks import StepBlock, summarize_block
from services.storage.summary_cache import SummaryCache


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
