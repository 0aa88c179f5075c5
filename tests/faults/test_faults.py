"""Faults while real client ranks stream steps into a real collector on PostgreSQL: at the end, the steps the
ranks recorded, the steps the collector acknowledged and the rows the database holds are the same, once each.

- the collector SIGKILLed mid-stream and restarted;
- PostgreSQL restarted mid-stream (the collector answers 503 meanwhile, never 500);
- the spool's disk full (a 1 MiB tmpfs) while the collector is down: what could not be kept is counted and
  reported to the collector, the rest arrives once;
- a slow collector (a proxy delaying every answer, some past the client's timeout): training is not slowed.
"""

from __future__ import annotations

import http.client
import http.server
import random
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.faults.conftest import (
    Collector,
    client_stats_at_collector,
    ledger_steps,
    restart_postgres,
    start_ranks,
    stored_steps,
    sync_spool,
    wait_ranks,
)

pytestmark = pytest.mark.postgres


def _assert_exactly_once(results: list[dict[str, Any]], stored: dict[int, list[int]], steps: int) -> None:
    sent = sum(r["steps"] for r in results)
    acknowledged = sum(r["steps"] for r in results if r["acknowledged"] and not r["stats"]["rejected_events"])
    rows = sum(len(v) for v in stored.values())
    assert (sent, acknowledged, rows) == (sent, sent, sent), f"sent {sent}, acknowledged {acknowledged}, stored {rows}"
    for rank in range(len(results)):
        assert stored.get(rank) == list(range(1, steps + 1)), f"rank {rank}: missing or duplicated steps"


def test_collector_sigkilled_mid_stream_loses_and_duplicates_nothing(collector: Collector, tmp_path: Path) -> None:
    ranks, steps = 4, 400
    collector.start()
    procs = start_ranks(collector.url, tmp_path / "spool", "fault-kill", ranks=ranks, steps=steps, period_s=0.01)
    time.sleep(2.0)
    collector.kill()  # mid-stream: some batches are committed but never answered
    time.sleep(1.5)
    collector.start()
    time.sleep(1.0)
    collector.kill()  # and once more, right after it came back
    collector.start()
    results = wait_ranks(procs)
    stored = stored_steps(collector.db_url, "fault-kill")
    _assert_exactly_once(results, stored, steps)
    assert any(r["stats"]["send_failures"] for r in results), "the kills were noticed and retried"
    assert ledger_steps(collector.url, "fault-kill")["computed"] == steps  # distinct steps of the job


def test_ranks_starting_together_on_one_spool_folder_all_start(collector: Collector, tmp_path: Path) -> None:
    """Found by the fault tests: a rank scanning the run's spool folder for orphans could lock a neighbour's
    brand-new lock file before its owner did, and that owner's init() failed (or its spool was replayed)."""
    collector.start()
    procs = start_ranks(collector.url, tmp_path / "spool", "fault-start", ranks=16, steps=20, period_s=0.0)
    results = wait_ranks(procs)
    _assert_exactly_once(results, stored_steps(collector.db_url, "fault-start"), 20)


def test_postgres_restarted_mid_stream_gives_503_then_everything_once(collector: Collector, tmp_path: Path) -> None:
    ranks, steps = 4, 500
    collector.start()
    statuses: list[int] = []
    stop = threading.Event()

    def probe() -> None:  # a tiny batch every 50 ms: what does the collector answer during the restart?
        i = 0
        while not stop.is_set():
            i += 1
            event = {"event_id": f"probe-{i}", "run_id": "fault-probe", "kind": "heartbeat", "time": time.time(),
                     "attempt": 0, "rank": 0}
            try:
                statuses.append(httpx.post(f"{collector.url}/v1/events", json={"events": [event]}, timeout=10)
                                .status_code)
            except httpx.HTTPError:
                statuses.append(0)
            time.sleep(0.05)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    procs = start_ranks(collector.url, tmp_path / "spool", "fault-pg", ranks=ranks, steps=steps, period_s=0.01)
    time.sleep(2.0)
    down_s = restart_postgres()
    results = wait_ranks(procs)
    stop.set()
    prober.join(15)
    stored = stored_steps(collector.db_url, "fault-pg")
    _assert_exactly_once(results, stored, steps)
    assert 500 not in statuses, f"a 500 during the restart ({down_s:.1f} s): {sorted(set(statuses))}"
    assert 503 in statuses, f"the restart ({down_s:.1f} s) was not seen as 503: {sorted(set(statuses))}"
    assert statuses[-1] == 200


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Any:
    spool = tmp_path / "spool"
    spool.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(spool)], capture_output=True,
                             check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    yield spool
    subprocess.run(["umount", "-l", str(spool)], check=False)


