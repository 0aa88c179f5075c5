"""Real processes: what the collector refuses is kept on disk and `goodput sync` delivers it once the cause is fixed.

A trainer (tests/faults/worker.py: the real client at default settings, real HttpTransport) records steps with a
revoked token against a real `goodput serve` with tokens; every batch is refused 401. `goodput sync` with a new
token of the same project then stores every step exactly once, and a second sync sends nothing. A collector with a
small per-batch limit answers 413 to the client's batches: the client halves them until they fit.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
from sqlalchemy import create_engine

from services.storage.db import normalize_url
from services.storage.step_columns import stored_step_keys
from tests.faults.conftest import WORKER, Collector
from tests.test_cli import GOODPUT, env_with

STEPS = 3000


def _cli(*args: str, cwd: Path) -> str:
    out = subprocess.run([*GOODPUT, *args], cwd=cwd, env=env_with(), capture_output=True, text=True, timeout=120,
                         check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout.strip()


def _train(url: str, spool: Path, run_id: str, *, attempt: int, steps: int, flush_s: float,
           **env: str) -> dict[str, object]:
    child_env = env_with(GOODPUT_URL=url, GOODPUT_RUN_ID=run_id, GOODPUT_SPOOL_DIR=str(spool), RANK="0",
                         LOCAL_RANK="0", WORLD_SIZE="1", TORCHELASTIC_RESTART_COUNT=str(attempt), **env)
    out = subprocess.run([sys.executable, str(WORKER), str(steps), "0.001", str(flush_s)], env=child_env,
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    result: dict[str, object] = json.loads([x for x in out.stdout.splitlines() if x.startswith("{")][-1])
    result["stderr"] = out.stderr
    return result


def _sync(url: str, spool: Path, token: str | None = None) -> subprocess.CompletedProcess[str]:
    extra = ["--token", token] if token else []
    return subprocess.run([*GOODPUT, "sync", str(spool), "--url", url, *extra], env=env_with(), capture_output=True,
                          text=True, timeout=300, check=False)


def _stored_steps(db_url: str, run_id: str) -> dict[int, list[int]]:
    """Every stored step row of the run per attempt (duplicates kept: they must not exist)."""
    engine = create_engine(normalize_url(db_url))
    try:
        with engine.connect() as conn:
            keys = stored_step_keys(conn, run_id).sort_values(["attempt", "step"], kind="stable")
            rows = list(zip(keys["attempt"], keys["step"], strict=True))
    finally:
        engine.dispose()
    out: dict[int, list[int]] = {}
    for attempt, step in rows:
        out.setdefault(int(attempt), []).append(int(step))
    return out


def test_steps_refused_with_a_revoked_token_are_stored_once_by_goodput_sync_with_a_new_token(
    tmp_path: Path,
) -> None:
    db = f"sqlite:///{tmp_path / 'goodput.db'}"
    spool = tmp_path / "spool"
    revoked = _cli("token", "create", "--project", "alpha", "--kind", "write", "--name", "old", "--db", db,
                   cwd=tmp_path)
    _cli("token", "revoke", revoked.split("_")[1], "--db", db, cwd=tmp_path)
    read = _cli("token", "create", "--project", "alpha", "--kind", "read", "--db", db, cwd=tmp_path)
    collector = Collector(db, tmp_path, extra_env={"GOODPUT_AUTH_CACHE_TTL_S": "0"})
    collector.start()
    try:
        trained = _train(collector.url, spool, "revoked-run", attempt=0, steps=STEPS, flush_s=3.0,
                         GOODPUT_TOKEN=revoked)
        assert _stored_steps(db, "revoked-run") == {}
        stats = trained["stats"]
        assert isinstance(stats, dict) and stats["sent_events"] == 0 and stats["quarantined_events"] > 0, stats
        assert list(spool.rglob("*")), "everything refused is still on disk"

        wrong = _sync(collector.url, spool, revoked)  # the cause is not fixed yet: nothing is lost either
        assert wrong.returncode == 1 and "(HTTP 401)" in wrong.stdout and "GOODPUT_TOKEN" in wrong.stdout, (
            wrong.stdout + wrong.stderr)
        assert _stored_steps(db, "revoked-run") == {}

        fixed = _cli("token", "create", "--project", "alpha", "--kind", "write", "--name", "new", "--db", db,
                     cwd=tmp_path)
        first = _sync(collector.url, spool, fixed)
        assert first.returncode == 0 and "came from the quarantine" in first.stdout, first.stdout + first.stderr
        assert _stored_steps(db, "revoked-run") == {0: list(range(1, STEPS + 1))}
        waste = httpx.get(f"{collector.url}/v1/runs/revoked-run/waste", timeout=120,
                          headers={"Authorization": f"Bearer {read}"})
        assert waste.status_code == 200, waste.text
        assert waste.json()["steps"]["computed"] == STEPS, waste.json()["steps"]

        second = _sync(collector.url, spool, fixed)
        assert second.returncode == 0 and second.stdout.startswith("sent 0 records"), second.stdout
        assert _stored_steps(db, "revoked-run") == {0: list(range(1, STEPS + 1))}
        assert not list(spool.rglob("*.quarantine")) and not list(spool.rglob("*.spool"))
    finally:
        collector.stop()


def test_a_collector_answering_413_gets_every_step_once_in_smaller_batches(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'goodput.db'}"
    spool = tmp_path / "spool"
    # The first process records offline (a record per flush cycle of 10 ms: hundreds of records in the spool);
    # the second, online, replays them in batches of up to 500 records to a collector that takes 16 at most.
    offline = _train("http://127.0.0.1:9", spool, "split-run", attempt=0, steps=STEPS, flush_s=1.0,
                     GOODPUT_MODE="offline", GOODPUT_FLUSH_INTERVAL_S="0.01")
    assert offline["acknowledged"] is True  # offline: spooled and fsynced
    collector = Collector(db, tmp_path, extra_env={"GOODPUT_MAX_EVENTS_PER_BATCH": "16"})
    collector.start()
    try:
        online = _train(collector.url, spool, "split-run", attempt=1, steps=200, flush_s=30.0)
        assert online["acknowledged"] is True, online
        stats = online["stats"]
        assert isinstance(stats, dict) and stats["replayed_events"] > 16 and stats["rejected_events"] == 0, stats
        assert _stored_steps(db, "split-run") == {0: list(range(1, STEPS + 1)), 1: list(range(1, 201))}
        assert not list(spool.rglob("*.quarantine"))
    finally:
        collector.stop()
