"""A large batch costs the collector about its own size in memory, not a multiple of it (a real `goodput serve`).

Measured as the growth of the server process's peak resident set (VmHWM) while it takes one 28 MB batch of
compact step records, after a small batch of the same shape has loaded everything the path imports.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.test_cli import GOODPUT, env_with, free_port, wait_healthy

T = 1_700_000_000.0
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/<pid>/status (Linux)")


def _peak_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/<pid>/status")


def _batch(prefix: str, records: int, steps: int) -> bytes:
    events: list[dict[str, Any]] = []
    for r in range(records):
        start = [T + i * 1.0123456789 for i in range(steps)]
        events.append({"event_id": f"{prefix}{r}", "run_id": "memory", "kind": "steps", "time": T, "attempt": 0,
                       "rank": r, "step": list(range(1, steps + 1)), "start": start,
                       "end": [s + 0.5 for s in start], "loss": [1.0 / (i + 1) for i in range(steps)]})
    return json.dumps({"events": events}).encode()


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_a_28mb_batch_costs_less_than_twice_its_size(tmp_path: Path, database: str,
                                                     request: pytest.FixtureRequest) -> None:
    url = f"sqlite:///{tmp_path / 'goodput.db'}" if database == "sqlite" else _postgres(request)
    port = free_port()
    proc = subprocess.Popen([*GOODPUT, "serve", "--port", str(port), "--db", url, "--no-dashboard"], cwd=tmp_path,
                            env=env_with(GOODPUT_WARM_ANALYSES_S="0"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, proc)
        with httpx.Client(timeout=300) as client:
            warm = client.post(f"{base}/v1/events", content=_batch("warm", 4, 5000),
                               headers={"Content-Type": "application/json"})
            assert warm.status_code == 200, warm.text
            body = _batch("big", 86, 5000)
            assert 26e6 < len(body) < 30e6
            before = _peak_rss_bytes(proc.pid)
            answer = client.post(f"{base}/v1/events", content=body, headers={"Content-Type": "application/json"})
            assert answer.status_code == 200 and answer.json()["accepted"] == 86, answer.text
            grown = _peak_rss_bytes(proc.pid) - before
        assert grown < 2 * len(body), f"peak RSS grew {grown / 1e6:.0f} MB = {grown / len(body):.2f}x the body"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _postgres(request: pytest.FixtureRequest) -> str:
    from tests.conftest import create_postgres_database, drop_postgres_database

    admin = request.getfixturevalue("postgres_admin_url")
    url = create_postgres_database(admin)
    request.addfinalizer(lambda: drop_postgres_database(admin, url))
    return url
