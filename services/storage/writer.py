"""The group-commit writer: one thread writes the batches of many concurrent requests in one transaction.

A request thread submits its validated batch and waits on a Future; the writer drains everything queued
while the previous transaction was committing, writes it with one commit, and resolves each Future with
that batch's own counts. A resolved Future means the events are committed. When more events are queued
than `max_pending_events`, `submit` refuses at once (Overloaded) and the collector answers 503 with
Retry-After, so memory stays bounded under any load.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Sequence
from concurrent.futures import Future

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from services.errors import EventIdConflict, Overloaded, StorageUnavailable
from services.storage.records import IngestRecord, IngestResult
from services.storage.write import write_batches

logger = logging.getLogger(__name__)

_Batch = tuple[Sequence[IngestRecord], int, Future[IngestResult], str | None]  # records, weight, answer, project


class BatchWriter:
    def __init__(self, engine: Engine, *, max_pending_events: int = 500_000,
                 max_group_events: int = 200_000, threads: int | None = None) -> None:
        self._engine = engine
        # PostgreSQL: two writers, so one transaction streams rows while the other commits (write_group takes
        # row locks in one order, so they never deadlock). SQLite has a single writer.
        self._threads_wanted = threads or (2 if engine.dialect.name == "postgresql" else 1)
        self._threads: list[threading.Thread] = []
        self._queue: queue.SimpleQueue[_Batch | None] = queue.SimpleQueue()  # None: stop
        self._max_pending = max_pending_events
        self._max_group = max_group_events
        self._pending = 0
        self._lock = threading.Lock()
        self._held = threading.local()  # each writer thread's connection, kept between groups

    @property
    def pending_events(self) -> int:
        return self._pending

    def start(self) -> None:
        if not self._threads:
            self._threads = [threading.Thread(target=self._run, name=f"goodput-writer-{i}", daemon=True)
                             for i in range(self._threads_wanted)]
            for thread in self._threads:
                thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join(timeout_s)
        self._threads = []

    def submit(self, records: Sequence[IngestRecord], *, project: str | None = None) -> Future[IngestResult]:
        """Queue one batch into the runs of `project` (None: "default"; services.storage.write); the future raises
        EventIdConflict when the batch repeats a stored event id with other content (nothing of it stored)."""
        weight = _weight(records)
        with self._lock:
            if self._pending and self._pending + weight > self._max_pending:
                raise Overloaded(f"the collector has {self._pending} events waiting to be written")
            self._pending += weight
        future: Future[IngestResult] = Future()
        self._queue.put((records, weight, future, project))
        return future

    def _run(self) -> None:
        while True:
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
                    break
                if nxt is None:
                    stop = True
                    break
                group.append(nxt)
                size += nxt[1]
            self._write(group)
            if stop:
                break
        self._drop_held_connection()

    def _write(self, group: list[_Batch]) -> None:
        try:
            results = self._write_on_held_connection([records for records, _, _, _ in group],
                                                     [project for _, _, _, project in group])
        except Exception as exc:  # every failure goes back to the waiting requests
            logger.warning("writing %d batches failed: %s", len(group), exc)
            error = StorageUnavailable(f"the database did not accept the write: {exc.__class__.__name__}: {exc}")
            for _, _, future, _ in group:
                future.set_exception(error)
        else:
            for (_, _, future, _), result in zip(group, results, strict=True):
                if result.conflict is not None:
                    future.set_exception(EventIdConflict(index=result.conflict.index, event_id=result.conflict.event_id,
                                                         run_id=result.conflict.run_id))
                else:
                    future.set_result(result)
        finally:
            with self._lock:
                self._pending -= sum(weight for _, weight, _, _ in group)


    def _write_on_held_connection(self, batches: list[Sequence[IngestRecord]],
                                  projects: list[str | None]) -> list[IngestResult]:
        """Each writer thread keeps its connection between groups (a pool checkout pings the server first: one
        round trip per group saved). A held connection the server dropped (restarted, idle timeout) fails on
        first use; the group is written once more on a new connection: safe, since the failed transaction left
        nothing or, if only its commit's answer was lost, the retry's events are duplicates and absorbed."""
        for retry in (False, True):
            conn = self._held.conn if hasattr(self._held, "conn") else None
            if conn is None or conn.closed or conn.invalidated:
                conn = self._held.conn = self._engine.connect()
            try:
                return write_batches(conn, batches, projects)
            except Exception as exc:  # the next group starts on a new connection, whatever went wrong
                self._drop_held_connection()
                if retry or not _is_disconnect(exc):
                    raise
        raise AssertionError("unreachable")

    def _drop_held_connection(self) -> None:
        conn = getattr(self._held, "conn", None)
        self._held.conn = None
        if conn is not None:
            with contextlib.suppress(Exception):  # it is gone either way
                conn.close()


# Parts of the write path run on the driver's own cursor (binary COPY, unnest inserts): its errors arrive
# unwrapped, as psycopg's classes, besides SQLAlchemy's wrappers of the others.
def _is_disconnect(exc: Exception) -> bool:
    if isinstance(exc, DBAPIError):
        return exc.connection_invalidated
    return type(exc).__module__.startswith("psycopg") and any(
        cls.__name__ == "OperationalError" for cls in type(exc).__mro__)


def _weight(records: Sequence[IngestRecord]) -> int:
    total = 0
    for r in records:
        total += 1
        if r.step_rows is not None:
            total += len(r.step_rows.step)
        if r.collective_rows is not None:
            total += len(r.collective_rows.step)
    return total
