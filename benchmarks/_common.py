"""Helpers shared by the benchmarks: throwaway databases, a collector process, machine facts."""

from __future__ import annotations

import contextlib
import os
import platform
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
ADMIN_URL = os.environ.get("GOODPUT_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()}"


@contextlib.contextmanager
def postgres_database() -> Iterator[str]:
    import psycopg
    from sqlalchemy.engine import make_url

    name = f"goodput_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def collector(database_url: str, workers: int = 1) -> Iterator[str]:
    """`goodput serve` on `database_url`, started and healthy: its URL."""
    with collector_process(database_url, workers) as (url, _):
        yield url


@contextlib.contextmanager
def collector_process(database_url: str, workers: int = 1) -> Iterator[tuple[str, int]]:
    """`collector`, with the pid of the `goodput serve` process (with one worker, the one that serves)."""
    port = free_port()
    env = {**os.environ, "GOODPUT_DATABASE_URL": database_url, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "services.cli", "serve", "--port", str(port), "--workers",
                             str(workers), "--no-dashboard"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the collector did not start")
            time.sleep(0.2)
        yield url, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=30)
