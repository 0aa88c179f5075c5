"""What `/metrics` says about runs, read from the database in one pass and kept for a few seconds.

A snapshot covers the runs that are running or had an event within the window (``MetricsSettings``). Ledgers
come from the cache in the ``runs`` table (`services.derive.ledger.current_ledger`); a ledger made stale by new
events is recomputed within a time budget per snapshot, past which the previous stored ledger is served
(counted in ``stale_ledgers``). Beside an analyst (GOODPUT_ANALYST=elsewhere: `goodput serve` on PostgreSQL) the
budget is 0: the analyst keeps the stored ledgers, and a worker does not build them again for a scrape.

Besides ledgers, a snapshot reads two cheap things per run (services.storage.run_activity):

- the time of the run's latest step record, for "seconds since progress";
- the latest ``client_stats`` of every process (attempt, rank), summed: cumulative counts of events the
  clients dropped (buffer full, spool full) or that the collector rejected.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import Connection

from services.analysis.live import LiveConfig, LiveStatus
from services.derive.cache import AnalysisCache
from services.derive.ledger import current_ledger, parse_stored_ledger
from services.derive.live import live_status
from services.derive.served import ledger_with_hang
from services.schemas.categories import RunStatus
from services.schemas.ledger import Ledger
from services.settings import MetricsSettings
from services.storage.run_activity import last_step_times, latest_client_stats
from services.storage.runs import RunRow, list_runs

logger = logging.getLogger(__name__)

CLIENT_COUNTERS = {"buffer": "dropped_events", "spool": "spool_dropped_events", "rejected": "rejected_events"}
MAX_RUNS_SCANNED = 5000  # runs in the window read per snapshot (fleet series cover these)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSample:
    run_id: str
    project: str
    ledger: Ledger
    # a running run's last progress as live detection finds it (on the collector's clock); else its latest step
    # end, its first event when it has no step yet
    last_progress_time: float | None
    client_dropped: dict[str, int]  # CLIENT_COUNTERS keys -> events, summed over the run's processes
    client_send_failures: int
    stale: bool  # the ledger predates the run's latest events (refresh budget spent)
    verdict: LiveStatus | None = None  # a running run's live verdict (services.derive.live); None when not running

    @property
    def running(self) -> bool:
        return self.ledger.status == RunStatus.RUNNING.value

    @property
    def hung(self) -> bool | None:
        return None if self.verdict is None else self.verdict.hung

    @property
    def hang_suspects(self) -> int:
        """Ranks named as suspects while hung, every suspect, listed or not."""
        return 0 if self.verdict is None else self.verdict.suspects_total

    def ledger_at(self, now: float) -> Ledger:
        """The ledger as served at `now`: a hung run's hang so far booked provisionally (services.derive.served)."""
        return ledger_with_hang(self.ledger, self.verdict, now)


@dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    taken_at: float  # server clock, epoch seconds
    runs: tuple[RunSample, ...]  # running runs first (latest activity first), then the rest by latest activity
    labelled: int  # the first `labelled` runs get a run_id label
    window_runs_without_ledger: int  # no stored ledger yet and no budget left to build one
    duration_s: float
    stale_ledgers: int = field(default=0)

    @property
    def labelled_runs(self) -> tuple[RunSample, ...]:
        return self.runs[: self.labelled]


