"""Real processes for the fault tests: a `goodput serve` that can be SIGKILLed and restarted, client ranks, and
the database's own count of what arrived."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from services.storage.db import normalize_url
from services.storage.step_columns import stored_step_keys
from tests.test_cli import GOODPUT, env_with, free_port

WORKER = Path(__file__).with_name("worker.py")


@dataclass
class Collector:
    db_url: str
    folder: Path
    port: int = field(default_factory=free_port)
    extra_env: dict[str, str] = field(default_factory=dict)
    command: list[str] = field(default_factory=lambda: list(GOODPUT))  # what runs `serve ...`
    name: str = "serve"  # its logs: <name>-<start>.log
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.folder / f"{self.name}-{self.starts}.log"

    def start(self, timeout_s: float = 60.0) -> None:
        self.starts += 1
        log = open(self.log_path, "wb")  # noqa: SIM115 (the process keeps it)
        self.proc = subprocess.Popen([*self.command, "serve", "--port", str(self.port), "--db", self.db_url,
                                      "--no-dashboard"], cwd=self.folder, env=env_with(**self.extra_env),
                                     stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log_path.read_text()
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError("the collector did not start")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture
def pg_url(postgres_admin_url: str) -> Iterator[str]:
    from tests.conftest import create_postgres_database, drop_postgres_database

    url = create_postgres_database(postgres_admin_url)
    yield url
    drop_postgres_database(postgres_admin_url, url)


@pytest.fixture
def collector(pg_url: str, tmp_path: Path) -> Iterator[Collector]:
    c = Collector(pg_url, tmp_path)
    yield c
    c.stop()


def start_ranks(url: str, spool: Path, run_id: str, *, ranks: int, steps: int, period_s: float,
                flush_s: float = 120.0, **env: str) -> list[subprocess.Popen[str]]:
    procs = []
    for rank in range(ranks):
        child_env = env_with(GOODPUT_URL=url, GOODPUT_RUN_ID=run_id, GOODPUT_SPOOL_DIR=str(spool),
                             RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(ranks),
                             TORCHELASTIC_RESTART_COUNT="0", GOODPUT_FLUSH_INTERVAL_S="0.05", **env)
        procs.append(subprocess.Popen([sys.executable, str(WORKER), str(steps), str(period_s), str(flush_s)],
                                      env=child_env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    return procs


def wait_ranks(procs: list[subprocess.Popen[str]], timeout_s: float = 300.0) -> list[dict[str, Any]]:
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout_s)
        assert proc.returncode == 0, err[-3000:]
        line = [x for x in out.splitlines() if x.startswith("{")][-1]
        results.append(json.loads(line))
    return results


def stored_steps(db_url: str, run_id: str) -> dict[int, list[int]]:
    """Every step row the database holds for the run, per rank (duplicates kept: they must not exist)."""
    engine = create_engine(normalize_url(db_url))
    try:
        with engine.connect() as conn:
            keys = stored_step_keys(conn, run_id).sort_values(["rank", "step"], kind="stable")
            rows = list(zip(keys["rank"], keys["step"], strict=True))
    finally:
        engine.dispose()
    out: dict[int, list[int]] = {}
    for rank, step in rows:
        out.setdefault(int(rank), []).append(int(step))
    return out


def client_stats_at_collector(db_url: str, run_id: str) -> dict[int, dict[str, int]]:
    """The latest client_stats each rank sent (what the collector knows of the client's losses)."""
    engine = create_engine(normalize_url(db_url))
    try:
        with engine.connect() as conn:
            rows = conn.execute(text(
                "SELECT e.rank, e.time, e.data FROM events e JOIN runs r ON r.id = e.run_pk "
                "WHERE r.run_id = :run AND e.kind = 'client_stats' ORDER BY e.time"), {"run": run_id}).all()
    finally:
        engine.dispose()
    latest: dict[int, dict[str, int]] = {}
    for rank, _, data in rows:
        latest[int(rank)] = json.loads(data) if data else {}
    return latest


def sync_spool(url: str, spool: Path) -> str:
    out = subprocess.run([*GOODPUT, "sync", str(spool), "--url", url], env=env_with(), capture_output=True,
                         text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def ledger_steps(url: str, run_id: str) -> dict[str, Any]:
    response = httpx.get(f"{url}/v1/runs/{run_id}/waste", timeout=120)
    assert response.status_code == 200, response.text
    return response.json()["steps"]


def restart_postgres() -> float:
    """Restart the local PostgreSQL cluster; returns the seconds it was unavailable (about)."""
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    started = time.monotonic()
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"], check=True,
                   capture_output=True, timeout=120)
    for _ in range(600):
        if subprocess.run(["pg_isready", "-h", "127.0.0.1", "-q"], check=False).returncode == 0:
            break
        time.sleep(0.1)
    return time.monotonic() - started
