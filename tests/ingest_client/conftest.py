from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ingest_client.common import errors
from ingest_client.common.config import ClientConfig, Mode
from ingest_client.transport.base import Transport
from ingest_client.worker import api
from ingest_client.worker.context import RunContext
from ingest_client.worker.spool import read_frames
from ingest_client.worker.tracker import Tracker
from tests.ingest_client.fake_collector import FakeCollector

REPO = Path(__file__).resolve().parents[2]
WORKER = REPO / "tests" / "faults" / "worker.py"  # a real client rank (tests/faults/worker.py's docstring)
GOODPUT = [sys.executable, "-m", "services.cli"]  # `goodput launch` and `goodput sync` need only the client
CLIENT_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID",
              "SLURM_JOB_ID", "SLURM_NODEID", "NODE_RANK", "SLURM_RESTART_COUNT")


@pytest.fixture(autouse=True)
def _isolated_client(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[BaseException]]:
    """Clean env, no global tracker, and errors swallowed on background threads fail the test."""
    for name in list(os.environ):
        if name.startswith("GOODPUT_") or name in CLIENT_ENV:
            monkeypatch.delenv(name)
    swallowed: list[BaseException] = []
    errors.set_internal_error_hook(swallowed.append)
    yield swallowed
    api.reset_for_tests()
    errors.set_internal_error_hook(None)
    assert not swallowed, f"internal errors swallowed by the client: {swallowed!r}"


@pytest.fixture
def collector() -> Iterator[FakeCollector]:
    c = FakeCollector()
    yield c
    c.stop()
    assert not c.problems, f"the client sent bodies that break docs/events.md: {c.problems}"


def make_context(run_id: str = "run-test", rank: int = 0, attempt: int = 0, world_size: int = 1) -> RunContext:
    return RunContext(run_id=run_id, attempt=attempt, rank=rank, local_rank=rank, world_size=world_size,
                      host="testhost", pid=os.getpid())


@pytest.fixture
def make_tracker(tmp_path: Path) -> Iterator[Any]:
    made: list[Tracker] = []

    def factory(*, url: str | None = None, transport: Transport | None = None, mode: str | None = None,
                run_id: str = "run-test", rank: int = 0, spool_dir: Path | None = None, start: bool = True,
                **options: Any) -> Tracker:
        resolved_mode = Mode(mode) if mode else (Mode.ONLINE if (url or transport) else Mode.OFFLINE)
        config = ClientConfig(mode=resolved_mode, url=url or ("http://memory" if transport else None),
                              spool_dir=spool_dir or tmp_path / "spool", run_id=run_id,
                              install_handlers=False, **options)
        tracker = Tracker(config, make_context(run_id, rank), transport=transport)
        made.append(tracker)
        return tracker.start() if start else tracker

    yield factory
    for tracker in made:
        tracker.shutdown(0.5)


def spooled_records(directory: Path) -> list[dict[str, Any]]:
    """Every record in every spool file under ``directory``, in file order."""
    records: list[dict[str, Any]] = []
    for path in sorted(directory.rglob("*.spool")):
        batch = read_frames(path, 0, max_events=10**9, max_bytes=10**12)
        records.extend(json.loads(p) for p in batch.payloads)
    return records


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a process of these tests: this one without GOODPUT_* variables, this tree first on the
    path, and ``extra`` (tests.test_cli.env_with, without its third-party imports)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOODPUT_")}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env
