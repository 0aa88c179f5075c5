"""The node relay forwards its ranks' posts together and answers each with the collector's verdict; it keeps nothing
(ingest_client/launcher/relay.py; real processes and PostgreSQL: tests/faults/test_node_relay.py)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ingest_client.common.config import ClientConfig
from ingest_client.launcher.relay import NodeRelay
from tests.ingest_client.fake_collector import FakeCollector, closed_port_url


def _relay(url: str, spool: Path) -> NodeRelay:
    config = ClientConfig.from_env({"GOODPUT_URL": url, "GOODPUT_SPOOL_DIR": str(spool)}, install_handlers=False)
    return NodeRelay(config, "relayed").start()


def _steps(rank: int) -> dict[str, object]:
    now = time.time()
    return {"event_id": f"steps-{rank}", "run_id": "relayed", "kind": "steps", "time": now, "attempt": 0,
            "rank": rank, "step": [1], "start": [now - 1], "end": [now - 0.5]}


def _post(relay: NodeRelay, event: dict[str, object]) -> tuple[int, dict[str, str], dict[str, object]]:
    body = json.dumps({"schema_version": 1, "events": [event]}).encode()
    request = urllib.request.Request(f"{relay.url}/v1/events", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, dict(answer.headers), json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), json.loads(error.read())


def test_posts_that_arrive_together_reach_the_collector_as_one_request(tmp_path: Path) -> None:
    collector = FakeCollector()
    relay = _relay(collector.url, tmp_path / "spool")
    try:
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda rank: _post(relay, _steps(rank)), range(4)))
    finally:
        relay.close(5.0)
        collector.stop()
    assert [(status, body) for status, _, body in answers] == [(200, {"accepted": 1, "duplicates": 0})] * 4
    # each rank is asked to post next at the relay's next send, with the others
    assert all(0 < float(headers["Goodput-Send-Interval"]) <= 0.5 for _, headers, _ in answers)
    assert [r["n"] for r in collector.requests] == [4]
    assert sorted(e["rank"] for e in collector.events) == [0, 1, 2, 3]
    assert relay.received_events == relay.forwarded_events == 4


def test_a_collector_that_is_down_gets_each_rank_a_503_and_the_relay_keeps_nothing(tmp_path: Path) -> None:
    relay = _relay(closed_port_url(), tmp_path / "spool")
    try:
        status, headers, body = _post(relay, _steps(0))
    finally:
        relay.close(5.0)
    # the rank keeps its record in its own spool and sends it again after Retry-After
    assert status == 503 and headers["Retry-After"] == "1"
    assert "cannot reach the collector" in str(body)
    assert relay.received_events == 1 and relay.forwarded_events == 0
    assert not (tmp_path / "spool").exists()
