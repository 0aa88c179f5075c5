"""The real servers the Prometheus tests start: `goodput serve` on PostgreSQL (2 workers: the multiprocess
counters) and Prometheus itself, and how they are queried and stopped."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.test_cli import GOODPUT, env_with, free_port, wait_healthy


def binary(name: str) -> str:
    """A command of the Debian package prometheus (prometheus, promtool)."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found: apt-get install prometheus (scripts/system-deps.sh does it)")
    return path


def start_collector(database_url: str, cwd: Path, port: int) -> subprocess.Popen[bytes]:
    """`goodput serve` with 2 workers, its run metrics cached for 1 s (wait_healthy it before use)."""
    return subprocess.Popen(
        [*GOODPUT, "serve", "--port", str(port), "--workers", "2", "--no-dashboard"], cwd=cwd,
        env=env_with(GOODPUT_DATABASE_URL=database_url, GOODPUT_METRICS_CACHE_TTL_S="1"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def start_prometheus(config: Path, data_dir: Path, port: int) -> subprocess.Popen[bytes]:
    """Its log goes nowhere: nothing would read a pipe, and a full pipe would stop it."""
    return subprocess.Popen(
        [binary("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={data_dir}",
         f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def query(prom_url: str, expr: str, timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """The first non-empty result of an instant query, polled until Prometheus has scraped it."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            response = httpx.get(f"{prom_url}/api/v1/query", params={"query": expr}, timeout=5)
            last = response.text[:500]
            if response.status_code == 200:  # 503 in plain text while Prometheus is still starting
                last = response.json()
                if last.get("status") == "success" and last["data"]["result"]:
                    return last["data"]["result"]
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.5)
    raise AssertionError(f"Prometheus never answered {expr!r} with data; last answer: {last}")


@dataclass
class Servers:
    url: str  # the collector
    port: int
    prom_url: str
    prom_port: int
    folder: Path
    collector: subprocess.Popen[bytes]
    prometheus: subprocess.Popen[bytes] | None = None

    def start_prometheus(self, config: Path) -> None:
        self.prometheus = start_prometheus(config, self.folder / "tsdb", self.prom_port)


@contextmanager
def collector_then_prometheus(database_url: str, folder: Path) -> Iterator[Servers]:
    """A healthy collector on `database_url`; Prometheus once the test has its config (`start_prometheus`).
    Both are stopped at the end."""
    port, prom_port = free_port(), free_port()
    servers = Servers(url=f"http://127.0.0.1:{port}", port=port, prom_url=f"http://127.0.0.1:{prom_port}",
                      prom_port=prom_port, folder=folder, collector=start_collector(database_url, folder, port))
    try:
        wait_healthy(servers.url, servers.collector)
        yield servers
    finally:
        if servers.prometheus is not None:
            stop(servers.prometheus)
        stop(servers.collector)
