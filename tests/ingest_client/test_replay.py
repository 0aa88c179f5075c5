from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ingest_client.tools.sync import sync_directory, sync_main
from ingest_client.transport import InMemoryTransport
from ingest_client.worker.tracker import Tracker
from tests.ingest_client.fake_collector import FakeCollector, Reply, closed_port_url


def _record_while_collector_is_down(make_tracker: Any, steps: range) -> str:
    tracker: Tracker = make_tracker(url=closed_port_url())
    for step in steps:
        tracker.record_step(step, time.time(), time.time())
    tracker.shutdown(0.5)  # nothing acknowledged: all of it stays in the spool
    return tracker.proc_id


def test_next_tracker_of_the_run_replays_what_was_never_acknowledged(
    make_tracker: Any, collector: FakeCollector, tmp_path: Path
) -> None:
    old_proc = _record_while_collector_is_down(make_tracker, range(1, 51))
    tracker = make_tracker(url=collector.url)  # same run, spool dir: the restarted worker
    tracker.record_step(51, time.time(), time.time())
    assert tracker.flush(5.0)
    assert collector.step_numbers() == list(range(1, 52))
    replayed = [e for e in collector.events if e["event_id"].startswith(old_proc)]
    assert {e["kind"] for e in replayed} >= {"attempt_start", "steps", "client_stats"}
    assert tracker.stats().replayed_events == len(replayed)
    tracker.shutdown(2.0)
    assert not list((tmp_path / "spool").rglob("*.spool")), "everything acknowledged: spool is empty"

    third = make_tracker(url=collector.url)
    assert third.flush(5.0)
    assert collector.duplicates == 0, "nothing is replayed twice after an ack"
    assert third.stats().replayed_events == 0


def test_replay_only_touches_the_same_run(make_tracker: Any, collector: FakeCollector) -> None:
    tracker = make_tracker(url=closed_port_url(), run_id="other-run")
    tracker.record_step(1, time.time(), time.time())
    tracker.shutdown(0.5)
    fresh = make_tracker(url=collector.url, run_id="run-test")
    assert fresh.flush(5.0)
    assert {e["run_id"] for e in collector.events} == {"run-test"}


def test_sync_directory_sends_offline_spools_once(make_tracker: Any, collector: FakeCollector, tmp_path: Path) -> None:
    for rank in range(2):
        tracker = make_tracker(mode="offline", rank=rank)
        for step in range(1, 21):
            tracker.record_step(step, time.time(), time.time())
        tracker.finish()
    live = make_tracker(mode="offline", run_id="still-running")  # a live process: skipped
    live.flush(1.0)

    result = sync_directory(tmp_path / "spool", collector.url)
    # per rank: attempt_start, steps, attempt_end, client_stats; rank 0 also run_end (finish() without the launcher)
    assert result.sent == 2 * 4 + 1
    assert (result.failed, result.rejected, result.live_processes) == (0, 0, 1)
    assert sorted(e["rank"] for e in collector.of_kind("steps")) == [0, 1]
    assert all(e["step"] == list(range(1, 21)) for e in collector.of_kind("steps"))

    again = sync_directory(tmp_path / "spool", collector.url)
    assert again.sent == 0 and collector.duplicates == 0


def test_sync_counts_records_acknowledged_before_a_crash(make_tracker: Any, tmp_path: Path) -> None:
    transport = InMemoryTransport()
    tracker = make_tracker(transport=transport)
    tracker.record_step(1, time.time(), time.time())
    assert tracker.flush(5.0)  # attempt_start + steps acknowledged
    tracker._pipeline.transport = None  # the collector "disappears"; later records stay unsent
    tracker.record_step(2, time.time(), time.time())
    tracker.flush(5.0)
    tracker._pipeline._stop.set()  # stop without deleting files, like a process that died
    tracker._pipeline.buffer.wake.set()
    tracker._pipeline._thread.join(2)

    later = InMemoryTransport()
    result = sync_directory(tmp_path / "spool", transport=later)
    assert result.already_acknowledged == 2
    assert result.sent == 1 and later.of_kind("steps")[0]["step"] == [2]


def test_sync_main_prints_counts_and_fails_while_the_collector_is_down(
    make_tracker: Any, collector: FakeCollector, tmp_path: Path, capsys: Any
) -> None:
    tracker = make_tracker(mode="offline")
    tracker.record_step(1, time.time(), time.time())
    tracker.shutdown(1.0)
    spool = str(tmp_path / "spool")
    assert sync_main([spool, "--url", closed_port_url(), "--timeout", "0.2", "--attempts", "2"]) == 1
    assert capsys.readouterr().out.startswith("sent 0 records, 0 already acknowledged, 3 failed")
    assert sync_main([spool, "--url", collector.url]) == 0
    out = capsys.readouterr().out
    assert out.startswith("sent 3 records, 0 already acknowledged, 0 failed, 0 rejected")
    assert collector.step_numbers() == [1]
    assert sync_main([spool]) == 2  # no URL


