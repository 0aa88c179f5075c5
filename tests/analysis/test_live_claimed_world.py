"""Live detection costs what the run reported, never what it claimed: ranks that never reported are counted, and
the suspects and rank rows it lists are capped (evidence first)."""

from __future__ import annotations

import time

from services.analysis.live import LiveConfig, LiveState, RankState, detect_hang

T0 = 1_767_225_600.0


def state(world: int, reported: dict[int, int]) -> LiveState:
    """`reported`: rank -> its last step (each step took 1 s, the last ended at T0 + last step)."""
    ranks = tuple(RankState(rank=r, last_step=s, last_step_end=T0 + s, start_time=T0)
                  for r, s in sorted(reported.items()))
    return LiveState(run_id="r", status="running", attempt=0, world_size=world, attempt_start=T0, ranks=ranks,
                     leader_step_ends=tuple(T0 + s for s in range(1, max(reported.values()) + 1)))


def test_a_million_rank_claim_with_one_reporting_rank_is_counted_not_listed() -> None:
    started = time.perf_counter()
    status = detect_hang(state(1 << 20, {0: 10}), now=T0 + 3600)
    seconds = time.perf_counter() - started
    assert status.hung and seconds < 0.1, seconds
    assert status.suspects_total == status.never_reported == (1 << 20) - 1 and status.ranks_total == 1 << 20
    assert [s.rank for s in status.suspects] == list(range(1, 65))
    assert all(s.reasons == ("never reported in this attempt",) for s in status.suspects)
    assert status.suspects_truncated == (1 << 20) - 1 and status.ranks_truncated is True
    assert [r.rank for r in status.ranks] == list(range(128)) and status.ranks[0].reported


def test_a_small_world_lists_every_rank_and_names_the_missing_ones() -> None:
    status = detect_hang(state(8, {0: 10, 1: 10, 2: 10, 3: 9, 4: 10, 5: 10}), now=T0 + 3600)
    assert [s.rank for s in status.suspects] == [3, 6, 7] and status.suspects_total == 3
    assert status.suspects[0].reasons[0].startswith("behind")
    assert status.never_reported == 2 and status.ranks_total == 8
    assert status.suspects_truncated is None and status.ranks_truncated is False
    assert [r.rank for r in status.ranks] == list(range(8))
    assert [r.reported for r in status.ranks] == [True] * 6 + [False] * 2


def test_cut_lists_keep_the_suspects_with_evidence_first() -> None:
    config = LiveConfig(max_suspects=2, max_rank_rows=3)
    status = detect_hang(state(1000, {0: 10, 500: 10, 999: 7}), now=T0 + 3600, config=config)
    assert status.suspects_total == 998  # 999 behind, 997 never reported
    assert [s.rank for s in status.suspects] == [999, 1]  # the rank with evidence, then the lowest missing one
    assert [r.rank for r in status.ranks] == [0, 1, 999]  # the listed suspects', then the reported ranks
