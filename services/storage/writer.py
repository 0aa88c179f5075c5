"""The group-commit writer: one thread writes the batches of many concurrent requests in one transaction.

A request submits its validated batch and waits on a future; the writer drains everything queued while the
previous transaction was committing, writes it with one commit, and resolves each future with that batch's own
counts. A resolved future means the events are committed. The ingest endpoint waits on an asyncio future of its
event loop: the writer settles all of a group's such futures in one call onto the loop, not one wake-up each.
`submit` refuses at once (Overloaded: the collector answers 503 with Retry-After, and the client keeps the records
in its spool) when the queue already holds more than `max_queue_s` of writing at the pace the writer is measured to
write (`DrainRate`), or more than `max_pending_events` rows whatever the pace. Beyond its capacity, the collector
then holds about a second of work: memory stays flat, and an accepted request is answered well within the client's
timeout instead of being sent again (a resend is the same work twice: an overloaded collector that queues minutes
of work gets slower with every timeout).

A group has a fixed cost (~2 ms of CPU in this process: its six round trips, the last of them the commit's,
and the database's own per transaction), so a fleet whose node relays post one at a time, each a few records, paid
it for almost every request (benchmarks.load: groups of one or two requests, 2.4 ms of collector CPU a request). While
several senders post (`Linger.only_while`), a small group waits for the batches that keep arriving, up to
`Linger.seconds` after its first one was queued: the requests answered a few tens of milliseconds later, each group
fuller. Clients waiting for their answers send nothing meanwhile, so the wait ends as soon as arrivals pause;
while the collector paces hundreds of senders, each posting on its own clock, it lasts a small share of the pace.

Under load a group's wall is mostly its round trips waiting for the GIL, not for PostgreSQL: each releases it a few
times inside the driver, and the event loop, busy parsing the next requests, hands it back only when made to switch
(`python -m benchmarks.writer_gil`: 179 ms a group of 32 small requests at CPython's 5 ms, 26 at the 0.5 ms that
`goodput serve` sets, 9-12 alone). Hence a group's statements are few, and those whose answers only count rows go
together (services.storage.one_trip).

The writer keeps each run's key between groups (runs are never deleted); services.storage.write checks kept keys
in the same transaction, so a database emptied or restored under the writer still gets every event into its run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from services.errors import EventIdConflict, Overloaded, StorageUnavailable
from services.storage.clock_readings import ClockReadings, WrittenReadings
from services.storage.records import IngestRecord, IngestResult
from services.storage.write import write_batches

logger = logging.getLogger(__name__)

_Answer = Future[IngestResult] | asyncio.Future[IngestResult]
# records, weight, answer, project, what its request said of its senders' clocks, when it was queued (monotonic)
_Batch = tuple[Sequence[IngestRecord], int, _Answer, str | None, ClockReadings | None, float]
# Runs are never deleted, so a run's primary key, once known, stays right: the writer keeps them (up to this many)
# and looks up or creates only the runs it has not seen, instead of a query per group (services.storage.write).
_KNOWN_RUNS_MAX = 100_000
# Rows waiting above which the second writer thread joins in. Below it one thread writes everything: while it commits,
# requests queue up and its next group is fuller, and a group's fixed cost (~1.2 ms of CPU: round trips, the runs'
# touch, the commit) is paid once per ~44 small requests instead of ~22 (benchmarks.requests, 64 connections: a
# GIL-bound process, +6 % requests/s with one thread). Bulk ingest needs both: one streams rows while the other
# commits (benchmarks.ingest: 0.71 of COPY with two threads, 0.49 with one).
HELPER_BACKLOG_ROWS = 2_000


class DrainRate:
    """Rows a writer thread writes per second of writing, over its last `window` groups. A group's time includes its
    fixed costs (round trips, commit), so small groups read low: an estimate that errs towards refusing early."""

    def __init__(self, window: int = 64) -> None:
        self._groups: deque[tuple[int, float]] = deque(maxlen=window)
        self._lock = threading.Lock()
        # None until a group took measurable time; set once per group, read by every request without a lock
        self.rows_per_s: float | None = None

    def record(self, weight: int, seconds: float) -> None:
        with self._lock:
            self._groups.append((weight, seconds))
            total_s = sum(s for _, s in self._groups)
            self.rows_per_s = sum(w for w, _ in self._groups) / total_s if total_s > 1e-3 else None


class Linger:
    """How long the writer waits for more batches before it writes a small group: until `seconds` after the group's
    first batch was queued, while batches keep coming (each wait for the next lasts at most `GAP_FACTOR` times the
    usual time between two), the group is below `ROWS` rows and `only_while()` holds. Not at all when groups fill
    without it: when `FULL_GROUP` batches or more arrive, as a rule, while one group is written (many clients
    posting back to back: benchmarks.requests, where a wait only delays answers). Off with `seconds` 0.

    `paced()`: the seconds the collector asks each sender to leave between two posts (services.collector.pace). A
    sender's records wait that long in its spool anyway, so while the pace is long a group waits `PACE_SHARE` of it
    (at most `PACED_MAX_S`) when that is longer than `seconds`, whatever the gaps between arrivals: the pace is long
    only when hundreds of senders post, each on its own clock. A fleet paced at 5 s is answered ~0.2 s later and
    its groups hold about twice as many requests (benchmarks.load, 10,240 ranks at the 5 s pace: 13.7 requests a
    group against 7.2-7.5, the workers' CPU a step row -11 % and PostgreSQL's -21 % against the load generator's own,
    p99 step end -> committed 5.75 s against 5.71; a group also ends at `ROWS`)."""

    ROWS = 1_000
    GAP_FACTOR = 3.0
    FULL_GROUP = 8
    SMOOTHING = 0.05  # each arrival (each group written) moves the usual gap (write time) 5 % of the way to its own
    PACE_SHARE = 0.04
    PACED_MAX_S = 0.25  # an answer stays well within the clients' 2 s timeout (GOODPUT_HTTP_TIMEOUT_S)

    def __init__(self, seconds: float = 0.0, only_while: Callable[[], bool] | None = None,
                 paced: Callable[[], float] | None = None) -> None:
        self.seconds = seconds
        self._only_while = only_while
        self._paced = paced
        self._last_arrival: float | None = None
        self.gap_s = math.inf  # the usual time between two queued batches
        self.write_s = 0.0  # the usual time a group takes to write

    def wrote(self, seconds: float) -> None:
        """A group was written in `seconds` (by the writer thread that lingers)."""
        self.write_s += self.SMOOTHING * (seconds - self.write_s)

    def arrived(self, now: float) -> None:
        """A batch was queued (called by every submitting thread: a lost update only nudges an average)."""
        last, self._last_arrival = self._last_arrival, now
        if last is not None and now >= last:  # (two threads may take their clocks in one order, arrive in the other)
            gap = now - last
            self.gap_s = gap if math.isinf(self.gap_s) else self.gap_s + self.SMOOTHING * (gap - self.gap_s)

    def wait_s(self, first_queued: float, rows: int, now: float) -> float:
        """How long to wait for the next batch of a group of `rows` whose first batch was queued at `first_queued`;
        0: write it now."""
        if (self.seconds <= 0 or rows >= self.ROWS or math.isinf(self.gap_s)  # (no stream of batches seen yet)
                or self.write_s >= self.FULL_GROUP * self.gap_s
                or (self._only_while is not None and not self._only_while())):
            return 0.0
        paced_s = min(self.PACED_MAX_S, self.PACE_SHARE * self._paced()) if self._paced is not None else 0.0
        if paced_s > self.seconds:  # many senders, each posting once a pace: a pause in arrivals is chance, not an end
            return max(0.0, first_queued + paced_s - now)
        return max(0.0, min(first_queued + self.seconds - now, self.GAP_FACTOR * self.gap_s))


class BatchWriter:
    def __init__(self, engine: Engine, *, max_pending_events: int = 500_000, max_queue_s: float = 1.0,
                 min_pending_events: int = 5_000, max_group_events: int = 200_000,
                 threads: int | None = None, linger: Linger | None = None) -> None:
        self._engine = engine
        self._linger = linger or Linger()
        # PostgreSQL: two writers, so one transaction streams rows while the other commits (write_group takes
        # row locks in one order, so they never deadlock); the second writes only while HELPER_BACKLOG_ROWS are
        # waiting. SQLite has a single writer.
        self._threads_wanted = threads or (2 if engine.dialect.name == "postgresql" else 1)
        self._backlog = threading.Event()  # set while the helper threads are wanted
        self._stopping = False
        self._threads: list[threading.Thread] = []
        self._queue: queue.SimpleQueue[_Batch | None] = queue.SimpleQueue()  # None: stop
        self._max_pending = max_pending_events
        self._max_queue_s = max_queue_s
        self._min_pending = min_pending_events  # never refused below this many pending (no pace measured yet)
        self.drain = DrainRate()
        self._max_group = max_group_events
        self._pending = 0
        self._lock = threading.Lock()
        self._held = threading.local()  # each writer thread's connection, kept between groups
        self._run_pks: dict[tuple[str, str], int] = {}  # (project, run_id) -> runs.id, shared by the threads
        self._readings = WrittenReadings()  # the clock readings committed, shared too

    @property
    def pending_events(self) -> int:
        return self._pending

    def start(self) -> None:
        if not self._threads:
            self._stopping = False
            self._threads = [threading.Thread(target=self._run, args=(i > 0,), name=f"goodput-writer-{i}",
                                              daemon=True) for i in range(self._threads_wanted)]
            for thread in self._threads:
                thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stopping = True
        for _ in self._threads:
            self._queue.put(None)
        self._backlog.set()  # helpers waiting for a backlog take their stop from the queue
        for thread in self._threads:
            thread.join(timeout_s)
        self._threads = []

    def submit(self, records: Sequence[IngestRecord], *, project: str | None = None,
               reserved: Reservation | None = None, weight: int | None = None,
               clocks: ClockReadings | None = None) -> Future[IngestResult]:
        """Queue one batch into the runs of `project` (None: "default"; services.storage.write); the future raises
        EventIdConflict when the batch repeats a stored event id with other content (nothing of it stored).
        With `reserved` (from `reserve`, before the batch was parsed) it is never refused: its room was held.
        `weight`: the batch's `batch_weight`, when the caller has it already. `clocks`: its request's clock
        readings (services.storage.clock_readings), kept with it."""
        future: Future[IngestResult] = Future()
        self._enqueue(records, future, project, reserved, weight, clocks)
        return future

    def submit_on_loop(self, records: Sequence[IngestRecord], *, project: str | None = None,
                       reserved: Reservation | None = None, weight: int | None = None,
                       clocks: ClockReadings | None = None) -> asyncio.Future[IngestResult]:
        """`submit` for a coroutine: the answer is a future of the running event loop."""
        future: asyncio.Future[IngestResult] = asyncio.get_running_loop().create_future()
        self._enqueue(records, future, project, reserved, weight, clocks)
        return future

    def reserve(self, rows: int) -> Reservation:
        """Hold room for about `rows` rows before a batch is parsed, or raise Overloaded at once. Under overload the
        queue then fills with requests that will be written, and a refusal costs no parse: without it, bodies
        parsed while the queue filled were refused after the costly part, their clients sent them again, and an
        overloaded collector spent its cores on work it threw away (benchmarks.load, 10,240 ranks past this
        machine's capacity). `release` the reservation if the batch is not submitted."""
        rows = max(1, rows)
        self._admit(rows)
        return Reservation(self, rows)

    @property
    def pending_limit(self) -> int:
        """Rows the queue may hold now: `max_queue_s` of writing at the measured pace, within [min, max] (the min
        until a group was measured: a collector that starts under a flood learns its pace before it queues more)."""
        rate = self.drain.rows_per_s
        by_pace = self._min_pending if rate is None else int(rate * self._max_queue_s)
        return min(self._max_pending, max(self._min_pending, by_pace))

    def refuse_when_full(self) -> None:
        """Overloaded when the queue is at its limit already: what a request checks before it parses a body that
        `submit` would refuse anyway."""
        pending = self._pending
        if pending and pending >= self.pending_limit:
            raise self._overloaded(pending)

    def _overloaded(self, pending: int) -> Overloaded:
        return Overloaded(f"the collector has {pending} events waiting to be written, about {self._max_queue_s:g} s "
                          "of writing at its current pace", reason="write_queue")

    def _admit(self, rows: int) -> None:
        """Count `rows` into the queue, or raise Overloaded if they do not fit (an empty queue takes any batch)."""
        limit = self.pending_limit
        with self._lock:
            if self._pending and self._pending + rows > limit:
                raise self._overloaded(self._pending)
            self._pending += rows

    def _enqueue(self, records: Sequence[IngestRecord], answer: _Answer, project: str | None,
                 reserved: Reservation | None, weight: int | None, clocks: ClockReadings | None = None) -> None:
        if weight is None:
            weight = batch_weight(records)
        if reserved is not None:  # admitted already: the estimate becomes the batch's weight
            with self._lock:
                self._pending += weight - reserved.take()
        else:
            self._admit(weight)
        now = time.monotonic()
        self._linger.arrived(now)
        self._queue.put((records, weight, answer, project, clocks, now))
        if self._pending >= HELPER_BACKLOG_ROWS and not self._backlog.is_set():
            self._backlog.set()

    def _release(self, rows: int) -> None:
        with self._lock:
            self._pending -= rows

    def _run(self, helper: bool = False) -> None:
        while True:
            if helper:
                # a wake-up lost to this clear (a batch queued between the check and the clear) costs nothing:
                # the first thread writes everything anyway, and the next batch sets the event again
                if self._pending < HELPER_BACKLOG_ROWS and not self._stopping:
                    self._backlog.clear()
                while not self._backlog.wait(1.0) and not self._stopping:  # (a stop may race the clear above)
                    pass
            item = self._queue.get()
            if item is None:
                break
            group = [item]
            size = item[1]
            stop = False
            while size < self._max_group:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    # the queue is empty: a small group may wait for more (the helper writes a backlog: never)
                    wait_s = 0.0 if helper else self._linger.wait_s(item[5], size, time.monotonic())
                    if wait_s <= 0:
                        break
                    try:
                        nxt = self._queue.get(timeout=wait_s)
                    except queue.Empty:
                        break
                if nxt is None:
                    stop = True
                    break
                group.append(nxt)
                size += nxt[1]
            seconds = self._write(group)
            if not helper:
                self._linger.wrote(seconds)
            if stop:
                break
        self._drop_held_connection()

    def _write(self, group: list[_Batch]) -> float:
        """Write the group and answer its requests; returns the seconds the write took."""
        outcomes: list[IngestResult | Exception]
        started = time.monotonic()
        try:
            results = self._write_on_held_connection([batch[0] for batch in group], [batch[3] for batch in group],
                                                     [batch[4] for batch in group])
            self.drain.record(sum(batch[1] for batch in group), time.monotonic() - started)
        except Exception as exc:  # every failure goes back to the waiting requests
            logger.warning("writing %d batches failed: %s", len(group), exc)
            self._run_pks.clear()  # in case the database was replaced under us: look every run up again
            self._readings.clear()
            error = StorageUnavailable(f"the database did not accept the write: {exc.__class__.__name__}: {exc}")
            outcomes = [error] * len(group)
        else:
            outcomes = [EventIdConflict(index=r.conflict.index, event_id=r.conflict.event_id,
                                        run_id=r.conflict.run_id) if r.conflict is not None else r for r in results]
        finally:
            with self._lock:
                self._pending -= sum(batch[1] for batch in group)
        on_loops: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[IngestResult], IngestResult | Exception]]]
        on_loops = {}
        for (_, _, answer, _, _, _), outcome in zip(group, outcomes, strict=True):
            if isinstance(answer, asyncio.Future):
                on_loops.setdefault(answer.get_loop(), []).append((answer, outcome))
            else:
                _settle(answer, outcome)
        for loop, answers in on_loops.items():
            with contextlib.suppress(RuntimeError):  # the loop is closed: no one is waiting any more
                loop.call_soon_threadsafe(_settle_all, answers)
        return time.monotonic() - started

    def _write_on_held_connection(self, batches: list[Sequence[IngestRecord]], projects: list[str | None],
                                  clocks: list[ClockReadings | None]) -> list[IngestResult]:
        """Each writer thread keeps its connection between groups (a pool checkout pings the server first: one
        round trip per group saved). A held connection the server dropped (restarted, idle timeout) fails on
        first use; the group is written once more on a new connection: safe, since the failed transaction left
        nothing or, if only its commit's answer was lost, the retry's events are duplicates and absorbed."""
        for retry in (False, True):
            conn = self._held.conn if hasattr(self._held, "conn") else None
            if conn is None or conn.closed or conn.invalidated:
                conn = self._held.conn = self._engine.connect()
            try:
                return write_batches(conn, batches, projects, known_runs=self._known_runs(), clocks=clocks,
                                     written_readings=self._readings)
            except Exception as exc:  # the next group starts on a new connection, whatever went wrong
                self._drop_held_connection()
                if retry or not _is_disconnect(exc):
                    raise
        raise AssertionError("unreachable")

    def _known_runs(self) -> dict[tuple[str, str], int]:
        if len(self._run_pks) > _KNOWN_RUNS_MAX:
            self._run_pks.clear()
        return self._run_pks

    def _drop_held_connection(self) -> None:
        conn = getattr(self._held, "conn", None)
        self._held.conn = None
        if conn is not None:
            with contextlib.suppress(Exception):  # it is gone either way
                conn.close()


