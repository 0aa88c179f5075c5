"""The node relay of a real `goodput launch` checks the token before it reads a body, and reads a body within the
collector's limits (issue 31, point 3): a 400 KB gzip bomb (about 400 MB inflated) costs the launcher almost
nothing with a wrong token (401) and at most the collector's 32 MiB body limit with the right one (413), while the
ranks' real batches still go through. Peak memory is the launcher's own high-water mark (VmHWM).

Bombs are built as benchmarks/gzip_bombs.py builds them (a JSON envelope around blanks), streamed through a
compressor so that the test itself never holds one inflated."""

from __future__ import annotations

import gzip
import http.client
import json
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.ingest_client.fake_collector import FakeCollector
from tests.test_cli import GOODPUT, env_with

TOKEN = "gpw_0123456789ab_relaysecret"
INFLATED_BYTES = 400 << 20
MIB = 1 << 20
PROBE = """
import os, pathlib, sys, time
pathlib.Path(sys.argv[1]).write_text(os.environ["GOODPUT_EVENTS_VIA"])
deadline = time.monotonic() + 240
while not pathlib.Path(sys.argv[2]).exists() and time.monotonic() < deadline:
    time.sleep(0.05)
"""


def gzip_bomb(inflated_bytes: int) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip
    parts = [compressor.compress(b'{"events": [')]
    blanks = b" " * MIB
    for _ in range(inflated_bytes // MIB):
        parts.append(compressor.compress(blanks))
    parts.append(compressor.compress(b"]}"))
    parts.append(compressor.flush())
    return b"".join(parts)


def peak_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def post(url: str, body: bytes, *, token: str | None, encoding: str | None = "gzip") -> tuple[int, dict[str, object]]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=60)
    headers = {"Content-Type": "application/json"}
    if encoding:
        headers["Content-Encoding"] = encoding
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        conn.request("POST", "/v1/events", body=body, headers=headers)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str, FakeCollector]]:
    collector = FakeCollector(token=TOKEN)
    relay_file, stop_file = tmp_path / "relay-url", tmp_path / "stop"
    proc = subprocess.Popen(
        [*GOODPUT, "launch", "--run-id", "bombs", "--gpus", "1", "--timeout", "10", "--", sys.executable, "-c", PROBE,
         str(relay_file), str(stop_file)],
        env=env_with(GOODPUT_URL=collector.url, GOODPUT_TOKEN=TOKEN, GOODPUT_SPOOL_DIR=str(tmp_path / "spool")),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not relay_file.exists() and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    time.sleep(0.5)  # the relay's thread is up; the launcher's start-up peak is behind it
    try:
        yield proc, relay_file.read_text(), collector
    finally:
        stop_file.touch()
        try:
            proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
            collector.stop()


def test_a_gzip_bomb_with_a_wrong_token_costs_the_launcher_nothing(
    launcher: tuple[subprocess.Popen[bytes], str, FakeCollector]
) -> None:
    proc, relay_url, _ = launcher
    bomb = gzip_bomb(INFLATED_BYTES)
    assert len(bomb) < 500 * 1024
    before = peak_rss_bytes(proc.pid)
    for token in (None, "gpw_wrong"):
        status, answer = post(relay_url, bomb, token=token)
        assert status == 401 and "token" in str(answer["error"])
    grown = peak_rss_bytes(proc.pid) - before
    print(f"launcher peak RSS {before / MIB:.0f} MiB, +{grown / MIB:.1f} MiB after two {len(bomb) >> 10} KiB bombs "
          "with wrong tokens")
    assert grown < 8 * MIB


def test_a_gzip_bomb_with_the_right_token_costs_at_most_the_collectors_body_limit(
    launcher: tuple[subprocess.Popen[bytes], str, FakeCollector]
) -> None:
    proc, relay_url, collector = launcher
    before = peak_rss_bytes(proc.pid)
    status, answer = post(relay_url, gzip_bomb(INFLATED_BYTES), token=TOKEN)
    assert status == 413 and "larger than the 33554432-byte limit" in str(answer["error"])
    grown = peak_rss_bytes(proc.pid) - before
    print(f"launcher peak RSS {before / MIB:.0f} MiB, +{grown / MIB:.1f} MiB after a bomb with the right token")
    assert grown < 32 * MIB + 8 * MIB  # the limit, a MiB being inflated, a chunk being read
    many = gzip.compress(b'{"events":[' + b",".join([b"{}"] * 20_001) + b"]}")
    status, answer = post(relay_url, many, token=TOKEN)
    assert status == 413 and "more than 20000 events" in str(answer["error"])
    # the relay still takes a rank's real batch, and sends it on
    now = time.time()
    event = {"event_id": "rank0-1", "run_id": "bombs", "kind": "heartbeat", "time": now, "attempt": 0, "rank": 0}
    status, answer = post(relay_url, json.dumps({"schema_version": 1, "events": [event]}).encode(), token=TOKEN,
                          encoding=None)
    assert (status, answer) == (200, {"accepted": 1, "duplicates": 0})
    assert collector.wait_for(lambda c: "rank0-1" in c.event_ids, timeout_s=30)
