"""Live hang detection (services.analysis.live): threshold, hung flag and suspects, from hand-built runs stored in a
database and read back as the collector reads them (services.storage.live; tests/live_database.py)."""

from __future__ import annotations

from typing import Any

import pytest

from services.analysis.live import LiveConfig, LiveState, RankState, detect_hang, hang_threshold
from services.analysis.run_data import run_data_from_events
from services.simulate import SimConfig, simulate
from tests.live_database import LiveDatabase, StoredRun, heartbeat_events

T0 = 1_800_000_000.0


def events_of(world: int, steps: int, step_s: float, *, stop_rank: int | None = None, stop_after: int = 0,
              attempt: int = 0) -> list[dict[str, Any]]:
    """A DDP-like run: every rank does `steps` steps of `step_s`; `stop_rank` stops after `stop_after`."""
    out: list[dict[str, Any]] = []
    n = 0

    def emit(kind: str, time: float, **fields: Any) -> None:
        nonlocal n
        n += 1
        out.append({"event_id": str(n), "run_id": "r", "kind": kind, "time": time, **fields})

    for rank in range(world):
        emit("attempt_start", T0, attempt=attempt, rank=rank, world_size=world, host="h")
        emit("resume", T0, attempt=attempt, rank=rank, step=0)
        last = steps if rank != stop_rank else stop_after
        for s in range(1, last + 1):
            start = T0 + 10 + (s - 1) * step_s
            emit("step", start + step_s, attempt=attempt, rank=rank, step=s, start=start, end=start + step_s)
    return out


def stored(live_db: LiveDatabase, world: int = 4, steps: int = 50, step_s: float = 1.0, **kwargs: Any) -> StoredRun:
    return live_db.store(events_of(world, steps, step_s, **kwargs))


def state(live_db: LiveDatabase, world: int = 4, steps: int = 50, step_s: float = 1.0, **kwargs: Any) -> LiveState:
    """The state right after the last step (no heartbeats: the time read at does not change it)."""
    return stored(live_db, world, steps, step_s, **kwargs).state(last_end(steps, step_s))


def last_end(steps: int = 50, step_s: float = 1.0) -> float:
    return T0 + 10 + steps * step_s


@pytest.mark.parametrize(("step_s", "expected", "basis"), [(1.0, 30.0, "floor"), (5.0, 50.0, "steps"),
                                                          (0.01, 30.0, "floor")])
def test_threshold_is_the_larger_of_the_floor_and_ten_median_steps(live_db: LiveDatabase, step_s: float,
                                                                     expected: float, basis: str) -> None:
    threshold, why = hang_threshold(state(live_db, step_s=step_s), LiveConfig())
    assert threshold == pytest.approx(expected) and why == basis


def test_threshold_follows_the_configured_floor_and_factor(live_db: LiveDatabase) -> None:
    assert hang_threshold(state(live_db, step_s=1.0), LiveConfig(floor_s=5, step_factor=3))[0] == pytest.approx(5.0)
    assert hang_threshold(state(live_db, step_s=4.0), LiveConfig(floor_s=5, step_factor=3))[0] == pytest.approx(12.0)


def test_a_run_is_hung_only_once_the_time_without_progress_passes_the_threshold(live_db: LiveDatabase) -> None:
    s = stored(live_db)
    end = last_end()
    assert s.status(end + 29.9).hung is False
    flagged = s.status(end + 30.1)
    assert flagged.hung is True
    assert flagged.seconds_since_progress == pytest.approx(30.1)
    assert flagged.hung_for_seconds == pytest.approx(0.1)
    assert flagged.last_progress_time == pytest.approx(end)


def test_a_finished_run_is_never_hung(live_db: LiveDatabase) -> None:
    ended = {"event_id": "end", "run_id": "r", "kind": "run_end", "time": last_end(5) + 1, "status": "finished"}
    result = live_db.store([*events_of(2, 5, 1.0), ended]).status(T0 + 1e6)
    assert result.status == "finished" and result.hung is False