def test_spool_disk_full_drops_are_counted_and_the_rest_arrives_once(collector: Collector, tiny_disk: Path) -> None:
    ranks, steps = 2, 20_000  # about 1.2 MB of spool per rank; the disk holds 1 MiB
    procs = start_ranks(collector.url, tiny_disk, "fault-disk", ranks=ranks, steps=steps, period_s=0.0002,
                        flush_s=30.0, GOODPUT_HTTP_TIMEOUT_S="0.5")
    time.sleep(5.0)  # the collector is down: everything goes to the spool, until the disk is full
    collector.start()
    results = wait_ranks(procs)
    # what is still in the spool (the flush timed out while the collector came up) is replayed by sync
    sync_spool(collector.url, tiny_disk)
    stored = stored_steps(collector.db_url, "fault-disk")
    reported = client_stats_at_collector(collector.db_url, "fault-disk")
    for rank, result in enumerate(results):
        s = result["stats"]
        lost = s["dropped_events"] + s["spool_dropped_events"]
        rows = stored.get(rank, [])
        assert len(rows) == len(set(rows)), f"rank {rank}: duplicated steps"
        # every missing step is counted; the count may also hold the few other events lost with them (resume,
        # heartbeats), which are not steps
        missing = steps - len(rows)
        assert missing <= lost <= missing + 5, f"rank {rank}: stored {len(rows)}, counted lost {lost}, of {steps}"
        assert rows == sorted(rows)
        assert lost > 0, "the 1 MiB disk was meant to fill"
        # the collector was told about the losses by the client itself
        at_collector = reported[rank]
        assert at_collector["dropped_events"] + at_collector["spool_dropped_events"] >= lost


class _SlowProxy(http.server.ThreadingHTTPServer):
    """Forwards each request to the collector after 0-3 s; some answers come after the client's 2 s timeout."""

    daemon_threads = True

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.random = random.Random(7)
        self.delays: list[float] = []
        super().__init__(("127.0.0.1", 0), _SlowHandler)


class _SlowHandler(http.server.BaseHTTPRequestHandler):
    server: _SlowProxy

    def log_message(self, *_: Any) -> None:
        pass

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        conn = http.client.HTTPConnection("127.0.0.1", self.server.upstream_port, timeout=60)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
        conn.request(self.command, self.path, body=body, headers=headers)
        response = conn.getresponse()
        payload = response.read()
        delay = self.server.random.uniform(0.0, 3.0)  # after the collector committed: a lost answer
        self.server.delays.append(delay)
        time.sleep(delay)
        try:
            self.send_response(response.status)
            for k, v in response.getheaders():
                if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except OSError:  # the client gave up waiting
            pass

    do_GET = do_POST = _forward


def test_slow_collector_does_not_slow_training_and_everything_arrives(collector: Collector, tmp_path: Path) -> None:
    ranks, steps, period_s = 4, 600, 0.01
    collector.start()
    proxy = _SlowProxy(collector.port)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        procs = start_ranks(f"http://127.0.0.1:{proxy.server_address[1]}", tmp_path / "spool", "fault-slow",
                            ranks=ranks, steps=steps, period_s=period_s)
        results = wait_ranks(procs)
    finally:
        proxy.shutdown()
    stored = stored_steps(collector.db_url, "fault-slow")
    _assert_exactly_once(results, stored, steps)
    assert any(d > 2.0 for d in proxy.delays), "some answers came after the client's timeout"
    for r in results:
        assert r["worst_step_overhead_s"] < 0.05, r  # bookkeeping per step, while the network is slow
        assert r["loop_s"] < steps * period_s * 1.5 + 2.0, r  # the training loop ran at its own pace
