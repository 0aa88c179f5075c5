"""Live hang detection as the collector does it, for tests: a scenario's events written through ingest (the batch
parser and the storage writer) into a database, its live state read back by services.storage.live and judged at
the server time a test names. The scenarios' assertions are the ground truth of what live detection must say.

Each stored scenario gets a project of its own, so a module's scenarios share one migrated database (the `live_db`
fixture, tests/conftest.py) and may repeat run and event ids."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import count
from typing import Any

from sqlalchemy import Engine

from services.analysis.live import LiveConfig, LiveState, LiveStatus, detect_hang
from services.collector.batch import parse_batch
from services.derive.live import read_live_state
from services.storage.runs import RunRef, RunRow, get_run
from services.storage.write import write_batches

BATCH_EVENTS = 500


@dataclass(frozen=True, slots=True)
class StoredRun:
    engine: Engine
    ref: RunRef

    def row(self) -> RunRow:
        with self.engine.connect() as conn:
            return get_run(conn, self.ref)

    def state(self, now: float, config: LiveConfig | None = None) -> LiveState:
        """The run's LiveState at the server time `now` (heartbeats older than the lookback are not read)."""
        with self.engine.connect() as conn:
            return read_live_state(conn, get_run(conn, self.ref), now, config or LiveConfig())

    def status(self, now: float, config: LiveConfig | None = None) -> LiveStatus:
        """The verdict at the server time `now`, read and judged as GET /v1/runs/{id}/live does."""
        config = config or LiveConfig()
        return detect_hang(self.state(now, config), now, config)


class LiveDatabase:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._projects = count()

    def store(self, events: Iterable[dict[str, Any]]) -> StoredRun:
        """Write one run's events (wire format), in batches of BATCH_EVENTS in the order given, into a new project."""
        events = list(events)
        (run_id,) = {e["run_id"] for e in events}
        project = f"live-{next(self._projects)}"
        for at in range(0, len(events), BATCH_EVENTS):
            body = json.dumps({"events": events[at:at + BATCH_EVENTS]}).encode()
            (result,) = write_batches(self.engine, [parse_batch(body, max_events=10**6, max_rows=10**8)], [project])
            assert result.conflict is None, result.conflict
        return StoredRun(self.engine, RunRef(project, run_id))


def heartbeat_events(run_id: str, beats: Iterable[tuple[int, float, int | None, int | None]], *,
                     attempt: int = 0) -> list[dict[str, Any]]:
    """Heartbeat events of (rank, time, step in progress, collectives started in it)."""
    return [{"event_id": f"hb-{rank}-{time!r}", "run_id": run_id, "kind": "heartbeat", "time": time,
             "attempt": attempt, "rank": rank,
             **({"step": step} if step is not None else {}),
             **({"collectives": collectives} if collectives is not None else {})}
            for rank, time, step, collectives in beats]
