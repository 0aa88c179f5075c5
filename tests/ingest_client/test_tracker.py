from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ingest_client.transport import InMemoryTransport
from tests.ingest_client.conftest import spooled_records
from tests.ingest_client.wire import validate_event


def test_steps_are_packed_into_one_compact_record_with_aligned_arrays(make_tracker: Any) -> None:
    transport = InMemoryTransport()
    tracker = make_tracker(transport=transport)
    tracker.resumed(0)
    for step in range(1, 11):
        with tracker.step(step) as s:
            s.loss = 10.0 / step
            if step % 2 == 0:
                s.lr = 0.1
    assert tracker.flush(5.0)

    (steps,) = transport.of_kind("steps")
    assert steps["step"] == list(range(1, 11))
    assert len(steps["start"]) == len(steps["end"]) == len(steps["loss"]) == len(steps["lr"]) == 10
    assert all(e >= s for s, e in zip(steps["start"], steps["end"], strict=True))
    assert steps["loss"] == [10.0 / i for i in range(1, 11)]
    assert steps["lr"] == [None if i % 2 else 0.1 for i in range(1, 11)]
    assert (steps["attempt"], steps["rank"], steps["run_id"]) == (0, 0, "run-test")
    assert transport.of_kind("resume")[0]["step"] == 0
    assert len(transport.of_kind("attempt_start")) == 1
    assert all(validate_event(e) is None for e in transport.events)


def test_event_ids_are_unique_process_id_plus_sequence(make_tracker: Any) -> None:
    transport = InMemoryTransport()
    tracker = make_tracker(transport=transport)
    for step in range(1, 4):
        tracker.record_step(step, time.time() - 0.01, time.time())
        tracker.flush(5.0)
    ids = [e["event_id"] for e in transport.events]
    assert len(ids) == len(set(ids)) >= 4
    assert all(re.fullmatch(rf"{tracker.proc_id}-\d+", i) for i in ids)
    seqs = [int(i.rsplit("-", 1)[1]) for i in ids]
    assert seqs == sorted(seqs)


def test_collectives_use_the_in_progress_step_and_are_packed(make_tracker: Any) -> None:
    transport = InMemoryTransport()
    tracker = make_tracker(transport=transport)
    tracker.resumed(41)
    with tracker.collective("all_reduce"):
        pass
    with tracker.step(42), tracker.collective("all_gather"):
        pass
    with tracker.collective("broadcast"):
        pass
    tracker.flush(5.0)
    (coll,) = transport.of_kind("collectives")
    assert coll["step"] == [42, 42, 43]
    assert coll["op"] == ["all_reduce", "all_gather", "broadcast"]
    assert len(coll["start"]) == len(coll["end"]) == 3


def test_checkpoint_records_start_and_end_with_ok_flag(make_tracker: Any) -> None:
    transport = InMemoryTransport()
    tracker = make_tracker(transport=transport)
    tracker.record_step(7, time.time() - 1, time.time())
    with tracker.checkpoint():
        pass
    try:
        with tracker.checkpoint(8):
            raise OSError("disk full")
    except OSError:
        pass
    tracker.flush(5.0)
    starts = transport.of_kind("checkpoint_start")
    ends = transport.of_kind("checkpoint_end")
    assert [e["step"] for e in starts] == [7, 8]
    assert [(e["step"], e["ok"]) for e in ends] == [(7, True), (8, False)]


def test_failed_step_is_not_recorded_and_non_finite_loss_becomes_null(make_tracker: Any) -> None:
    transport = InMemoryTransport()
    tracker = make_tracker(transport=transport)
    try:
        with tracker.step(1):
            raise RuntimeError("oom")
    except RuntimeError:
        pass
    with tracker.step(1) as s:
        s.loss = float("nan")
    tracker.record_step(2, time.time(), time.time(), loss=float("inf"), lr=1e-3)
    tracker.flush(5.0)
    (steps,) = transport.of_kind("steps")
    assert steps["step"] == [1, 2]
    assert steps["loss"] == [None, None] if "loss" in steps else True
    assert steps["lr"] == [None, 1e-3]