def _refused_with_a_wrong_token(make_tracker: Any, collector: FakeCollector, steps: range) -> None:
    tracker = make_tracker(url=collector.url, token="revoked", flush_interval_s=0.02)
    for step in steps:
        tracker.record_step(step, time.time(), time.time())
        tracker.flush(0.2)
    tracker.finish()
    tracker.shutdown(0.5)


def test_goodput_sync_delivers_what_a_revoked_token_left_once_the_token_is_fixed_and_only_once(
    make_tracker: Any, tmp_path: Path, capsys: Any
) -> None:
    collector = FakeCollector(token="right")
    try:
        _refused_with_a_wrong_token(make_tracker, collector, range(1, 31))
        spool = str(tmp_path / "spool")
        assert list((tmp_path / "spool").rglob("*.quarantine")), "the refused batch is kept aside"
        assert collector.events == []

        assert sync_main([spool, "--url", collector.url, "--token", "still-wrong"]) == 1
        out = capsys.readouterr().out
        assert "not sent:" in out and "(HTTP 401)" in out and "GOODPUT_TOKEN" in out, out
        assert collector.events == [] and list((tmp_path / "spool").rglob("*.quarantine")), "nothing lost"
        assert sum(1 for r in collector.requests if r["auth"] == "Bearer still-wrong") == 1, "a 401 stops the sync"

        assert sync_main([spool, "--url", collector.url, "--token", "right"]) == 0
        out = capsys.readouterr().out
        assert "came from the quarantine" in out and "not sent" not in out, out
        assert collector.step_numbers() == list(range(1, 31)) and collector.duplicates == 0
        assert {"attempt_start", "attempt_end", "run_end"} <= {e["kind"] for e in collector.events}
        assert not [p for p in (tmp_path / "spool").rglob("*") if p.is_file()], "all delivered: nothing left"

        assert sync_main([spool, "--url", collector.url, "--token", "right"]) == 0
        assert capsys.readouterr().out.startswith("sent 0 records")
        assert collector.duplicates == 0
    finally:
        collector.stop()


def test_sync_keeps_a_batch_the_collector_still_refuses_and_reports_it_by_reason(
    make_tracker: Any, collector: FakeCollector, tmp_path: Path, capsys: Any
) -> None:
    invalid = Reply(422, {"error": {"code": "invalid_event", "message": "unknown field"}})
    # the batch (attempt_start, steps), then each record alone: the client halves a refused batch
    collector.script = [invalid] * 3
    tracker = make_tracker(url=collector.url, flush_interval_s=0.02)
    tracker.record_step(1, time.time(), time.time())
    tracker.flush(2.0)
    tracker.shutdown(1.0)
    kept = sorted((tmp_path / "spool").rglob("*.quarantine"))
    assert len(kept) == 2
    collector.script = [invalid] * 2  # the collector is not upgraded yet
    assert sync_main([str(tmp_path / "spool"), "--url", collector.url]) == 1
    out = capsys.readouterr().out
    assert "not sent: 2 records (HTTP 422)" in out and "upgrade" in out, out
    for path in kept:
        assert path.exists() and json.loads(Path(f"{path}.json").read_text())["message"].startswith("unknown field")
    assert sync_main([str(tmp_path / "spool"), "--url", collector.url]) == 0  # now it takes them
    assert collector.step_numbers() == [1] and not any(path.exists() for path in kept)


def test_the_next_process_of_the_run_resends_the_quarantine_once_and_stops_at_the_first_refusal(
    make_tracker: Any, tmp_path: Path
) -> None:
    collector = FakeCollector(token="right")
    try:
        _refused_with_a_wrong_token(make_tracker, collector, range(1, 11))
        first_requests = len(collector.requests)

        still_wrong = make_tracker(url=collector.url, token="revoked", flush_interval_s=0.02)
        still_wrong.flush(2.0)
        time.sleep(0.3)
        # one try of the dead process's spool (refused and quarantined too), then it pauses: no storm
        assert len(collector.requests) - first_requests == 1
        still_wrong.shutdown(0.5)

        fixed = make_tracker(url=collector.url, token="right", flush_interval_s=0.02)
        assert collector.wait_for(lambda c: c.step_numbers() == list(range(1, 11)), timeout_s=10)
        assert fixed.flush(5.0)
        assert not list((tmp_path / "spool").rglob("*.quarantine")), "accepted: the quarantine is emptied"
        assert collector.duplicates == 0
        assert fixed.stats().replayed_events > 0
    finally:
        collector.stop()
