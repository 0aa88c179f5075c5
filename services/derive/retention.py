"""Retention: a quiet run's analyses are made current and stored for good, then its raw rows are deleted.

`prune` is what `goodput db prune` and the collector's background job run:

1. PostgreSQL: the day partitions of today and the next days exist (services.storage.retention).
2. Runs that have received nothing for `retention_days` (server clock) are frozen one by one: the views build
   (which stores the ledger and the views), the straggler report and the resume check are made current and
   stored (`run_products`), and the run is marked `detail_pruned_at`, only if no event arrived meanwhile.
   A run whose analysis fails is left whole and tried again next time.
3. The raw rows of the frozen runs are deleted; on PostgreSQL the day partitions older than the cutoff are
   dropped (rows of runs still going are moved out first and kept).

From then on the analysis cache serves the run from what was stored and never rebuilds it (services.derive.cache).
A pruned run that receives events again (a late `goodput sync`, a relaunch under the same run id) keeps its
final analyses: the new events are stored (and pruned in turn) but not analysed, and the run page says so.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TypeVar

from pydantic import BaseModel

from services.derive.cache import AnalysisCache, Product
from services.derive.resume import RESUME_CHECK
from services.derive.stragglers import STRAGGLERS
from services.derive.views import current_views
from services.storage.locks import release_process_lock, try_process_lock
from services.storage.retention import (
    DAY_S,
    RawRowsPlan,
    RawRowsPruned,
    ensure_partitions,
    mark_pruned,
    mark_pruned_again,
    plan_raw_rows,
    prune_raw_rows,
)
from services.storage.run_products import store_product
from services.storage.runs import RunRow, get_run_by_pk

logger = logging.getLogger(__name__)

PRUNE_LOCK = 0x70727565  # ("prue"): one process at a time prunes (the collectors' job, `goodput db prune`)
M = TypeVar("M", bound=BaseModel)


class PruneBusy(Exception):
    """Another process holds the prune lock (PostgreSQL)."""


@dataclass(slots=True)
class PruneResult:
    cutoff: float | None  # None: retention is off (GOODPUT_RAW_RETENTION_DAYS=0)
    partitions_created: list[str] = field(default_factory=list)
    plan: RawRowsPlan | None = None
    candidates: list[str] = field(default_factory=list)  # run ids quiet since before the cutoff, raw rows left
    frozen: list[str] = field(default_factory=list)  # run ids whose analyses were stored for good now
    left_whole: list[str] = field(default_factory=list)  # run ids not pruned: analysis failed, or events arrived
    pruned: RawRowsPruned | None = None  # None for a dry run


def prune(analyses: AnalysisCache, *, retention_days: float, now: float | None = None,
          dry_run: bool = False) -> PruneResult:
    """Create the coming partitions, then freeze and prune the runs quiet for `retention_days` (see the module).
    Raises PruneBusy when another process is pruning."""
    now = time.time() if now is None else now
    with analyses.engine.connect() as lock_conn:
        if not try_process_lock(lock_conn, PRUNE_LOCK):
            raise PruneBusy("another goodput process is pruning this database now; try again when it is done")
        try:
            return _prune(analyses, retention_days=retention_days, now=now, dry_run=dry_run)
        finally:
            release_process_lock(lock_conn, PRUNE_LOCK)


def _prune(analyses: AnalysisCache, *, retention_days: float, now: float, dry_run: bool) -> PruneResult:
    engine = analyses.engine
    result = PruneResult(cutoff=None)
    if not dry_run:
        with engine.begin() as conn:
            result.partitions_created = ensure_partitions(conn, now=now)
    if retention_days <= 0:
        return result
    result.cutoff = now - retention_days * DAY_S
    with engine.connect() as conn:
        result.plan = plan = plan_raw_rows(conn, result.cutoff)
        runs = [get_run_by_pk(conn, pk) for pk in plan.runs]
    result.candidates = [run.run_id for run in runs]
    if dry_run:
        return result
    again = [run.pk for run in runs if run.detail_pruned_at is not None]
    for run in runs:
        if run.detail_pruned_at is None:
            (result.frozen if freeze(analyses, run, now=now) else result.left_whole).append(run.run_id)
    with engine.begin() as conn:
        mark_pruned_again(conn, again, now=now)
        result.pruned = prune_raw_rows(conn, plan)
    if result.frozen or result.pruned.partitions_dropped:
        logger.info("retention (%.0f days): %d run(s) pruned, analyses kept; %d partition(s) dropped; rows deleted "
                    "%s", retention_days, len(result.frozen), len(result.pruned.partitions_dropped),
                    result.pruned.rows_deleted)
    return result


def freeze(analyses: AnalysisCache, run: RunRow, *, now: float) -> bool:
    """Store every analysis of the run's current version and mark it pruned; False (and the run left as it is)
    when an analysis fails or an event arrives meanwhile."""
    try:
        current_views(analyses, run)  # stores the ledger and the views of the run's version
        # kept in run_products: the products the analysis cache otherwise keeps in memory only
        finals = [_current_json(analyses, STRAGGLERS, run), _current_json(analyses, RESUME_CHECK, run)]
    except Exception:
        logger.exception("run %s: its analyses could not be made current, so its raw rows are kept this time (the "
                         "next prune tries again)", run.run_id)
        return False
    with analyses.engine.begin() as conn:
        for name, product_json in finals:
            store_product(conn, run.pk, name, version=run.version, product_json=product_json)
        pruned = mark_pruned(conn, run.pk, version=run.version, now=now)
    if pruned:  # never built again: its decoded blocks would only push live runs' out of the cache
        analyses.summaries.forget(run.pk)
        return True
    logger.info("run %s received events while its analyses were stored: not pruned this time", run.run_id)
    return False


def _current_json(analyses: AnalysisCache, product: Product[M], run: RunRow) -> tuple[str, str]:
    return product.name, analyses.current(product, run).model_dump_json()


class PruneJob:
    """The collector's background retention: `prune` every `interval_s`, one process at a time (the others skip
    the round). The first round runs at start, so the coming days' partitions exist before the first write."""

    def __init__(self, analyses: AnalysisCache, *, retention_days: float, interval_s: float) -> None:
        self._analyses = analyses
        self._retention_days = retention_days
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._interval_s <= 0 or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="goodput-retention", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _loop(self) -> None:
        while True:
            try:
                prune(self._analyses, retention_days=self._retention_days)
            except PruneBusy:
                pass  # another collector process does it
            except Exception:  # the next round tries again; nothing was deleted that was not stored first
                logger.exception("retention round failed; raw rows are kept until the next round "
                                 "(GOODPUT_PRUNE_INTERVAL_S) or `goodput db prune`")
            if self._stop.wait(self._interval_s):
                return
