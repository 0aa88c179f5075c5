"""`goodput serve` and `goodput db upgrade` as a user runs them, in real processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.analysis.scenarios import ev, reference_s1

GOODPUT = [sys.executable, "-m", "services.cli"]
REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"goodput serve exited with {proc.returncode}: {proc.stdout.read().decode()}")  # type: ignore[union-attr]
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError("goodput serve did not become healthy")


def env_with(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOODPUT_")}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_serve_applies_migrations_and_serves_the_ledger(backend: str, tmp_path: Path, request) -> None:
    extra: dict[str, str] = {}
    if backend == "postgresql":  # configured only through the environment
        extra["GOODPUT_DATABASE_URL"] = request.getfixturevalue("database_url_postgres")
    port = free_port()
    proc = subprocess.Popen([*GOODPUT, "serve", "--port", str(port)], cwd=tmp_path, env=env_with(**extra),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        response = httpx.post(f"{url}/v1/events", json={"events": reference_s1()}, timeout=30)
        assert response.status_code == 200, response.text
        ledger = httpx.get(f"{url}/v1/runs/s1/waste", timeout=30).json()
        assert ledger["goodput"] == pytest.approx(2400 / 4160)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    if backend == "sqlite":  # no configuration: a goodput.db file in the working directory
        assert (tmp_path / "goodput.db").exists()


def test_serve_hands_its_options_and_variables_to_every_worker(database_url_postgres: str, tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen([*GOODPUT, "serve", "--port", str(port), "--workers", "2", "--db", database_url_postgres,
                             "--no-dashboard"], cwd=tmp_path, env=env_with(GOODPUT_MAX_EVENTS_PER_BATCH="3"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    runs = [f"worker-{i}" for i in range(16)]
    try:
        wait_healthy(url, proc)
        for run_id in runs:
            with httpx.Client(base_url=url, timeout=30) as fresh:  # a new connection: the kernel picks the worker
                assert fresh.get("/dashboard/").status_code == 404  # --no-dashboard
                too_many = fresh.post("/v1/events", json={"events": [ev("run_submitted", 0, run_id)] * 4})
                assert too_many.status_code == 413, too_many.text  # GOODPUT_MAX_EVENTS_PER_BATCH
                assert fresh.post("/v1/events", json={"events": [ev("run_submitted", 0, run_id)]}).status_code == 200
        for _ in range(8):  # --db: every worker reads the one PostgreSQL database every worker wrote to
            with httpx.Client(base_url=url, timeout=30) as fresh:
                assert {r["run_id"] for r in fresh.get("/v1/runs").json()["runs"]} == set(runs)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert not (tmp_path / "goodput.db").exists()


@pytest.fixture
def database_url_postgres(postgres_admin_url: str):
    from tests.conftest import create_postgres_database, drop_postgres_database

    url = create_postgres_database(postgres_admin_url)
    yield url
    drop_postgres_database(postgres_admin_url, url)


def _head_revision() -> str:
    from alembic.script import ScriptDirectory

    from services.storage.migrate import MIGRATIONS_DIR

    return str(ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head())


def test_db_upgrade_and_check_on_both_backends(database_url: str, tmp_path: Path) -> None:
    up = subprocess.run([*GOODPUT, "db", "upgrade", "--db", database_url], cwd=tmp_path, env=env_with(),
                        capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stderr
    assert f"at revision {_head_revision()}" in up.stdout
    check = subprocess.run([*GOODPUT, "db", "check", "--db", database_url], cwd=tmp_path, env=env_with(),
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "schema matches the models" in check.stdout


def test_simulate_command_sends_a_run_whose_ledger_matches_its_truth(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen([*GOODPUT, "serve", "--port", str(port)], cwd=tmp_path, env=env_with(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        out = subprocess.run([*GOODPUT, "simulate", "--url", url, "--run-id", "cli-sim", "--hours", "0.1",
                              "--mtbf", "200", "--straggler-rank", "1", "--truth"],
                             env=env_with(), capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        import json

        truth = json.loads(out.stdout[out.stdout.index("{"):])
        ledger = httpx.get(f"{url}/v1/runs/cli-sim/waste", timeout=30).json()
        assert ledger["allocated_gpu_seconds"] == pytest.approx(truth["allocated_gpu_seconds"], rel=1e-9)
        assert ledger["productive_gpu_seconds"] == pytest.approx(truth["productive_gpu_seconds"], rel=1e-6)
        listing = subprocess.run([*GOODPUT, "runs", "--url", url], env=env_with(), capture_output=True,
                                 text=True, timeout=60)
        assert "cli-sim" in listing.stdout and f"{ledger['goodput']:.1%}" in listing.stdout
    finally:
        proc.terminate()
        proc.wait(timeout=30)
