"""Retention: a quiet run's analyses are made current and stored, then its raw rows are deleted.

`prune` is what `goodput db prune` and the collector's background job run:

1. The retention is checked first (a finite number of days >= 0: services.settings.check_retention_days); a bad
   one touches nothing.
2. PostgreSQL: the day partitions of today and the next days exist (services.storage.retention).
3. Runs that have received nothing for `retention_days` (server clock) are frozen one by one: the views build
   (which stores the ledger and the views, and summarises the step blocks), the straggler report and the resume
   check (which read raw rows) are made current and stored (`run_products`), and so is the run's live tail (what
   live detection reads of its last steps: services.analysis.live_tail); then the run is marked
   `detail_pruned_at` at its version, only if no event arrived meanwhile. A run whose analysis fails is left
   whole and tried again next time.
4. The raw rows of the frozen runs are deleted; on PostgreSQL the day partitions older than the cutoff are
   dropped (rows of runs still going are moved out first and kept).

A pruned run keeps its step blocks: when it receives events again (its last steps and `run_end` after a quiet
spell, a late `goodput sync`, a relaunch under the same run id) its ledger and views are built again from the
blocks and the kept events (services.derive.cache), its resends are duplicates (services.storage.pruned), and
its new raw rows go at a later prune in turn. Its straggler report and resume check read raw rows: they stay
as stored. A run pruned before revision 0009 lost its blocks: its analyses are final, its new events are stored,
not analysed.
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
from services.settings import check_prune_interval_s, check_retention_days
from services.storage.live import LIVE_TAIL, live_tail
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
from services.storage.step_blocks import fold_step_blocks

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
    frozen: list[str] = field(default_factory=list)  # run ids pruned now, their analyses stored first
    left_whole: list[str] = field(default_factory=list)  # run ids not pruned: analysis failed, or events arrived
    pruned: RawRowsPruned | None = None  # None for a dry run


def prune(analyses: AnalysisCache, *, retention_days: float, now: float | None = None,
          dry_run: bool = False, setting: str = "retention_days") -> PruneResult:
    """Create the coming partitions, then freeze and prune the runs quiet for `retention_days` (see the module).
    Raises ValueError (naming `setting`) for a retention that is not a finite number of days >= 0, before anything
    is touched, and PruneBusy when another process is pruning."""
    check_retention_days(retention_days, setting=setting)
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
    if retention_days == 0:
        return result
    result.cutoff = now - retention_days * DAY_S
    with engine.connect() as conn:
        result.plan = plan = plan_raw_rows(conn, result.cutoff)
        runs = [get_run_by_pk(conn, pk) for pk in plan.runs]
    result.candidates = [run.run_id for run in runs]
    if dry_run:
        return result
    again = [run.pk for run in runs if not run.analysed_from_blocks]
    for run in runs:
        if run.analysed_from_blocks:
            (result.frozen if freeze(analyses, run, now=now) else result.left_whole).append(run.run_id)
    with engine.begin() as conn:
        mark_pruned_again(conn, again, now=now)
        result.pruned = prune_raw_rows(conn, plan)
    if result.frozen or result.pruned.partitions_dropped:
        logger.info("retention (%g days): %d run(s) pruned, analyses kept; %d partition(s) dropped; rows deleted "
                    "%s", retention_days, len(result.frozen), len(result.pruned.partitions_dropped),
                    result.pruned.rows_deleted)
    return result


def freeze(analyses: AnalysisCache, run: RunRow, *, now: float) -> bool:
    """Store every analysis of the run's current version and its live tail, and mark it pruned; False (and the run
    left as it is) when an analysis fails or an event arrives meanwhile. A run pruned before keeps the straggler
    report and resume check stored then (they read raw rows, of which it has only those received since)."""
    try:
        current_views(analyses, run)  # stores the ledger and the views of the run's version
        # kept in run_products: the products the analysis cache otherwise keeps in memory only
        finals = ([_current_json(analyses, STRAGGLERS, run), _current_json(analyses, RESUME_CHECK, run)]
                  if run.detail_pruned_at is None else [])
        fold_step_blocks(analyses.engine, run.pk)  # folded by the build already: the blocks must hold every row
    except Exception:
        logger.exception("run %s: its analyses could not be made current, so its raw rows are kept this time (the "
                         "next prune tries again)", run.run_id)
        return False
    with analyses.engine.begin() as conn:
        if not mark_pruned(conn, run.pk, version=run.version, now=now):
            logger.info("run %s received events while its analyses were stored: not pruned this time", run.run_id)
            return False
        for name, product_json in finals:
            store_product(conn, run.pk, name, version=run.version, product_json=product_json)
        store_product(conn, run.pk, LIVE_TAIL, version=run.version,
                      product_json=live_tail(conn, run, now=now).model_dump_json())
    analyses.summaries.forget(run.pk)  # its decoded blocks would only push live runs' out of the cache
    return True


def _current_json(analyses: AnalysisCache, product: Product[M], run: RunRow) -> tuple[str, str]:
    return product.name, analyses.current(product, run).model_dump_json()


class PruneJob:
    """The collector's background retention: `prune` every `interval_s`, one process at a time (the others skip
    the round). The first round runs at start, so the coming days' partitions exist before the first write."""

    def __init__(self, analyses: AnalysisCache, *, retention_days: float, interval_s: float) -> None:
        # the settings' rule (services.settings), for a job made without them: a bad value stops the start
        check_retention_days(retention_days, setting="GOODPUT_RAW_RETENTION_DAYS")
        check_prune_interval_s(interval_s, setting="GOODPUT_PRUNE_INTERVAL_S")
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
                prune(self._analyses, retention_days=self._retention_days, setting="GOODPUT_RAW_RETENTION_DAYS")
            except PruneBusy:
                pass  # another collector process does it
            except Exception:  # the next round tries again; nothing was deleted that was not stored first
                logger.exception("retention round failed; raw rows are kept until the next round "
                                 "(GOODPUT_PRUNE_INTERVAL_S) or `goodput db prune`")
            if self._stop.wait(self._interval_s):
                return
