"""One cache for every product derived from a run's events (ledger, views, resume check, straggler report), with
one policy.

Analysing a big run reads every step it has (seconds for millions of rows). Without this, a dashboard that polls
a live run, or ten people opening the same run, would start one full analysis per request, each for a slightly
newer version, and the work would pile up faster than it finishes. The policy, per (run, product) of the
cache's database:

- version: a result describes the run version it was built from; `current` answers with one at least as new as
  the run its caller read, `recent` says whether its answer is `stale`.
- single flight: at most one build at a time in this process; everyone who asks shares it. A build runs on its
  own daemon thread, so a caller can stop waiting without cancelling it: the build keeps its result (in the
  database, or here in memory for products the database does not hold) and the next request finds it.
- budget: `recent` waits at most `budget_s` for a fresh result, then answers with the last one kept, flagged
  stale, while the build goes on.
- pace: a build that `recent` (a polled page) or the background analyst would start waits until `factor` x
  the last build's CPU time (its thread's; the wall time when shorter) has passed since it finished, so keeping
  a big live run current costs at most about 1/(1 + factor) of a core however often its pages are polled, and
  a machine busy with other work (which stretches a build's wall time, not its cost) does not slow it further.
  A small run (milliseconds) refreshes at once. An incremental build (the product says so: the run's step
  blocks and events were in this process's `summaries` already, so it read only what changed) is paced by
  `incremental_factor` (1): it is cheap, and a live run's figures stay within about two builds and one wait of
  its events.

A product whose build makes another one too says so in `includes` (a views build makes the run's ledger, or reuses
the stored one when it is current): a request for either waits for a build of the other in progress instead of
starting its own beside it (for the views, then reusing the ledger it stored), and the pace counts it for both.

A run whose raw rows retention deleted (`detail_pruned_at`, services.derive.retention) keeps its step blocks: its
ledger and views are built from them as before, when it receives events again. The products that read raw rows
(`reads_raw_rows`: the straggler report, the resume check) are never built again: they are what was stored before
the rows went (`run_products`), whatever its version; a product not stored is RunDetailPruned. So is every product
of a run pruned before its blocks were kept (RunRow.analysed_from_blocks).

One instance per collector app (`app.state.analyses`); every process of `goodput serve --workers N` has its own.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Generic, TypeVar, cast

from pydantic import BaseModel, ValidationError
from sqlalchemy import Engine

from services.derive.memory import release_freed_memory
from services.errors import RunDetailPruned
from services.storage.run_products import load_product
from services.storage.runs import RunRow, get_run_by_pk
from services.storage.summary_cache import SummaryCache

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Built(Generic[T]):
    version: int  # the run version `value` was derived from
    value: T


@dataclass(frozen=True, slots=True, kw_only=True)
class Product(Generic[T]):
    """What the cache needs to know of one derived product."""

    name: str
    # from the run as read when the build starts (other products through the cache); keeps it if `stored` is set
    build: Callable[[AnalysisCache, RunRow], T]
    # the last result the database keeps, if of at least the version given (-1: any; an older one is not parsed);
    # None: the product is kept in this process's memory (a few recent runs)
    stored: Callable[[AnalysisCache, RunRow, int], Built[T] | None] | None = None
    includes: tuple[str, ...] = ()  # products each build of this one makes (and stores) too
    # the value's model, for a product kept in memory: what `run_products` holds of it once the run is pruned
    model: type[BaseModel] | None = None
    # whether a build of the run now reads only what changed since the last one (Pace.incremental_factor)
    incremental: Callable[[AnalysisCache, RunRow], bool] | None = None
    # built from the run's raw rows (not only its step blocks and events): final once retention deleted them
    reads_raw_rows: bool = False

    def is_final(self, run: RunRow) -> bool:
        """Whether the run's product is the one stored when its raw rows went, never built again."""
        return run.detail_pruned_at is not None and (self.reads_raw_rows or not run.analysed_from_blocks)


