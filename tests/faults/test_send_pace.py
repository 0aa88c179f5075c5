"""The collector's pace (Goodput-Send-Interval, services/collector/pace.py) reaches real clients: with more senders
than the collector's target rate, ranks send fewer, fuller requests, and every step still arrives exactly once."""

from __future__ import annotations

import re
import time

import httpx
import pytest

from services.collector.pace import SendPace
from tests.faults.conftest import Collector, start_ranks, stored_steps, wait_ranks

pytestmark = pytest.mark.postgres

RANKS = 4
STEPS = 80
PERIOD_S = 0.05  # 4 s of training per rank; the client's own flush interval is 0.05 s (start_ranks)


def _ingest_requests(url: str) -> int:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return sum(int(float(v)) for v in re.findall(
        r'^goodput_collector_request_duration_seconds_count\{[^}]*handler="/v1/events"[^}]*method="POST"[^}]*\} '
        r'(\S+)$', text, re.M))


def test_ranks_follow_the_collectors_pace_and_lose_nothing(collector: Collector, tmp_path) -> None:
    # 4 senders against a target of 2 requests/s asks for 2 s between posts, capped at 1 s
    collector.extra_env.update(GOODPUT_TARGET_REQUESTS_PER_S="2", GOODPUT_MAX_SEND_INTERVAL_S="1")
    collector.start()
    procs = start_ranks(collector.url, tmp_path / "spool", "paced", ranks=RANKS, steps=STEPS, period_s=PERIOD_S,
                        flush_s=60)
    results = wait_ranks(procs)
    assert all(r["acknowledged"] for r in results)
    assert stored_steps(collector.db_url, "paced") == {rank: list(range(1, STEPS + 1)) for rank in range(RANKS)}

    # unpaced, each rank would post every 0.05 s: ~80 requests each over its 4 s. Paced at 1 s: a handful each
    # (one per second, plus the durable events and the final flushes, which are never held back)
    requests = _ingest_requests(collector.url)
    assert requests < RANKS * 20, f"{requests} ingest requests: the ranks did not follow the pace"
    print(f"{requests} ingest requests for {RANKS} ranks x {STEPS} steps")

    probe = {"event_id": "probe-1", "run_id": "paced", "kind": "heartbeat", "time": time.time(), "attempt": 0,
             "rank": 0}
    answer = httpx.post(f"{collector.url}/v1/events", json={"events": [probe]}, headers={"Goodput-Sender": "probe"})
    assert answer.status_code == 200, answer.text
    assert float(answer.headers["Goodput-Send-Interval"]) == 1.0  # the cap: 5 senders / 2 per s = 2.5 s


def test_the_pace_is_senders_over_the_target_within_the_window() -> None:
    pace = SendPace(target_requests_per_s=100, max_interval_s=5)
    for i in range(300):
        pace.seen(f"rank-{i}", now=1000.0 + i * 0.01)
    pace.seen("rank-0", now=1004.0)
    assert pace.senders == 300 and pace.interval_s == 3.0 and pace.header_value == "3.00"
    assert pace.retry_after_s == 3  # a sender refused for load comes back in its turn
    for i in range(1000):
        pace.seen(f"other-{i}", now=1005.0)
    pace.seen("other-0", now=1006.0)
    assert pace.senders == 1300 and pace.interval_s == 5.0  # capped
    pace.seen("late", now=1020.0)  # everyone else is older than the 10 s window
    assert pace.senders == 1 and pace.interval_s == 0.01
    assert pace.retry_after_s == 1  # whole seconds (Retry-After's unit), never 0
    for i in range(251):
        pace.seen(f"third-{i}", now=1020.5)
    pace.seen("third-0", now=1021.0)  # counted once a second
    assert pace.senders == 252 and pace.interval_s == 2.52 and pace.retry_after_s == 3  # rounded up
