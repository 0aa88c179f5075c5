"""Keep recently changed runs analysed in the background, so that opening a run page never waits for it.

Analysing a run of ten million steps takes seconds (benchmarks/dashboard.py); pages already serve the last
analysis while a newer one is built (services.derive.views.recent_views), but the first open of a run
that was never analysed would still wait for the whole build. One thread of the collector rebuilds, every
`interval_s`, the views of the runs that changed since their last analysis and received events in the last
`active_window_s`: runs someone opened in the last `interest_s` first, then the most recently active. It
spends at most `share` of each interval building (a single long build may exceed it) and goes through the
app's analysis cache, so it shares builds with the pages and follows their pace: a big run that keeps
changing is rebuilt at most every 4x its build time, or 1x when the build was incremental (the run's decoded
step blocks and events were in the cache's `summaries`). Runs not due yet have their changed step blocks
summarised (into the same `summaries`), so the build, when due, reads and decodes only what changes meanwhile.
"""

from __future__ import annotations

import logging
import threading
import time

from services.derive.cache import AnalysisCache
from services.derive.views import VIEWS, current_views
from services.storage.locks import release_process_lock, try_process_lock
from services.storage.runs import get_run_by_pk, runs_analysed_before_their_last_change
from services.storage.step_blocks import fold_step_blocks

logger = logging.getLogger(__name__)

MAX_CANDIDATES = 500
ROUND_LOCK = 0x676F6F64  # the lock of the analyst's round ("good"): one collector process at a time runs one


class WarmAnalyses:
    def __init__(self, analyses: AnalysisCache, *, interval_s: float, share: float = 0.25,
                 active_window_s: float = 3600.0, interest_s: float = 600.0) -> None:
        self._analyses = analyses
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
        with self._analyses.engine.connect() as conn:
            if not try_process_lock(conn, ROUND_LOCK):
                return 0
            try:
                return self._round()
            finally:
                release_process_lock(conn, ROUND_LOCK)

    def _round(self) -> int:
        cpu0 = time.thread_time()  # this thread's share (builds count their own threads' CPU)
        try:
            return self._round_until(time.monotonic() + self._share * max(self._interval_s, 1.0))
        finally:
            self._analyses.count_cpu(time.thread_time() - cpu0)

    def _round_until(self, deadline: float) -> int:
        built = 0
        for run_pk in self.candidates():
            if self._stop.is_set() or time.monotonic() >= deadline:
                break
            if not self._analyses.due(VIEWS, run_pk):
                # its changed step blocks summarised now (the rows since the last round): the build, when due,
                # reads only the blocks that change meanwhile
                fold_step_blocks(self._analyses.engine, run_pk, self._analyses.summaries)
                continue
            with self._analyses.engine.connect() as conn:
                run = get_run_by_pk(conn, run_pk)
            current_views(self._analyses, run)
            built += 1
        return built

    def candidates(self) -> list[int]:
        """Runs whose stored analysis is older than the run (or missing), watched ones first, then by activity."""
        with self._analyses.engine.connect() as conn:
            stale = runs_analysed_before_their_last_change(conn, received_since=time.time() - self._active_window_s,
                                                          limit=MAX_CANDIDATES)
        watched = self._analyses.watched(self._interest_s)
        return sorted(stale, key=lambda pk: pk not in watched)  # stable: activity order within each group
