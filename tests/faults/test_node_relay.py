"""`goodput launch`'s node relay (the default): the node's ranks send through the launcher
(ingest_client/launcher/relay.py).

Real processes: a `goodput serve` on PostgreSQL, a real launcher, four real client ranks under it. The collector
sees one sender and a fraction of the requests, every step arrives exactly once, one rank's refused event does not
hold back the others, a launcher SIGKILLed while the collector is down loses nothing (the relay keeps nothing: the
ranks' spools hold it, for `goodput sync`), and ranks that outlive their launcher go on sending, straight to the
collector."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from ingest_client.common.config import ClientConfig
from ingest_client.launcher.relay import NodeRelay
from tests.faults.conftest import WORKER, Collector, stored_steps, sync_spool
from tests.ingest_client.conftest import spooled_records
from tests.test_cli import GOODPUT, env_with

pytestmark = pytest.mark.postgres

RANKS = 4
STEPS = 80
PERIOD_S = 0.05


def _ingest_requests(url: str) -> int:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return sum(int(float(v)) for v in re.findall(
        r'^goodput_collector_request_duration_seconds_count\{[^}]*handler="/v1/events"[^}]*method="POST"[^}]*\} '
        r'(\S+)$', text, re.M))


def _launch(url: str, spool: Path, run_id: str, *, steps: int = STEPS) -> subprocess.Popen[str]:
    """A launcher (the node relay is on by default), running RANKS client ranks as torchrun would (one process
    each)."""
    ranks = " ".join(
        f"RANK={r} LOCAL_RANK={r} WORLD_SIZE={RANKS} {sys.executable} {WORKER} {steps} {PERIOD_S} 60 &"
        for r in range(RANKS))
    return subprocess.Popen(
        [*GOODPUT, "launch", "--run-id", run_id, "--timeout", "30", "--", "bash", "-c",
         f"{ranks} wait"],
        env=env_with(GOODPUT_URL=url, GOODPUT_SPOOL_DIR=str(spool), TORCHELASTIC_RESTART_COUNT="0",
                     GOODPUT_FLUSH_INTERVAL_S="0.05"),
        text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _worker_results(out: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_ranks_send_through_the_launcher_as_one_sender(collector: Collector, tmp_path: Path) -> None:
    collector.start()
    launcher = _launch(collector.url, tmp_path / "spool", "relayed")
    out, err = launcher.communicate(timeout=300)
    assert launcher.returncode == 0, err[-3000:]
    results = _worker_results(out)
    assert len(results) == RANKS and all(r["acknowledged"] for r in results), out
    assert stored_steps(collector.db_url, "relayed") == {rank: list(range(1, STEPS + 1)) for rank in range(RANKS)}
    # each rank alone would post every 0.05 s (~80 requests each, ~320 in all); the relay sends the node's
    # records together at most every 0.5 s (plus the launcher's own run events and the final flushes)
    requests = _ingest_requests(collector.url)
    assert requests < 30, f"{requests} ingest requests: the ranks' records were not sent together"
    print(f"{requests} ingest requests for {RANKS} ranks x {STEPS} steps through the relay")


def test_one_ranks_refused_event_does_not_hold_back_the_others(collector: Collector, tmp_path: Path) -> None:
    collector.start()
    config = ClientConfig.from_env({"GOODPUT_URL": collector.url, "GOODPUT_SPOOL_DIR": str(tmp_path / "spool")},
                                   install_handlers=False)
    relay = NodeRelay(config, "mixed").start()
    try:
        now = time.time()
        good = [{"event_id": f"good-{r}", "run_id": "mixed", "kind": "steps", "time": now, "attempt": 0, "rank": r,
                 "step": [1, 2], "start": [now - 2, now - 1], "end": [now - 1.5, now - 0.5]} for r in range(3)]
        bad = {"event_id": "bad-3", "run_id": "mixed", "kind": "steps", "time": now, "attempt": 0, "rank": 3,
               "step": [1], "start": [now - 1], "end": [now - 2]}  # ends before it starts: 422
        with ThreadPoolExecutor(4) as pool:  # four ranks' posts at once: forwarded together
            answers = list(pool.map(lambda event: httpx.post(f"{relay.url}/v1/events", json={"events": [event]},
                                                             timeout=10), [*good[:2], bad, good[2]]))
    finally:
        relay.close(10.0)
    # the bad rank alone is told: its client quarantines its event, as it would facing the collector
    assert [a.status_code for a in answers] == [200, 200, 422, 200], [a.text for a in answers]
    assert answers[2].json()["error"]["message"].startswith("the collector: "), answers[2].text
    assert stored_steps(collector.db_url, "mixed") == {0: [1, 2], 1: [1, 2], 2: [1, 2]}
    assert relay.received_events == 4 and relay.forwarded_events == 3
    assert not (tmp_path / "spool").exists()  # the relay writes nothing to disk


def _ranks_spooled_steps(spool: Path) -> bool:
    return any(record["kind"] == "steps" for record in spooled_records(spool)) if spool.exists() else False


def test_a_killed_launcher_loses_nothing_while_the_collector_is_down(collector: Collector, tmp_path: Path) -> None:
    # the collector is down while the ranks run: the relay acknowledges nothing, the ranks keep their records
    launcher = _launch(collector.url, tmp_path / "spool", "relay-killed", steps=40)
    deadline = time.monotonic() + 120
    while not _ranks_spooled_steps(tmp_path / "spool") and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(3.0)  # the ranks keep posting their steps to the relay, which cannot forward them
    launcher.send_signal(signal.SIGKILL)
    launcher.wait(30)
    subprocess.run(["pkill", "-f", f"{WORKER} 40 "], check=False)  # its ranks, orphaned by the kill
    spooled: dict[int, set[int]] = {}  # what the ranks' spools hold, before anything is sent
    for record in spooled_records(tmp_path / "spool"):
        if record["kind"] == "steps":
            spooled.setdefault(record["rank"], set()).update(record["step"])
    relay_files = [p for p in (tmp_path / "spool").rglob("relay*") if p.is_file()]
    assert spooled and not relay_files, "the relay keeps nothing on disk"
    collector.start()
    sync_spool(collector.url, tmp_path / "spool")
    stored = stored_steps(collector.db_url, "relay-killed")
    assert stored == {rank: sorted(steps) for rank, steps in spooled.items()}  # all of it, each step once
    assert all(steps == list(range(1, len(steps) + 1)) for steps in stored.values())


def test_ranks_that_outlive_their_launcher_send_to_the_collector_directly(collector: Collector,
                                                                          tmp_path: Path) -> None:
    collector.start()
    steps = 160  # 8 s of stepping: the launcher dies early in it
    launcher = _launch(collector.url, tmp_path / "spool", "relay-gone", steps=steps)
    deadline = time.monotonic() + 120
    while not stored_steps(collector.db_url, "relay-gone") and time.monotonic() < deadline:
        time.sleep(0.1)  # the relay forwards the ranks' steps
    time.sleep(1.0)
    launcher.send_signal(signal.SIGKILL)  # its ranks are orphaned and train on
    out, err = launcher.communicate(timeout=300)  # the pipe closes when the last rank exits
    results = _worker_results(out)
    assert len(results) == RANKS and all(r["acknowledged"] for r in results), (out, err[-3000:])
    live = stored_steps(collector.db_url, "relay-gone")  # before any sync: what the ranks sent themselves
    assert sorted(live) == list(range(RANKS)) and all(steps in s for s in live.values()), live
    sync_spool(collector.url, tmp_path / "spool")  # what the ranks had posted when the relay was killed
    stored = stored_steps(collector.db_url, "relay-gone")
    assert stored == {rank: list(range(1, steps + 1)) for rank in range(RANKS)}  # every step, once