def test_the_rank_that_has_not_reached_the_pending_step_is_the_suspect(live_db: LiveDatabase) -> None:
    result = stored(live_db, world=4, stop_rank=2, stop_after=47).status(last_end() + 60)
    assert result.hung and [x.rank for x in result.suspects] == [2]
    assert "behind" in result.suspects[0].reasons[0]
    assert result.pending_step == 51


def test_suspects_are_named_only_when_hung(live_db: LiveDatabase) -> None:
    assert stored(live_db, world=4, stop_rank=2, stop_after=47).status(last_end() + 1).suspects == ()


def test_a_rank_that_stopped_heart_beating_is_a_suspect_even_at_the_same_step(live_db: LiveDatabase) -> None:
    now = last_end() + 40
    beats = [(0, now - 2, 51, 1), (1, now - 30, 51, 1), (2, now - 1, 51, 1)]
    result = live_db.store([*events_of(3, 50, 1.0), *heartbeat_events("r", beats)]).status(now)
    assert result.hung
    assert [(x.rank, x.host, x.reasons) for x in result.suspects] == [
        (1, "h", ("no heartbeat for 30 s while other ranks on host h do",))]


def test_ranks_that_sent_no_heartbeat_while_stepping_are_judged_by_their_last_step_end(live_db: LiveDatabase) -> None:
    """As ingest_client sends them: no heartbeat while a rank steps. Rank 1 was SIGSTOPped after step 50 (its last
    word is that step's end); the others wait in step 51's collective and heart-beat from 5 s after their last
    step. Rank 1 is named for its silence since its last step end; before the hang nobody is silent."""
    now = last_end() + 40
    beats = [(r, last_end() + k, 51, 1) for r in (0, 2) for k in range(5, 40, 5)]
    run = live_db.store([*events_of(3, 50, 1.0), *heartbeat_events("r", beats)])
    result = run.status(now)
    assert result.hung
    assert [(x.rank, x.reasons) for x in result.suspects] == [
        (1, ("behind: in step 51 after 0 collective(s); the furthest rank is in step 51",
             "no heartbeat or step end for 40 s while other ranks on host h do"))]
    healthy = live_db.store(events_of(3, 50, 1.0)).status(last_end() + 1)
    assert not healthy.hung and not any(r.silent for r in healthy.ranks)


def test_a_rank_silent_among_its_hosts_reporting_ranks_is_named_before_the_ranks_of_a_silent_host(
        live_db: LiveDatabase) -> None:
    """16 ranks on 2 hosts: rank 11 stopped in step 51 (SIGSTOP: no heartbeat, no step) while the rest of node1
    waits in the step's collective and heart-beats; nothing of node0 has arrived for 40 s (the node is down, or
    its relay's events are still on their way: a collector behind its senders). Before hosts were compared, the
    list was ranks 0-7 and 11, by rank, and the cut at 4 would have left the stuck rank out."""
    now = last_end() + 60
    events = [{**e, "host": f"node{e['rank'] // 8}"} if e["kind"] == "attempt_start" else e
              for e in events_of(16, 50, 1.0)]
    beats = [(r, now - 45, 50, 0) for r in range(8)] + [(r, now - 1, 51, 1) for r in range(8, 16) if r != 11]
    beats.append((11, now - 45, 51, 0))
    result = live_db.store([*events, *heartbeat_events("r", beats)]).status(now, LiveConfig(max_suspects=4))
    assert result.hung and result.suspects_total == 9
    assert [x.rank for x in result.suspects] == [11, 0, 1, 2]
    first = result.suspects[0]
    assert first.host == "node1" and first.reasons[-1] == "no heartbeat for 45 s while other ranks on host node1 do"
    assert result.suspects[1].reasons[-1] == (
        "no heartbeat for 45 s, nor from the 7 other ranks on host node0 (the node is down, or its events have not "
        "reached the collector yet)")
    assert {r.rank: r.host for r in result.ranks}[11] == "node1"