def build_snapshot(analyses: AnalysisCache, config: MetricsSettings, now: float,
                   clock: Callable[[], float] = time.perf_counter, live: LiveConfig | None = None) -> Snapshot:
    engine = analyses.engine
    started = clock()
    since = now - config.run_window_h * 3600.0
    with engine.connect() as conn:
        running = list_runs(conn, status=RunStatus.RUNNING.value, limit=MAX_RUNS_SCANNED)
        recent = list_runs(conn, since=since, limit=MAX_RUNS_SCANNED)
    rows = {r.pk: r for r in (*running, *recent)}  # running first: their ledgers are refreshed first

    ledgers: dict[int, tuple[Ledger, bool]] = {}
    missing = 0
    for row in rows.values():
        fresh = row.ledger_json is not None and row.ledger_version == row.version
        if fresh or clock() - started < config.refresh_budget_s:
            try:
                ledgers[row.pk] = (current_ledger(analyses, row), False)
            except Exception:  # one bad run must not take the whole scrape down
                logger.exception("metrics: ledger of run %s failed", row.run_id)
                missing += 1
        elif (stored := parse_stored_ledger(row)) is not None:
            ledgers[row.pk] = (stored, True)
        else:
            missing += 1

    def in_window(ledger: Ledger) -> bool:
        latest = ledger.latest_time
        return ledger.status == RunStatus.RUNNING.value or (latest is not None and latest >= since)

    kept = [(rows[pk], ledger, stale) for pk, (ledger, stale) in ledgers.items() if in_window(ledger)]
    kept.sort(key=lambda item: (item[1].status != RunStatus.RUNNING.value, -(item[1].latest_time or 0.0)))
    labelled = min(config.max_runs, len(kept))

    with engine.connect() as conn:
        stats = _client_stats(conn, [row.pk for row, _, _ in kept])
        running_rows = [row for row, ledger, _ in kept[:labelled] if ledger.status == RunStatus.RUNNING.value]
        progress = last_step_times(conn, [row.pk for row in running_rows])
    verdicts = _verdicts(analyses, running_rows, now, live or LiveConfig())
    samples = []
    for row, ledger, stale in kept:
        counts = stats.get(row.pk, {})
        verdict = verdicts.get(row.pk)
        samples.append(RunSample(
            run_id=row.run_id, project=row.project, ledger=ledger,
            last_progress_time=(verdict.last_progress_time if verdict is not None
                                and verdict.last_progress_time is not None
                                else progress.get(row.pk, ledger.first_time)),
            client_dropped={key: int(counts.get(name, 0)) for key, name in CLIENT_COUNTERS.items()},
            client_send_failures=int(counts.get("send_failures", 0)), stale=stale, verdict=verdict,
        ))
    return Snapshot(taken_at=now, runs=tuple(samples), labelled=labelled, window_runs_without_ledger=missing,
                    duration_s=clock() - started, stale_ledgers=sum(1 for s in samples if s.stale))


def _client_stats(conn: Connection, run_pks: list[int]) -> dict[int, dict[str, int]]:
    """Per run: the latest cumulative counters of each process (attempt, rank), summed."""
    out: dict[int, dict[str, int]] = {}
    for run_pk, processes in latest_client_stats(conn, run_pks).items():
        totals = out.setdefault(run_pk, {})
        for fields in processes:
            for name in (*CLIENT_COUNTERS.values(), "send_failures"):
                totals[name] = totals.get(name, 0) + int(fields.get(name) or 0)
    return out


def _verdicts(analyses: AnalysisCache, rows: list[RunRow], now: float, config: LiveConfig) -> dict[int, LiveStatus]:
    """Each running run's live verdict, as the API's (services.derive.live: a few index lookups per run; times on
    the collector's clock)."""
    out: dict[int, LiveStatus] = {}
    for row in rows:
        try:
            out[row.pk] = live_status(analyses.engine, row, now, config)
        except Exception:  # one bad run must not take the whole scrape down
            logger.exception("metrics: live status of run %s failed", row.run_id)
    return out


class SnapshotCache:
    """The latest snapshot of this process, rebuilt when older than the TTL; one rebuild at a time."""

    def __init__(self, build: Callable[[], Snapshot], ttl_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._build = build
        self._ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        self._built_at = 0.0
        self.builds = 0

    def get(self) -> Snapshot:
        with self._lock:  # concurrent scrapes wait for the one rebuild instead of each running it
            if self._snapshot is None or self._clock() - self._built_at >= self._ttl_s:
                self._snapshot = self._build()
                self._built_at = self._clock()
                self.builds += 1
            return self._snapshot