def test_invalid_rows_are_dropped_and_counted_not_sent(make_tracker: Any) -> None:
    transport = InMemoryTransport()
    tracker = make_tracker(transport=transport)
    tracker.record_step(-1, time.time(), time.time())
    tracker.record_step(2**60, time.time(), time.time())
    tracker.record_step(3, time.time(), time.time())
    tracker.flush(5.0)
    assert transport.of_kind("steps")[0]["step"] == [3]
    assert tracker.stats().dropped_events == 2


def test_heartbeats_come_from_the_background_thread(make_tracker: Any) -> None:
    transport = InMemoryTransport()
    make_tracker(transport=transport, heartbeat_interval_s=0.1, flush_interval_s=0.02)
    deadline = time.monotonic() + 3
    while len(transport.of_kind("heartbeat")) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    beats = transport.of_kind("heartbeat")
    assert len(beats) >= 3
    assert set(beats[0]) == {"event_id", "run_id", "kind", "time", "attempt", "rank", "step", "collectives"}
    assert beats[0]["step"] == 1 and beats[0]["collectives"] == 0  # in step 1, no collective started yet


def test_a_rank_that_steps_sends_no_heartbeat_and_one_an_interval_after_its_last_step(make_tracker: Any) -> None:
    """The flusher's ticks driven by hand (every 0.2 s of a made-up clock): steps ending every second for a minute,
    then none (a hang). The step records say the rank lives; heartbeats come once it has ended no step for an
    interval, and then every interval, carrying the step it is stuck in."""
    tracker = make_tracker(transport=InMemoryTransport(), heartbeat_interval_s=5.0, start=False)
    t0, last_step = 1_000_000.0, 60
    beats: list[tuple[float, int]] = []
    for tick in range(0, 80 * 5 + 1):
        now = t0 + tick * 0.2
        if tick % 5 == 0 and 1 <= tick // 5 <= last_step:
            tracker.record_step(tick // 5, now - 1.0, now)
        beats += [(round(row[2] - t0, 1), row[3]["step"]) for row in tracker._tick(now) if row[1] == "heartbeat"]
    # one at the first tick (nothing heard since the tracker was made), none while steps end, then every 5 s
    assert beats == [(0.0, 1), (65.0, 61), (70.0, 61), (75.0, 61), (80.0, 61)]


def test_full_buffer_drops_oldest_and_drop_count_reaches_the_collector(make_tracker: Any) -> None:
    transport = InMemoryTransport()
    tracker = make_tracker(transport=transport, queue_capacity=64, flush_interval_s=5.0)
    now = time.time()
    for step in range(1, 1001):
        tracker.record_step(step, now, now)
    tracker.shutdown(5.0)
    delivered = [s for e in transport.of_kind("steps") for s in e["step"]]
    dropped = tracker.stats().dropped_events
    assert dropped > 0
    # Every row (1000 steps + attempt_start) is either delivered or counted as dropped.
    assert len(delivered) + len(transport.of_kind("attempt_start")) + dropped == 1001
    assert delivered[-1] == 1000  # drop-oldest keeps the newest
    (stats,) = transport.of_kind("client_stats")
    assert stats["dropped_events"] == dropped


def test_client_stats_are_sent_periodically_when_counters_change(make_tracker: Any) -> None:
    transport = InMemoryTransport()
    tracker = make_tracker(transport=transport, queue_capacity=64, stats_interval_s=0.1, flush_interval_s=0.05)
    for step in range(1, 200):
        tracker.record_step(step, time.time(), time.time())
    deadline = time.monotonic() + 3
    while not transport.of_kind("client_stats") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert transport.of_kind("client_stats")[0]["dropped_events"] == tracker.stats().dropped_events > 0


def test_finish_emits_attempt_end_and_run_end_on_rank_zero_only(make_tracker: Any) -> None:
    t0, t1 = InMemoryTransport(), InMemoryTransport()
    rank0 = make_tracker(transport=t0, rank=0)
    rank1 = make_tracker(transport=t1, rank=1)
    assert rank0.finish("finished")
    assert rank1.finish("finished")
    assert [e["reason"] for e in t0.of_kind("attempt_end")] == ["completed"]
    assert [e["status"] for e in t0.of_kind("run_end")] == ["finished"]
    assert "rank" not in t0.of_kind("run_end")[0]
    assert [e["reason"] for e in t1.of_kind("attempt_end")] == ["completed"]
    assert t1.of_kind("run_end") == []


def test_attempt_end_is_emitted_once(make_tracker: Any) -> None:
    transport = InMemoryTransport()
    tracker = make_tracker(transport=transport)
    assert tracker.end_attempt("preempted", detail="SIGTERM")
    assert not tracker.end_attempt("failed")
    tracker.finish()
    assert [(e["reason"], e.get("detail")) for e in transport.of_kind("attempt_end")] == [("preempted", "SIGTERM")]


def test_offline_mode_spools_and_sends_nothing(make_tracker: Any, tmp_path: Path) -> None:
    transport = InMemoryTransport()
    tracker = make_tracker(transport=transport, mode="offline")
    tracker.record_step(1, time.time(), time.time())
    assert tracker.flush(5.0)
    assert transport.batches == []
    kinds = [r["kind"] for r in spooled_records(tmp_path / "spool")]
    assert kinds == ["attempt_start", "steps"]
    tracker.shutdown(1.0)
    assert list((tmp_path / "spool").rglob("*.spool")), "offline data stays on disk for `goodput sync`"


def test_disabled_mode_records_nothing_and_starts_no_thread(make_tracker: Any, tmp_path: Path) -> None:
    import threading

    before = {t.name for t in threading.enumerate()}
    tracker = make_tracker(mode="disabled")
    with tracker.step(1) as s:
        s.loss = 1.0
    with tracker.checkpoint(1), tracker.collective("x"):
        pass
    tracker.record_step(2, 0.0, 1.0)
    assert not tracker.enabled
    assert tracker.flush(1.0) is False
    assert tracker.stats() is None
    assert not (tmp_path / "spool").exists()
    assert [t.name for t in threading.enumerate() if t.name not in before].count("goodput-flusher") == 0


def test_bounded_spool_drops_oldest_and_the_count_reaches_the_collector(make_tracker: Any, tmp_path: Path) -> None:
    from ingest_client.transport import SendResult, SendStatus

    class Switchable(InMemoryTransport):
        down = True

        def send(self, events: Any, /, *, timeout_s: float | None = None) -> SendResult:
            if self.down:
                return SendResult(status=SendStatus.RETRY, message="down")
            return super().send(events, timeout_s=timeout_s)

    transport = Switchable()
    tracker = make_tracker(transport=transport, spool_max_bytes=64 * 1024, flush_interval_s=0.01)
    now = time.time()
    for batch in range(40):  # ~40 x 200 steps with losses: far more than 64 KiB
        for i in range(200):
            step = batch * 200 + i + 1
            tracker.record_step(step, now, now, loss=float(step), lr=0.001)
        tracker.flush(0.2)
    on_disk = sum(p.stat().st_size for p in (tmp_path / "spool").rglob("*.spool"))
    assert on_disk <= 64 * 1024
    dropped = tracker.stats().spool_dropped_events
    assert dropped > 0
    transport.down = False
    assert tracker.flush(5.0)
    tracker.shutdown(5.0)
    final = transport.of_kind("client_stats")[-1]
    assert final["spool_dropped_events"] == dropped
    assert final["send_failures"] == tracker.stats().send_failures > 0
    delivered = sorted(s for e in transport.of_kind("steps") for s in e["step"])
    assert delivered[-1] == 8000 and len(delivered) < 8000  # the newest survive, the oldest were dropped


def test_steps_carry_the_seconds_their_collectives_took_even_across_flushes(make_tracker: Any) -> None:
    transport = InMemoryTransport()
    tracker = make_tracker(transport=transport)
    tracker.resumed(0)
    now = time.time()
    tracker.record_collective("all_reduce", now, now + 0.25, step=1)
    tracker.record_collective("all_reduce", now + 0.25, now + 0.5, step=1)
    tracker.flush(5.0)  # the collectives go out before the step that contains them
    tracker.record_step(1, now - 1.0, now + 0.6)
    tracker.record_step(2, now + 0.6, now + 1.0)  # no collective in step 2
    tracker.flush(5.0)
    comm = [c for r in transport.of_kind("steps") for c in r["comm"]]
    assert comm == pytest.approx([0.5, 0.0])


def test_without_any_collective_timing_steps_carry_no_comm(make_tracker: Any) -> None:
    transport = InMemoryTransport()
    tracker = make_tracker(transport=transport)
    tracker.record_step(1, time.time() - 0.1, time.time())
    tracker.flush(5.0)
    assert "comm" not in transport.of_kind("steps")[0]


def test_finish_without_a_status_ends_the_run_unless_the_launcher_does(make_tracker: Any,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    plain, launched, other_rank = InMemoryTransport(), InMemoryTransport(), InMemoryTransport()
    assert make_tracker(transport=plain, rank=0, run_id="plain").finish()
    assert make_tracker(transport=other_rank, rank=1, run_id="plain").finish()
    monkeypatch.setenv("GOODPUT_LAUNCHED", "1")
    assert make_tracker(transport=launched, rank=0, run_id="launched").finish()
    assert [e["status"] for e in plain.of_kind("run_end")] == ["finished"]
    assert other_rank.of_kind("run_end") == [] and launched.of_kind("run_end") == []
    assert [e["reason"] for e in launched.of_kind("attempt_end")] == ["completed"]


def test_resumed_names_the_checkpoint_it_loaded(make_tracker: Any) -> None:
    transport = InMemoryTransport()
    tracker = make_tracker(transport=transport)
    tracker.resumed(250, checkpoint="/ckpt/step-250")
    tracker.resumed(0, checkpoint_step=250, checkpoint="x" * 300)  # a lost step counter, a long path
    tracker.resumed(0)
    tracker.resumed(7, checkpoint_step=-1)  # invalid: dropped, the resume itself still counts
    assert tracker.flush(5.0)
    got = [(e["step"], e.get("checkpoint_step"), e.get("checkpoint")) for e in transport.of_kind("resume")]
    assert got == [(250, 250, "/ckpt/step-250"), (0, 250, "x" * 256), (0, None, None), (7, None, None)]
    assert all(validate_event(e) is None for e in transport.events)


def test_resumed_carries_the_digest_of_the_state_it_loaded_and_drops_an_invalid_one(make_tracker: Any) -> None:
    transport = InMemoryTransport()
    tracker = make_tracker(transport=transport)
    tracker.resumed(250, checkpoint="/ckpt/step-250", digest="0123abcd" * 4)
    tracker.resumed(250, digest="x" * 129)  # too long: dropped, the resume itself still counts
    tracker.resumed(250, digest=b"bytes")  # not a str: dropped
    assert tracker.flush(5.0)
    assert [e.get("digest") for e in transport.of_kind("resume")] == ["0123abcd" * 4, None, None]
    assert all(validate_event(e) is None for e in transport.events)


def test_state_defining_events_are_in_the_spool_when_the_call_returns(make_tracker: Any, tmp_path: Path) -> None:
    tracker = make_tracker(mode="offline", flush_interval_s=10.0)  # the flusher sleeps through the test
    tracker.resumed(0)
    for step in range(1, 4):
        tracker.record_step(step, time.time() - 0.01, time.time())
    with tracker.checkpoint(3):
        assert sorted(r["kind"] for r in spooled_records(tmp_path / "spool")) == [
            "attempt_start", "checkpoint_start", "resume", "steps"]
    tracker.record_step(4, time.time() - 0.01, time.time())
    spooled = spooled_records(tmp_path / "spool")
    assert [r["kind"] for r in spooled][-1] == "checkpoint_end" and spooled[-1]["ok"] is True
    assert [r["kind"] for r in spooled].count("steps") == 1, "step 4 waits for the flusher"
    assert tracker.end_attempt("failed")
    assert sorted(r["kind"] for r in spooled_records(tmp_path / "spool"))[-3:] == ["resume", "steps", "steps"]
    assert "attempt_end" in [r["kind"] for r in spooled_records(tmp_path / "spool")]


def test_durable_writes_from_many_threads_and_the_flusher_keep_every_record_once(make_tracker: Any) -> None:
    transport = InMemoryTransport()
    tracker = make_tracker(transport=transport, flush_interval_s=0.01)
    per_thread = 200

    def writer(offset: int) -> None:
        for i in range(per_thread):
            with tracker.checkpoint(offset + i):
                tracker.record_step(offset + i, time.time() - 0.001, time.time())

    threads = [threading.Thread(target=writer, args=(k * 1000,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert tracker.flush(10.0)
    ids = [e["event_id"] for e in transport.events]
    assert len(ids) == len(set(ids))
    ends = sorted(e["step"] for e in transport.of_kind("checkpoint_end"))
    assert ends == sorted(k * 1000 + i for k in range(4) for i in range(per_thread))
    steps = sorted(s for e in transport.of_kind("steps") for s in e["step"])
    assert steps == ends
    assert tracker.stats().dropped_events == 0


def test_a_process_killed_right_after_a_checkpoint_keeps_its_checkpoint_end(tmp_path: Path) -> None:
    code = textwrap.dedent("""
        import os, time, ingest_client as goodput
        tracker = goodput.init()   # default flush interval
        tracker.resumed(0)
        for step in range(1, 251):
            with tracker.step(step) as s:
                s.loss = 1.0 / step
        with tracker.checkpoint(250):
            time.sleep(0.01)
        os._exit(137)
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOODPUT_")}
    env.update(GOODPUT_SPOOL_DIR=str(tmp_path / "spool"), GOODPUT_RUN_ID="killed", GOODPUT_MODE="offline",
               PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    done = subprocess.run([sys.executable, "-c", code], env=env, timeout=60)
    assert done.returncode == 137
    records = spooled_records(tmp_path / "spool")
    (end,) = [r for r in records if r["kind"] == "checkpoint_end"]
    assert end["step"] == 250 and end["ok"] is True
    steps = sorted(s for r in records if r["kind"] == "steps" for s in r["step"])
    assert steps == list(range(1, 251)), "the steps before a checkpoint are written with it"


def test_a_durable_write_interrupted_by_another_on_the_same_thread_goes_through_the_buffer(make_tracker: Any) -> None:
    """A SIGTERM handler (end_attempt) may interrupt tracker.checkpoint on the main thread while it holds the spool
    lock: the inner write must neither deadlock nor interleave with the outer one."""
    transport = InMemoryTransport()
    tracker = make_tracker(transport=transport)
    pipeline = tracker._pipeline
    real_build = pipeline.builder.build
    interrupted: list[bool] = []

    def build_interrupted_once(rows: Any) -> Any:
        if not interrupted:
            interrupted.append(tracker.end_attempt("failed", detail="SIGTERM"))
        return real_build(rows)

    pipeline.builder.build = build_interrupted_once
    with tracker.checkpoint(5):
        pass
    pipeline.builder.build = real_build
    assert interrupted == [True]
    assert tracker.flush(5.0)
    assert [e["reason"] for e in transport.of_kind("attempt_end")] == ["failed"]
    assert [e["step"] for e in transport.of_kind("checkpoint_end")] == [5]