def test_ranks_of_a_late_node_whose_heartbeats_straddle_the_cut_are_not_named_before_the_stuck_rank(
        live_db: LiveDatabase) -> None:
    """What a 10,240-rank fleet load past this machine's capacity showed (benchmarks.load, 2026-12-04): node0's relay
    was ~12 s behind, so its ranks' events reached the collector up to one moment. Ranks 1 and 3 had beaten just
    before that moment, the others up to 4.5 s earlier (heartbeat phases differ within an interval), so those looked
    silent (17 s > 15 s) "while other ranks on host node0 do" and were listed first, by rank. The run is held up by
    rank 11 on node1, which is current and has not started step 51's collective; with 4 listed it was cut."""
    now = last_end() + 40
    events = [{**e, "host": f"node{e['rank'] // 8}"} if e["kind"] == "attempt_start" else e
              for e in events_of(16, 50, 1.0)]
    beats = [(r, now - (12.5 if r in (1, 3) else 17.0), 51, 1) for r in range(8)]
    beats += [(r, now - 1, 51, 0 if r == 11 else 1) for r in range(8, 16)]
    result = live_db.store([*events, *heartbeat_events("r", beats)]).status(now, LiveConfig(max_suspects=4))
    assert result.hung and result.suspects_total == 7
    assert [x.rank for x in result.suspects] == [11, 0, 2, 4]
    assert result.suspects[0].reasons[0].startswith("behind: in step 51 after 0 collective(s)")
    assert result.suspects[1].reasons == (
        "no heartbeat for 17 s; the 7 other ranks on host node0 were last heard from at most 4.5 s later (the node's "
        "events are late, or have not reached the collector yet)",)


def test_a_silent_rank_whose_host_mates_are_two_heartbeats_ahead_is_named_on_its_own(live_db: LiveDatabase) -> None:
    """The same host-mates one heartbeat further on (7.5 s > 1.5 intervals newer): the rank missed a heartbeat its
    neighbours sent, so the evidence is its own."""
    now = last_end() + 40
    events = [{**e, "host": "node0"} if e["kind"] == "attempt_start" else e for e in events_of(4, 50, 1.0)]
    beats = [(0, now - 16.0, 51, 1), (1, now - 8.4, 51, 1), (2, now - 9.0, 51, 1), (3, now - 9.0, 51, 1)]
    result = live_db.store([*events, *heartbeat_events("r", beats)]).status(now)
    assert [(x.rank, x.reasons) for x in result.suspects] == [
        (0, ("no heartbeat for 16 s while other ranks on host node0 do",))]


def test_a_rank_alone_on_its_host_is_named_on_its_own_evidence(live_db: LiveDatabase) -> None:
    """One rank per host: nothing to compare its silence with, so it is not put after the others."""
    now = last_end() + 40
    events = [{**e, "host": f"node{e['rank']}"} if e["kind"] == "attempt_start" else e for e in events_of(3, 50, 1.0)]
    beats = [(0, now - 2, 51, 1), (1, now - 30, 51, 1), (2, now - 1, 51, 1)]
    result = live_db.store([*events, *heartbeat_events("r", beats)]).status(now)
    assert [(x.rank, x.host, x.reasons) for x in result.suspects] == [(1, "node1", ("no heartbeat for 30 s",))]


def test_the_rank_that_has_not_started_the_pending_collective_is_the_suspect(live_db: LiveDatabase) -> None:
    """Every rank finished step 50; ranks 0 and 2 started the first all-reduce of step 51, rank 1 did not."""
    now = last_end() + 40
    beats = [(0, now - 1, 51, 1), (1, now - 1, 51, 0), (2, now - 1, 51, 1)]
    result = live_db.store([*events_of(3, 50, 1.0), *heartbeat_events("r", beats)]).status(now)
    assert [x.rank for x in result.suspects] == [1]


