"""Keep recently changed runs analysed in the background, so that opening a run page never waits for it.

Analysing a run of ten million steps takes seconds (benchmarks/dashboard.py); pages already serve the last
analysis while a newer one is built (services.derive.views.recent_views), but the first open of a run
that was never analysed would still wait for the whole build. One thread of the collector rebuilds, every
`interval_s`, the runs that changed since their last analysis and received events in the last
`active_window_s`: runs someone opened in the last `interest_s` first, then the most recently active. It
spends at most `share` of each interval building (a single long build may exceed it) and follows the same
per-run pace as the pages, so a big run that keeps changing is rebuilt at most every 4x its build time.
"""

from __future__ import annotations

import logging
import threading
import time

from sqlalchemy import Connection, Engine, outerjoin, select, text

from services.derive.ledger import ANALYSES, ANALYSIS_PACE
from services.derive.single_flight import run_key
from services.storage.load import get_run_by_pk
from services.storage.tables import Run, RunViews
from services.derive.views import current_views

logger = logging.getLogger(__name__)

MAX_CANDIDATES = 500


_ROUND_LOCK = 0x676F6F64  # pg advisory lock key of the analyst's round ("good")


def _take_round_lock(conn: Connection) -> bool:
    if conn.dialect.name != "postgresql":
        return True  # SQLite deployments run one collector process
    taken = bool(conn.execute(text("SELECT pg_try_advisory_lock(:key)"), {"key": _ROUND_LOCK}).scalar())
    conn.commit()
    return taken


def _release_round_lock(conn: Connection) -> None:
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": _ROUND_LOCK})
        conn.commit()


class RunInterest:
    """When a page last asked for each run's views (monotonic clock), so that the runs people watch go first."""

    def __init__(self, capacity: int = 10_000) -> None:
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, int], float] = {}
        self._capacity = capacity

    def note(self, engine: Engine, run_pk: int) -> None:
        with self._lock:
            if len(self._seen) >= self._capacity:
                self._seen.clear()
            self._seen[(str(engine.url), run_pk)] = time.monotonic()

    def recent(self, engine: Engine, within_s: float) -> set[int]:
        url, now = str(engine.url), time.monotonic()
        with self._lock:
            return {pk for (u, pk), at in self._seen.items() if u == url and now - at <= within_s}


INTEREST = RunInterest()


class WarmAnalyses:
    def __init__(self, engine: Engine, *, interval_s: float, share: float = 0.25, active_window_s: float = 3600.0,
                 interest_s: float = 600.0) -> None:
        self._engine = engine
        self._interval_s = interval_s
        self._share = share
        self._active_window_s = active_window_s
        self._interest_s = interest_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._interval_s <= 0 or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="goodput-warm-analyses", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)  # a build in progress finishes on its own daemon thread

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.run_once()
            except Exception:  # the next round tries again; pages still build on demand
                logger.exception("background analysis round failed; pages build their analyses on demand")

    def run_once(self) -> int:
        """One round: rebuild the stale runs that are due, until this round's time share is spent. On PostgreSQL
        one collector process at a time does it (`goodput serve --workers N` runs one analyst per process)."""
        with self._engine.connect() as conn:
            if not _take_round_lock(conn):
                return 0
            try:
                return self._round()
            finally:
                _release_round_lock(conn)

    def _round(self) -> int:
        deadline = time.monotonic() + self._share * max(self._interval_s, 1.0)
        built = 0
        for run_pk in self.candidates():
            if self._stop.is_set() or time.monotonic() >= deadline:
                break
            key = run_key(self._engine, run_pk)
            if ANALYSES.running(key) is not None or not ANALYSIS_PACE.due(key, time.monotonic()):
                continue
            with self._engine.connect() as conn:
                run = get_run_by_pk(conn, run_pk)
            current_views(self._engine, run)
            built += 1
        return built

    def candidates(self) -> list[int]:
        """Runs whose stored analysis is older than the run (or missing), watched ones first, then by activity."""
        since = time.time() - self._active_window_s
        joined = outerjoin(Run, RunViews, RunViews.run_pk == Run.id)
        query = (select(Run.id).select_from(joined)
                 .where(Run.received_at >= since, (RunViews.version.is_(None)) | (RunViews.version < Run.version))
                 .order_by(Run.received_at.desc()).limit(MAX_CANDIDATES))
        with self._engine.connect() as conn:
            stale = [row[0] for row in conn.execute(query)]
        watched = INTEREST.recent(self._engine, self._interest_s)
        return sorted(stale, key=lambda pk: pk not in watched)  # stable: activity order within each group
