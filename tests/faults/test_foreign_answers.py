"""A wrong GOODPUT_URL loses nothing (issue 31, point 1): a trainer of 300 steps whose URL answers with a web
server's page (200 text/html) or, behind a single-sign-on proxy, with a 302 to a login page, keeps every record in
its spool and says so once on stderr; `goodput sync` to the real collector then sends every record, and the run
exists with all its steps. The redirect is never followed, so the token never reaches the login page.

Real processes: tests/faults/worker.py (the real client at its default settings, rank 0, so its signal poller
asks the wrong URL too), `goodput sync`, a `goodput serve` on SQLite."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.faults.conftest import WORKER, Collector, stored_steps
from tests.ingest_client.conftest import spooled_records
from tests.ingest_client.web_servers import login_redirect, web_page
from tests.test_cli import GOODPUT, env_with

STEPS = 300
TOKEN = "gpw_0123456789ab_notarealsecret"


@pytest.fixture
def sqlite_collector(tmp_path: Path) -> Iterator[Collector]:
    c = Collector(f"sqlite:///{tmp_path / 'collector.db'}", tmp_path)
    yield c
    c.stop()


@pytest.mark.parametrize("wrong", ["web_page", "login_redirect"])
def test_300_steps_at_a_wrong_url_then_sync_to_the_collector_sends_every_record(
    wrong: str, sqlite_collector: Collector, tmp_path: Path
) -> None:
    server: Any = {"web_page": web_page, "login_redirect": login_redirect}[wrong]()
    spool = tmp_path / "spool"
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    try:
        trainer = subprocess.run(
            [sys.executable, str(WORKER), str(STEPS), "0.01", "3"], capture_output=True, text=True, timeout=300,
            env=env_with(GOODPUT_URL=server.url, GOODPUT_RUN_ID="wrong-url", GOODPUT_SPOOL_DIR=str(spool),
                         GOODPUT_TOKEN_FILE=str(token_file), GOODPUT_SIGNAL_POLL_S="0.5", RANK="0", LOCAL_RANK="0",
                         WORLD_SIZE="1", TORCHELASTIC_RESTART_COUNT="0"))
    finally:
        server.stop()
    assert trainer.returncode == 0, trainer.stderr[-3000:]
    assert '"acknowledged": false' in trainer.stdout
    said = [line for line in trainer.stderr.splitlines() if "GOODPUT_URL" in line]
    assert len([line for line in said if "/v1/events answered" in line]) == 1, trainer.stderr[-3000:]
    assert any("/signals" in line for line in said), "the signal poller says it once too"
    assert "Welcome to nginx!" in said[0] or "/login" in said[0]
    paths = [(s.method, s.path.split("?")[0]) for s in server.seen]
    assert ("POST", "/v1/events") in paths and ("GET", "/v1/runs/wrong-url/signals") in paths
    assert all(path != "/login" for _, path in paths), "a redirect was followed"

    records = spooled_records(spool)
    spooled = sorted(s for r in records if r["kind"] == "steps" for s in r["step"])
    assert spooled == list(range(1, STEPS + 1)), "the spool kept every step"
    sqlite_collector.start()
    synced = subprocess.run([*GOODPUT, "sync", str(spool), "--url", sqlite_collector.url], capture_output=True,
                            text=True, timeout=300, env=env_with())
    assert synced.returncode == 0, synced.stdout + synced.stderr
    assert synced.stdout.startswith(f"sent {len(records)} records, 0 already acknowledged"), synced.stdout
    assert stored_steps(sqlite_collector.db_url, "wrong-url") == {0: list(range(1, STEPS + 1))}
    assert not list(spool.rglob("*.spool")), "a fully sent spool is deleted"


def test_a_launch_whose_relay_meets_a_web_page_keeps_everything_for_sync(sqlite_collector: Collector,
                                                                         tmp_path: Path) -> None:
    """Under `goodput launch` the rank's records go to the node relay, which forwards them: the relay meets the
    wrong URL, says so once and answers the rank 503, so the rank keeps its records in its spool, as the launcher
    keeps its own run events; sync sends it all."""
    server = web_page()
    spool = tmp_path / "spool"
    try:
        launched = subprocess.run(
            [*GOODPUT, "launch", "--run-id", "relayed-wrong-url", "--gpus", "1", "--timeout", "2", "--",
             sys.executable, str(WORKER), "100", "0.01", "2"], capture_output=True, text=True, timeout=300,
            env=env_with(GOODPUT_URL=server.url, GOODPUT_SPOOL_DIR=str(spool), RANK="0", LOCAL_RANK="0",
                         WORLD_SIZE="1", TORCHELASTIC_RESTART_COUNT="0"))
    finally:
        server.stop()
    assert launched.returncode == 0, launched.stderr[-3000:]
    assert '"acknowledged": false' in launched.stdout, "the rank's records were not kept for sync"
    said = [line for line in launched.stderr.splitlines() if "/v1/events answered" in line]
    assert 1 <= len(said) <= 2 and all("Welcome to nginx!" in line for line in said), launched.stderr[-3000:]
    assert {s.path for s in server.seen} >= {"/v1/events"}
    sqlite_collector.start()
    synced = subprocess.run([*GOODPUT, "sync", str(spool), "--url", sqlite_collector.url], capture_output=True,
                            text=True, timeout=300, env=env_with())
    assert synced.returncode == 0, synced.stdout + synced.stderr
    assert stored_steps(sqlite_collector.db_url, "relayed-wrong-url") == {0: list(range(1, 101))}
    run = httpx.get(f"{sqlite_collector.url}/v1/runs/relayed-wrong-url", timeout=60).json()
    assert run["status"] == "finished", run