class Reservation:
    """Room held in a writer's queue for a batch being parsed (`BatchWriter.reserve`): taken by `submit`, or
    given back by `release` (or leaving its `with` block) when the batch is refused or its client went away."""

    __slots__ = ("_writer", "_rows")

    def __init__(self, writer: BatchWriter, rows: int) -> None:
        self._writer = writer
        self._rows = rows

    def take(self) -> int:
        """The rows held, now owned by the submitted batch (0 if taken or released already)."""
        rows, self._rows = self._rows, 0
        return rows

    def release(self) -> None:
        rows = self.take()
        if rows:
            self._writer._release(rows)

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _settle(answer: _Answer, outcome: IngestResult | Exception) -> None:
    if answer.done():  # an asyncio future whose request was cancelled (the client went away)
        return
    if isinstance(outcome, Exception):
        answer.set_exception(outcome)
    else:
        answer.set_result(outcome)


def _settle_all(answers: list[tuple[asyncio.Future[IngestResult], IngestResult | Exception]]) -> None:
    for answer, outcome in answers:
        _settle(answer, outcome)


# Parts of the write path run on the driver's own cursor (binary COPY, unnest inserts): its errors arrive
# unwrapped, as psycopg's classes, besides SQLAlchemy's wrappers of the others.
def _is_disconnect(exc: Exception) -> bool:
    if isinstance(exc, DBAPIError):
        return exc.connection_invalidated
    return type(exc).__module__.startswith("psycopg") and any(
        cls.__name__ == "OperationalError" for cls in type(exc).__mro__)


def batch_weight(records: Sequence[IngestRecord]) -> int:
    """A batch's rows as the write queue counts them: each event, plus the compact step and collective rows."""
    total = 0
    for r in records:
        total += 1
        if r.step_rows is not None:
            total += len(r.step_rows.step)
        if r.collective_rows is not None:
            total += len(r.collective_rows.step)
    return total