class SingleFlight(Generic[T]):
    """At most one computation per key at a time; everyone who asks for the key shares its result."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._running: dict[Hashable, Future[T]] = {}
        self.report_cpu: Callable[[float], None] = _ignore  # the CPU seconds of each computation (its own thread)

    def submit(self, key: Hashable, compute: Callable[[], T]) -> Future[T]:
        """The running computation for `key`, or a new one started with `compute`."""
        with self._lock:
            future = self._running.get(key)
            if future is not None:
                return future
            future = Future()
            self._running[key] = future
        thread = threading.Thread(target=self._run, args=(key, future, compute), daemon=True,
                                  name=f"goodput-{self._name}")
        thread.start()
        return future

    def running(self, key: Hashable) -> Future[T] | None:
        with self._lock:
            return self._running.get(key)

    def _run(self, key: Hashable, future: Future[T], compute: Callable[[], T]) -> None:
        cpu0 = time.thread_time()
        try:
            result = compute()
        except BaseException as exc:  # handed to every waiter
            self._done(key, cpu0)
            future.set_exception(exc)
        else:
            self._done(key, cpu0)
            future.set_result(result)

    def _done(self, key: Hashable, cpu0: float) -> None:
        self.report_cpu(time.thread_time() - cpu0)
        with self._lock:
            self._running.pop(key, None)


def _ignore(_seconds: float) -> None:
    pass


class Pace:
    """When a background refresh may start: not before `factor` x the last refresh's duration has passed since it
    finished (and at least `min_interval_s`)."""

    def __init__(self, factor: float = 4.0, min_interval_s: float = 0.0, capacity: int = 10_000,
                 incremental_factor: float = 1.0) -> None:
        self._factor = factor
        self._incremental_factor = incremental_factor
        self._min_interval_s = min_interval_s
        self._capacity = capacity
        self._lock = threading.Lock()
        self._last: dict[Hashable, tuple[float, float]] = {}  # key -> (finished, wait), monotonic clock

    def record(self, key: Hashable, finished: float, seconds: float, *, incremental: bool = False) -> None:
        wait = (self._incremental_factor if incremental else self._factor) * seconds
        with self._lock:
            if len(self._last) >= self._capacity:
                self._last.clear()
            self._last[key] = (finished, wait)

    def due(self, key: Hashable, now: float) -> bool:
        with self._lock:
            last = self._last.get(key)
        if last is None:
            return True
        finished, wait = last
        return now - finished >= max(self._min_interval_s, wait)


_Key = tuple[str, int]  # (product name, run pk)


class AnalysisCache:
    """The derived products of the runs of one database (`engine`), built and kept by one policy."""

    def __init__(self, engine: Engine, *, pace: Pace | None = None, memory_capacity: int = 32,
                 watched_capacity: int = 10_000, summaries: SummaryCache | None = None,
                 kept_elsewhere: bool = False) -> None:
        self.engine = engine
        # another process (an analyst: GOODPUT_ANALYST=elsewhere) rebuilds the stored products of the runs that
        # changed every round: what is polled is served as stored (`recent(..., polled=True)`), not built again here
        self.kept_elsewhere = kept_elsewhere
        # the decoded step blocks and control events of the runs built here (services.storage.step_blocks)
        self.summaries = summaries if summaries is not None else SummaryCache()
        self._flights: SingleFlight[Built[object]] = SingleFlight("analysis")
        self._pace = pace or Pace()
        self._lock = threading.Lock()
        self._memory: OrderedDict[_Key, Built[object]] = OrderedDict()
        self._memory_capacity = memory_capacity
        self._included_by: dict[str, set[str]] = {}  # product -> products whose builds make it too
        self._watched: dict[int, float] = {}  # run pk -> when a page last asked for it (monotonic clock)
        self._watched_capacity = watched_capacity

    def report_cpu_to(self, report: Callable[[float], None]) -> None:
        """Call `report` with the CPU seconds of every build (the collector's counter of the CPU its analyses
        take, apart from ingestion's); `count_cpu` adds other analysis work (the analyst's block summaries)."""
        self._flights.report_cpu = report

    def count_cpu(self, seconds: float) -> None:
        self._flights.report_cpu(seconds)

    def current(self, product: Product[T], run: RunRow) -> T:
        """The product of at least the version `run` was read at: kept, or built now (joining a build in progress)."""
        if product.is_final(run):
            return self.final(product, run)
        wanted = run.version
        while True:
            kept = self._kept(product, run, at_least=wanted)
            if kept is not None and kept.version >= wanted:
                return kept.value
            related = self._related_build(product, run.pk)
            if related is not None:
                related.result()  # then look at what it stored
                run = self._reread(run)
                continue
            built = self._start(product, run.pk).result()
            if built.version >= wanted:
                return built.value
            # this joined a build that started before `run` was read: the next one reads the run again

    def recent(self, product: Product[T], run: RunRow, *, budget_s: float,
               polled: bool = False) -> tuple[T, bool] | None:
        """(value, stale): the product of the run's version when it is kept or built within `budget_s`; else the
        last one kept, stale, while a build goes on (started now if the pace allows). None: nothing kept yet and
        nothing ready within the budget. `polled`: asked again and again (live answers, fleet-wide estimates);
        where another process keeps the stored products (`kept_elsewhere`) the kept one is served as it is."""
        if product.is_final(run):
            return self.final(product, run), False
        kept = self._kept(product, run)
        if kept is not None and (kept.version >= run.version or (polled and self.kept_elsewhere)):
            return kept.value, kept.version < run.version
        related = self._related_build(product, run.pk)
        if related is not None:
            if _result_within(related, budget_s) is not None:
                kept = _newer(kept, self._kept(product, self._reread(run)))
        else:
            future = cast(Future[Built[T]] | None, self._flights.running(_key(product, run.pk)))
            if future is None and self.due(product, run.pk):
                future = self._start(product, run.pk)
            if future is not None:
                kept = _newer(kept, _result_within(future, budget_s))
        if kept is None:
            return None
        return kept.value, kept.version < run.version

    def recent_or_current(self, product: Product[T], run: RunRow, *, budget_s: float,
                          polled: bool = False) -> tuple[T, bool]:
        """(value, stale) as `recent`; for a run with nothing kept yet (nothing to show meanwhile), `current`."""
        recent = self.recent(product, run, budget_s=budget_s, polled=polled)
        return recent if recent is not None else (self.current(product, run), False)

    def due(self, product: Product[T], run_pk: int) -> bool:
        """Whether a background build of the run's product may start now: none running (of it or a related product),
        and the pace allows it."""
        key = _key(product, run_pk)
        return (self._flights.running(key) is None and self._related_build(product, run_pk) is None
                and self._pace.due(key, time.monotonic()))

    def final(self, product: Product[T], run: RunRow) -> T:
        """A pruned run's product as stored when its raw rows went (never built again: `Product.is_final`)."""
        assert run.detail_pruned_at is not None
        problem = f"no {product.name} was stored for it"
        if product.stored is not None:
            kept = product.stored(self, run, -1)  # None also when another version of goodput wrote it
            if kept is not None:
                return kept.value
            problem = f"its stored {product.name} is missing or was written by another version of goodput"
        elif product.model is not None:
            with self.engine.connect() as conn:
                stored = load_product(conn, run.pk, product.name)
            if stored is not None:
                try:
                    return cast(T, product.model.model_validate_json(stored[1]))
                except ValidationError:
                    problem = f"its stored {product.name} was written by another version of goodput"
        raise RunDetailPruned(run.run_id, run.detail_pruned_at, problem)

    # -- runs people watch ------------------------------------------------------------------------------------

    def note_watched(self, run_pk: int) -> None:
        """A page asked for the run: background analysis takes it first."""
        with self._lock:
            if len(self._watched) >= self._watched_capacity:
                self._watched.clear()
            self._watched[run_pk] = time.monotonic()

    def watched(self, within_s: float) -> set[int]:
        now = time.monotonic()
        with self._lock:
            return {pk for pk, at in self._watched.items() if now - at <= within_s}

    # -- inside -------------------------------------------------------------------------------------------------

    def _kept(self, product: Product[T], run: RunRow, at_least: int = -1) -> Built[T] | None:
        """The product kept of the run (stored or in memory); one stored of a version below `at_least` is left
        unread (None): parsing a stale result's JSON (a run's views hold its heat map) costs what the caller then
        throws away."""
        if product.stored is not None:
            return product.stored(self, run, at_least)
        with self._lock:
            kept = self._memory.get(_key(product, run.pk))
            if kept is not None:
                self._memory.move_to_end(_key(product, run.pk))
        return cast(Built[T] | None, kept)

    def _keep_in_memory(self, key: _Key, built: Built[object]) -> None:
        with self._lock:
            kept = self._memory.get(key)
            if kept is not None and kept.version > built.version:
                return  # a newer result is already here
            self._memory[key] = built
            self._memory.move_to_end(key)
            while len(self._memory) > self._memory_capacity:
                self._memory.popitem(last=False)

    def _related_build(self, product: Product[T], run_pk: int) -> Future[Built[object]] | None:
        """A build in progress of another product that makes this one, or that this one's build reuses."""
        with self._lock:
            related = sorted({*self._included_by.get(product.name, ()), *product.includes})
        for name in related:
            future = self._flights.running((name, run_pk))
            if future is not None:
                return future
        return None

    def _start(self, product: Product[T], run_pk: int) -> Future[Built[T]]:
        with self._lock:
            for included in product.includes:
                self._included_by.setdefault(included, set()).add(product.name)
        future = self._flights.submit(_key(product, run_pk), lambda: self._build(product, run_pk))
        return cast(Future[Built[T]], future)

    def _build(self, product: Product[T], run_pk: int) -> Built[object]:
        started, cpu_started = time.monotonic(), time.thread_time()
        with self.engine.connect() as conn:
            run = get_run_by_pk(conn, run_pk)  # read again: the newest version when the build starts
        if product.is_final(run):  # pruned since it was asked for: never built from what is left
            return Built(run.version, self.final(product, run))
        kept = self._kept(product, run, at_least=run.version)
        if kept is not None and kept.version >= run.version:
            return cast(Built[object], kept)  # stored meanwhile (a related build, another process): no build to pace
        incremental = product.incremental is not None and product.incremental(self, run)
        built: Built[object] = Built(run.version, product.build(self, run))
        if product.stored is None:
            self._keep_in_memory(_key(product, run_pk), built)
        finished = time.monotonic()
        # paced by the core the build used (this thread's CPU time), not by its wall time: on a busy machine (other
        # builds, ingest, the database on the same cores) the wall time grows but the cost to bound does not
        seconds = min(finished - started, time.thread_time() - cpu_started)
        for name in (product.name, *product.includes):
            self._pace.record((name, run_pk), finished, seconds, incremental=incremental)
        release_freed_memory()
        return built

    def _reread(self, run: RunRow) -> RunRow:
        with self.engine.connect() as conn:
            return get_run_by_pk(conn, run.pk)


def _key(product: Product[T], run_pk: int) -> _Key:
    return product.name, run_pk


def _result_within(future: Future[Built[T]], budget_s: float) -> Built[T] | None:
    """The build's result if it is ready within `budget_s` (its error if it failed), else None."""
    try:
        return future.result(timeout=budget_s)
    except FutureTimeout:
        return None


def _newer(kept: Built[T] | None, other: Built[T] | None) -> Built[T] | None:
    if other is None:
        return kept
    if kept is None or other.version > kept.version:
        return other
    return kept