def test_ranks_of_the_world_that_never_reported_are_suspects(live_db: LiveDatabase) -> None:
    events = [e for e in events_of(3, 20, 1.0) if e.get("rank") != 2]
    result = live_db.store(events).status(last_end(20) + 100)
    assert result.world_size == 3
    assert [(x.rank, x.reasons[0]) for x in result.suspects] == [(2, "never reported in this attempt")]


def test_startup_and_checkpoint_writes_get_their_own_floor(live_db: LiveDatabase) -> None:
    starting = live_db.store(events_of(2, 0, 1.0))
    assert hang_threshold(starting.state(T0), LiveConfig())[1] == "startup"
    assert starting.status(T0 + 200).hung is False
    assert starting.status(T0 + 301).hung is True
    events = [*events_of(2, 10, 1.0),
              {"event_id": "ck", "run_id": "r", "kind": "checkpoint_start", "time": last_end(10), "attempt": 0,
               "rank": 0, "step": 10}]
    writing = live_db.store(events).state(last_end(10))
    assert hang_threshold(writing, LiveConfig()) == (300.0, "checkpoint")


def test_hand_built_state_with_one_silent_rank() -> None:
    ranks = tuple(RankState(rank=r, last_step=9, last_step_end=T0 + 9, heartbeat_time=T0 + (9 if r == 1 else 60))
                  for r in range(2))
    s = LiveState(run_id="x", status="running", attempt=0, world_size=2, ranks=ranks,
                  leader_step_ends=tuple(T0 + i for i in range(10)))
    result = detect_hang(s, T0 + 61)
    assert result.hung and result.threshold_seconds == 30.0
    assert [x.rank for x in result.suspects] == [1]
    row = {r.rank: r for r in result.ranks}
    assert row[1].silent and not row[0].silent


def test_a_simulated_running_run_is_flagged_after_its_threshold_and_not_before(live_db: LiveDatabase) -> None:
    sim = simulate(SimConfig(run_id="sim-live", ranks=4, hours=0.05, step_s=4.0, mtbf_s=None, end="running",
                             checkpoint_every=20, seed=3))
    s = live_db.store(sim.events)
    last = float(run_data_from_events("sim-live", sim.events).steps["end"].max())
    result = s.status(last + 1)
    assert result.threshold_seconds == pytest.approx(10 * 4.05, rel=0.01)  # step 4 s + 0.05 s all-reduce
    assert result.hung is False
    assert s.status(last + result.threshold_seconds - 0.01).hung is False
    assert s.status(last + result.threshold_seconds + 0.01).hung is True


def test_a_running_run_whose_attempt_completed_on_every_rank_is_never_hung(live_db: LiveDatabase) -> None:
    """The README's snippet without `goodput launch` may end the attempt but not the run: never a hang alarm."""
    events = events_of(2, 20, 1.0)
    events += [{"event_id": f"end{r}", "run_id": "r", "kind": "attempt_end", "time": last_end(20) + 1,
                "attempt": 0, "rank": r, "reason": "completed"} for r in range(2)]
    live = live_db.store(events)
    for later_s in (60.0, 400.0, 86_400.0):
        assert not live.status(last_end(20) + later_s).hung


def test_a_running_run_whose_attempt_failed_on_every_rank_is_hung_after_the_restart_floor(
        live_db: LiveDatabase) -> None:
    events = events_of(2, 20, 1.0)
    events += [{"event_id": f"end{r}", "run_id": "r", "kind": "attempt_end", "time": last_end(20) + 1,
                "attempt": 0, "rank": r, "reason": "failed"} for r in range(2)]
    live = live_db.store(events)
    assert not live.status(last_end(20) + 60).hung  # torchrun may still be restarting it
    assert live.status(last_end(20) + 400).hung
