"""The background half of the client: rows -> records -> spool -> collector, on two threads.

The ``goodput-spooler`` daemon thread moves the buffered rows (and the heartbeat and stats rows of the tick) to the
spool every ``flush_interval_s`` with one write(2), and does nothing else: what a SIGKILL can lose is bounded by
that interval whatever the other thread is waiting for (a collector that takes its HTTP timeout to answer, a disk
that takes seconds to fsync).

The ``goodput-flusher`` daemon thread wakes every ``flush_interval_s`` (or when the buffer passes its threshold),
packs the rows into wire records, appends them to the spool *first*, fsyncs the spool (outside the spool lock), and
then sends what the collector has not acknowledged yet, oldest first: the spools of dead processes of the same run
(claimed at start), then this process's own. Transient failures back off exponentially with jitter (``Retry-After``
wins). Regular send rounds follow the collector's pace: at most one per ``Goodput-Send-Interval`` it answers with
(services/collector/pace.py; explicit flushes and durable events are not held back), so a big fleet sends fewer,
fuller batches. A batch the collector refuses for good is never acknowledged away: it moves to the quarantine next
to the spool (:mod:`ingest_client.worker.quarantine`) for ``goodput sync``, is counted (``rejected_events``) and
logged once per reason with what to do. A 413 halves the batch size (for the rest of the process) and sends again; a
single record still refused is quarantined. A batch refused for what it holds (400, 422) is halved until the refused
record is alone: only that record is quarantined, the records sent with it arrive (a batch holds whatever was
pending: one misjudged checkpoint event must not cost the steps around it); the batch size then doubles back with
each accepted batch. A 401 or 403 means the whole client is misconfigured: after one refusal the flusher stops
sending for a while (AUTH_BACKOFF_*; flushes included), so later records wait in the spool for the next process or
sync. The next process of the run resends the dead processes' quarantined batches once, stopping at the first one
refused again; its own quarantine it leaves to ``goodput sync``.

State-defining events (attempt start and end, resume, checkpoint start and end, run end) do not wait for the
flusher: :meth:`Pipeline.write_durable` writes them to the spool from the calling thread before the tracker call
returns, together with every row buffered before them (so the spool keeps the order the rows were recorded in).
One lock (``_spool_lock``) serialises the tick, the record builder and every spool read, write, rotation and ack
between that caller and the two threads; HTTP sends and fsyncs happen outside it. The step hot path never takes
it.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ingest_client.common.config import ClientConfig
from ingest_client.common.errors import report_internal_error
from ingest_client.common.events import Record, RecordBuilder, rows_in_record
from ingest_client.transport.base import SendResult, SendStatus, Transport
from ingest_client.worker.buffer import RowBuffer
from ingest_client.worker.coalesce import coalesce
from ingest_client.worker.quarantine import AUTH_STATUSES, QuarantinedBatch, Refusal, advice
from ingest_client.worker.ratelimit import RateLimitedLogger
from ingest_client.worker.spool import (
    OrphanSpool,
    Segment,
    SpoolWriter,
    claim_orphans,
    encode_record,
    fsync_and_close,
    run_dir_name,
)

logger = logging.getLogger(__name__)

BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 30.0
# After a 401/403 (the token is wrong or revoked: every batch would be refused), sending pauses this long,
# doubling per refusal in a row; the records wait in the spool meanwhile.
AUTH_BACKOFF_BASE_S = 5.0
AUTH_BACKOFF_CAP_S = 300.0
SEND_BUDGET_S = 1.0  # longest a regular cycle spends sending before draining the buffer again
_REFUSED_FOR_CONTENT = frozenset({400, 422})  # refused for what the batch holds: halved to isolate the record
# Longest a durable write waits for the threads to let go of the spool (they hold it for one build-and-append or
# one batch read); past it, the rows go through the buffer like any other.
DURABLE_LOCK_TIMEOUT_S = 2.0

Rows = list[tuple[Any, ...]]


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientStats:
    """Cumulative counters of one process (the first five go on the wire as ``client_stats``)."""

    dropped_events: int  # rows dropped from the full in-memory buffer, or invalid
    spool_dropped_events: int  # unsent records deleted to keep the spool (quarantine included) bounded
    send_failures: int  # POSTs that failed (transient or permanent)
    rejected_events: int  # records the collector refused for good (4xx), each kept in the quarantine
    unspooled_events: int  # events the spool could not take (its disk full or failing): sent to the collector
    # directly when it took them (not durable meanwhile), else counted in dropped_events too
    quarantined_events: int  # of which, records this process moved from the spool to the quarantine
    sent_events: int  # records the collector acknowledged (accepted or duplicate)
    replayed_events: int  # of which, records of earlier processes of the run


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineSettings:
    spool_run_dir: Path
    proc_id: str
    spool_max_bytes: int
    queue_capacity: int
    flush_interval_s: float
    http_timeout_s: float
    max_batch_events: int
    max_batch_bytes: int
    replay_orphans: bool
    spool_metadata: dict[str, object]

    @classmethod
    def from_config(
        cls, config: ClientConfig, run_id: str, proc_id: str, spool_metadata: dict[str, object]
    ) -> PipelineSettings:
        """What ``config`` sets for the pipeline of process ``proc_id`` of ``run_id``: its spool in the run's spool
        folder, where it replays the spools that earlier processes of the run left."""
        return cls(
            spool_run_dir=config.spool_dir / run_dir_name(run_id), proc_id=proc_id,
            spool_max_bytes=config.spool_max_bytes, queue_capacity=config.queue_capacity,
            flush_interval_s=config.flush_interval_s, http_timeout_s=config.http_timeout_s,
            max_batch_events=config.max_batch_events, max_batch_bytes=config.max_batch_bytes,
            replay_orphans=True, spool_metadata=spool_metadata,
        )


class Pipeline:
    """Buffer, record builder, spool writer and transport, driven by the flusher thread."""

    def __init__(
        self,
        settings: PipelineSettings,
        builder: RecordBuilder,
        transport: Transport | None,
        tick: Callable[[float], Rows] | None = None,
    ) -> None:
        self.settings = settings
        self.buffer = RowBuffer(settings.queue_capacity, wake_at=max(64, settings.queue_capacity // 8))
        self.builder = builder
        self.transport = transport  # None: offline, spool only
        self.spool = SpoolWriter(
            settings.spool_run_dir, settings.proc_id,
            max_bytes=settings.spool_max_bytes, metadata=settings.spool_metadata,
        )
        self._tick = tick
        self._spool_lock = threading.Lock()
        self._spool_lock_owner: int | None = None  # thread ident of the holder (a signal handler may re-enter)
        self._after_durable_write: list[Callable[[], None]] = []  # deferred by a signal handler (defer_while_writing)
        self._orphans: list[OrphanSpool] = []
        self._warn = RateLimitedLogger(logger)
        self._cond = threading.Condition()
        self._flush_gen = 0
        self._done_gen = 0
        self._flush_ok = False
        self._flush_deadline = 0.0
        self._stop = threading.Event()
        self._next_send_at = 0.0
        self._pace_s = 0.0  # the interval between send rounds the collector asks for (Goodput-Send-Interval)
        self._failures_in_a_row = 0
        self._auth_refusals_in_a_row = 0
        self._auth_blocked_until = 0.0  # monotonic; no sends before it (flushes included)
        self._batch_cap = settings.max_batch_events  # halved by every 413 of a batch of more than one record
        self._regrow_cap = False  # the cap, halved to isolate a refused record, doubles back after it
        self._retry_quarantine = True  # dead processes' quarantined batches: until one is refused again
        self._resending: tuple[QuarantinedBatch, list[bytes], int] | None = None  # batch, its records, sent
        # (segment path, from, to): the frames of a send that failed in flight (the collector may have stored them),
        # read again with the same extent so that they merge into the same records (worker.coalesce)
        self._in_flight: tuple[Path, int, int] | None = None
        self._refusals_logged: set[str] = set()
        self._forked = False
        self._closed = False
        self.send_failures = 0
        self.rejected_events = 0
        self.quarantined_events = 0
        self.sent_events = 0
        self.replayed_events = 0
        self.unspooled_dropped = 0
        self.unspooled_events = 0
        self._thread = threading.Thread(target=self._run, name="goodput-flusher", daemon=True)
        self._spooler = threading.Thread(target=self._keep_spooling, name="goodput-spooler", daemon=True)

    # -- lifecycle (any thread but the flusher) ---------------------------------------------

    def start(self) -> None:
        self._thread.start()
        self._spooler.start()

    @property
    def is_running(self) -> bool:
        return not self._forked and self._thread.is_alive()

    def stats(self) -> ClientStats:
        return ClientStats(
            dropped_events=self.buffer.dropped + self.builder.invalid_rows + self.unspooled_dropped,
            spool_dropped_events=self.spool.dropped_records,
            send_failures=self.send_failures,
            rejected_events=self.rejected_events,
            unspooled_events=self.unspooled_events,
            quarantined_events=self.quarantined_events,
            sent_events=self.sent_events,
            replayed_events=self.replayed_events,
        )

    def write_durable(self, rows: Rows, *, sync: bool = False) -> bool:
        """Write ``rows`` (after everything buffered before them) to the spool now, from the calling thread.

        True when they reached the OS (``write(2)``: they survive the process being killed; ``sync`` also
        fsyncs, for a machine crash). False when they could not be written here: the spool is closed, this is a
        forked child, the spool lock is held by this very thread (a signal handler interrupted a durable
        write) or by the flusher for longer than DURABLE_LOCK_TIMEOUT_S; the rows then go through the buffer.
        """
        if self._forked or not self.buffer.enabled:
            return False
        me = threading.get_ident()
        if self._spool_lock_owner == me or not self._spool_lock.acquire(timeout=DURABLE_LOCK_TIMEOUT_S):
            for row in rows:
                self.buffer.put(row)
            return False
        try:
            try:
                self._spool_lock_owner = me
                if self._closed:
                    return False
                before = self.buffer.drain()
                before.extend(rows)
                written = self._spool_records(self.builder.build(before))
                sync_fd = self.spool.unsynced_fd() if written and sync else None
            finally:
                self._spool_lock_owner = None
                self._spool_lock.release()
            if sync_fd is not None:
                self._sync(sync_fd)
            return written
        finally:
            while self._after_durable_write:
                self._after_durable_write.pop(0)()

    def defer_while_writing(self, callback: Callable[[], None]) -> bool:
        """Run ``callback`` once the durable write this thread is inside has finished, and return True; False
        (nothing deferred) when this thread is not inside one. For a signal handler that interrupted a durable
        write: the rows it drained from the buffer are in no one's hands but this frame's, and the spool lock is
        its own thread's, so a flush from the handler would wait for itself and then die with those rows."""
        if self._spool_lock_owner != threading.get_ident():
            return False
        self._after_durable_write.append(callback)
        return True

    def flush(self, timeout_s: float) -> bool:
        """Spool everything buffered now and send it; True when all of it was acknowledged
        (offline: written and fsynced) within ``timeout_s``."""
        if not self.is_running:
            return False
        deadline = time.monotonic() + max(0.0, timeout_s)
        with self._cond:
            self._flush_gen += 1
            gen = self._flush_gen
            self._flush_deadline = deadline
        self.buffer.wake.set()
        with self._cond:
            done = self._cond.wait_for(lambda: self._done_gen >= gen, timeout=max(0.0, deadline - time.monotonic()))
            return done and self._flush_ok

    def shutdown(self, timeout_s: float) -> bool:
        """Flush within the deadline, then stop the thread; what was not sent stays in the spool."""
        if self._forked:
            return False
        deadline = time.monotonic() + max(0.0, timeout_s)
        ok = self.flush(timeout_s) if self.is_running else False
        self._stop.set()
        self.buffer.wake.set()
        if self._thread.is_alive():
            self._thread.join(max(0.05, deadline - time.monotonic()))
        elif not self._thread.ident:  # never started
            self._close()
        if not ok and self.transport is not None:
            logger.warning(
                "goodput: the collector %s did not acknowledge every event within %g s of shutting down; the rest "
                "are kept in %s: the next process of this run sends them, or run `goodput sync %s`",
                getattr(self.transport, "events_url", "transport"), timeout_s, self.settings.spool_run_dir,
                self.settings.spool_run_dir)
        return ok

    def after_fork_in_child(self) -> None:
        """The child of fork() records and sends nothing; it only lets go of inherited fds."""
        self._forked = True
        self.buffer.disable()
        self.spool.forget_after_fork()
        for orphan in self._orphans:
            orphan.lock_fd = None  # the parent still holds (and will release) these locks

    # -- the flusher thread -------------------------------------------------------------------

    def _run(self) -> None:
        if self.transport is not None and self.settings.replay_orphans:
            try:
                self._orphans, _alive = claim_orphans(
                    self.settings.spool_run_dir, exclude=frozenset({self.settings.proc_id})
                )
            except Exception as exc:  # never let replay break live recording
                report_internal_error(exc)
                self._warn.warning("replay", "goodput: could not scan %s for replay: %s",
                                   self.settings.spool_run_dir, exc)
        while True:
            self.buffer.wake.wait(self.settings.flush_interval_s)
            self.buffer.wake.clear()
            if self._forked:
                return
            stopping = self._stop.is_set()
            try:
                self._cycle(stopping)
            except Exception as exc:
                report_internal_error(exc)
                self._warn.warning("internal", "goodput: internal error in the flusher (ignored): %r", exc)
            if stopping:
                break
        self._close()

    def _keep_spooling(self) -> None:
        """The spooler thread: buffered rows to the spool every flush interval, until the pipeline stops."""
        while not self._stop.wait(self.settings.flush_interval_s):
            if self._forked:
                return
            try:
                with self._spool_lock:
                    if self._closed:
                        return
                    self._spool_buffered()
            except Exception as exc:
                report_internal_error(exc)
                self._warn.warning("internal", "goodput: internal error in the spooler (ignored): %r", exc)

    def _spool_buffered(self) -> None:
        """The tick's rows after the buffered ones, to the spool (caller holds ``_spool_lock``)."""
        rows = self.buffer.drain()
        if self._tick is not None:
            rows.extend(self._tick(time.time()))
        if rows:
            self._spool_records(self.builder.build(rows))

    def _sync(self, fd: int) -> bool:
        """fsync a descriptor from ``spool.unsynced_fd()`` (no lock held); False, with a warning, if the disk fails."""
        try:
            fsync_and_close(fd)
            return True
        except OSError as exc:
            self._warn.warning("fsync", "goodput: cannot fsync the spool in %s: %s", self.settings.spool_run_dir,
                               exc)
            return False

    def _cycle(self, stopping: bool) -> None:
        with self._cond:
            gen = self._flush_gen
            deadline = self._flush_deadline
        flushing = gen > self._done_gen
        with self._spool_lock:
            self._spool_buffered()
            sync_fd = self.spool.unsynced_fd()  # None unless something was written since the last one
        if sync_fd is not None:
            self._sync(sync_fd)
        all_sent = True
        if self.transport is not None and not stopping:
            now = time.monotonic()
            if flushing:
                all_sent = self._send_pending(deadline)
            elif now >= self._next_send_at:
                self._send_pending(now + SEND_BUDGET_S, round_only=True)
                # the collector's pace: at most one regular send round per interval it asks for (a backoff set
                # by a failure in the round is longer and stays)
                self._next_send_at = max(self._next_send_at, now + self._pace_s)
        if flushing:
            with self._cond:
                self._done_gen = gen
                self._flush_ok = all_sent
                self._cond.notify_all()

    def _spool_records(self, records: list[Record]) -> bool:
        """Append to the spool (caller holds ``_spool_lock``); True when written there."""
        payloads = [encode_record(r) for r in records]
        try:
            self.spool.append(payloads)
            return True
        except OSError as exc:  # disk full or gone: try the network directly, count the rest
            self._spool_failed(exc)
            events = sum(rows_in_record(r) for r in records)
            self.unspooled_events += events
            result = self.transport.send(payloads, timeout_s=self.settings.http_timeout_s) if (
                self.transport is not None) else None
            if result is None or result.status is not SendStatus.OK:
                self.unspooled_dropped += events
            else:
                self.sent_events += len(payloads)
            return False

    def _spool_failed(self, exc: OSError) -> None:
        """Say once that the spool's disk fails (then once a minute in the log, for who configured logging)."""
        if not self._warn.once(
            "spool", "goodput: cannot write the spool in %s (%s). Until it can, records go to the collector "
            "directly and are lost when it does not take them, and none survives this process being killed; they "
            "are counted in client_stats (unspooled_events; the lost ones in dropped_events). Free space on that "
            "disk, or set GOODPUT_SPOOL_DIR to another.", self.settings.spool_run_dir, exc,
        ):
            self._warn.warning("spool", "goodput: cannot write the spool in %s: %s", self.settings.spool_run_dir, exc)

    def _pending(self) -> tuple[Segment | QuarantinedBatch, OrphanSpool | SpoolWriter] | None:
        with self._spool_lock:
            return self._pending_locked()

    def _pending_locked(self) -> tuple[Segment | QuarantinedBatch, OrphanSpool | SpoolWriter] | None:
        while self._orphans:
            orphan = self._orphans[0]
            for segment in orphan.segments:
                if segment.has_pending:
                    return segment, orphan
            if self._retry_quarantine and orphan.quarantined:
                return orphan.quarantined[0], orphan
            orphan.release()
            self._orphans.pop(0)
        for segment in list(self.spool.segments):
            if segment.has_pending:
                return segment, self.spool
        return None

    def _send_pending(self, deadline: float, *, round_only: bool = False) -> bool:
        """Send oldest-first until nothing is pending (True), a failure, or the deadline. `round_only` (a regular
        send round): what this process spooled after the round reached the end of its live segment waits for the
        next round, so a collector that answers slowly (a far region, a writer that gathers requests) is not
        posted to again and again within one round, each post carrying one flush interval's records."""
        assert self.transport is not None
        while True:
            if time.monotonic() < self._auth_blocked_until:
                return False  # refused 401/403 lately: the records wait in the spool
            found = self._pending()
            if found is None:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            item, owner = found
            if isinstance(item, QuarantinedBatch):
                assert isinstance(owner, OrphanSpool)
                if not self._resend_quarantined(item, owner, remaining):
                    return False
                continue
            segment = item
            with self._spool_lock:
                start_offset = segment.ack_offset
                until = self._in_flight[2] if self._in_flight is not None and self._in_flight[:2] == (
                    segment.path, start_offset) else None
                batch = segment.read_batch(max_events=self._batch_cap, max_bytes=self.settings.max_batch_bytes,
                                           until=until)
                # this batch takes the rest of this process's live segment: the last of the round
                last_of_round = round_only and owner is self.spool and not segment.closed and (
                    batch.end_offset >= segment.size)
            if batch.corrupt_frames:
                self._warn.warning("corrupt", "goodput: skipped %d corrupt frame(s) in %s (their checksum fails: "
                                   "the disk, or a write cut short); the records around them are sent",
                                   batch.corrupt_frames, segment.path)
            if not batch.payloads:
                continue  # only bad frames (acknowledged by read_batch), or a torn tail (it ended the segment)
            result = self.transport.send(coalesce(batch.payloads),
                                         timeout_s=min(remaining, self.settings.http_timeout_s))
            n = len(batch.payloads)
            if result.status is SendStatus.RETRY:
                self._in_flight = (segment.path, start_offset, batch.end_offset)
                self._schedule_retry(result)
                return False
            self._in_flight = None
            if result.status is SendStatus.OK:
                self._sent_ok(result)
                self.sent_events += n
                if owner is not self.spool:
                    self.replayed_events += n
                with self._spool_lock:
                    owner.record_ack(segment, batch.end_offset, n)
                if last_of_round:
                    return True
                continue
            self.send_failures += 1
            if self._split_after(result, n):
                continue  # not acknowledged: read again, smaller
            refusal = Refusal(http_status=result.http_status, message=result.message, time=time.time(), records=n)
            try:
                with self._spool_lock:
                    owner.quarantine(segment, start_offset, batch.payloads, refusal)
                    owner.record_ack(segment, batch.end_offset, n)
            except OSError as exc:  # cannot keep them aside: they stay in the spool, unacknowledged
                self._warn.warning("quarantine", "goodput: cannot write the quarantine in %s: %s",
                                   segment.path.parent, exc)
                self._schedule_retry(SendResult(status=SendStatus.RETRY, message=f"quarantine: {exc}"))
                return False
            self.rejected_events += n
            self.quarantined_events += n
            self._log_refusal(refusal, segment.path.parent)
            if result.http_status in AUTH_STATUSES:
                self._block_for_auth()
                return False
            self._failures_in_a_row = 0  # the collector answers: no transient backoff
            self._next_send_at = 0.0

    def _resend_quarantined(self, batch: QuarantinedBatch, orphan: OrphanSpool, remaining: float) -> bool:
        """Send one chunk of a dead process's quarantined batch; False to stop this round (retry later)."""
        assert self.transport is not None
        if self._resending is None or self._resending[0] is not batch:
            self._resending = (batch, batch.payloads(), 0)
        _, payloads, done = self._resending
        chunk = payloads[done:done + self._batch_cap]
        if not chunk:  # everything accepted (or an empty file): it leaves the quarantine
            with self._spool_lock:
                batch.delete()
                orphan.quarantined.remove(batch)
            self._resending = None
            return True
        result = self.transport.send(coalesce(chunk), timeout_s=min(remaining, self.settings.http_timeout_s))
        if result.status is SendStatus.RETRY:
            self._schedule_retry(result)
            return False
        if result.status is SendStatus.OK:
            self._sent_ok(result)
            self.sent_events += len(chunk)
            self.replayed_events += len(chunk)
            self._resending = (batch, payloads, done + len(chunk))
            return True
        self.send_failures += 1
        if self._split_after(result, len(chunk)):
            return True
        # Refused again: the cause is not fixed. The rest of the quarantine waits for `goodput sync`.
        self._retry_quarantine = False
        self._resending = None
        self.rejected_events += len(payloads) - done
        refusal = Refusal(http_status=result.http_status, message=result.message, time=time.time(),
                          records=len(payloads) - done)
        self._log_refusal(refusal, batch.path.parent)
        if result.http_status in AUTH_STATUSES:
            self._block_for_auth()
            return False
        return True

    def _split_after(self, result: SendResult, n: int) -> bool:
        """After a 413, 400 or 422 of a batch of ``n`` > 1 records: halve the batch size and say so (True)."""
        if n <= 1:
            return False
        if result.http_status == 413:
            self._batch_cap = max(1, n // 2)
            self._warn.warning("split", "goodput: the collector refused a batch of %d records as too large (%s); "
                               "sending at most %d per batch from now on", n, result.message, self._batch_cap)
            return True
        if result.http_status in _REFUSED_FOR_CONTENT:  # isolate the refused record: only it is quarantined
            self._batch_cap = max(1, n // 2)
            self._regrow_cap = True  # back to full batches once the refused record is quarantined alone
            return True
        return False

    def _sent_ok(self, result: SendResult) -> None:
        if self._regrow_cap:
            self._batch_cap = min(self.settings.max_batch_events, self._batch_cap * 2)
            self._regrow_cap = self._batch_cap < self.settings.max_batch_events
        self._failures_in_a_row = 0
        self._auth_refusals_in_a_row = 0
        self._next_send_at = 0.0
        if result.send_interval_s is not None:
            self._pace_s = result.send_interval_s

    def _block_for_auth(self) -> None:
        self._auth_refusals_in_a_row += 1
        ceiling = min(AUTH_BACKOFF_CAP_S, AUTH_BACKOFF_BASE_S * 2 ** min(self._auth_refusals_in_a_row - 1, 16))
        self._auth_blocked_until = time.monotonic() + random.uniform(ceiling / 2, ceiling)
        self._next_send_at = self._auth_blocked_until

    def _log_refusal(self, refusal: Refusal, where: Path) -> None:
        """Once per reason and process: what was refused, where it is kept, and what to do."""
        if refusal.reason in self._refusals_logged:
            return
        self._refusals_logged.add(refusal.reason)
        logger.warning(
            "goodput: the collector %s refused %d records with %s (%s); they are kept in the quarantine in %s "
            "and not sent again by this process: %s. Later refusals for the same reason are counted in "
            "rejected_events, not logged.",
            getattr(self.transport, "events_url", "transport"), refusal.records, refusal.reason, refusal.message,
            where, advice(refusal.http_status),
        )

    def _schedule_retry(self, result: SendResult) -> None:
        self.send_failures += 1
        self._failures_in_a_row += 1
        if result.retry_after_s is not None:
            delay = result.retry_after_s * random.uniform(1.0, 1.1)
        else:
            ceiling = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** min(self._failures_in_a_row - 1, 16))
            delay = random.uniform(ceiling / 2, ceiling)
        self._next_send_at = time.monotonic() + delay
        if result.foreign_answer:
            self._warn.once(
                "foreign",
                "goodput: %s answered %s. The records stay in the spool (%s) and are tried again. Check "
                "GOODPUT_URL: it must be the collector's base URL (the address `goodput serve` prints), reached "
                "without a login page or a redirect; once it is, the next process of this run or `goodput sync %s` "
                "sends them.",
                getattr(self.transport, "events_url", "transport"), result.message, self.settings.spool_run_dir,
                self.settings.spool_run_dir)
        what = f"HTTP {result.http_status}" if result.http_status else "unreachable"
        self._warn.warning(
            "retry",
            "goodput: collector %s (%s: %s); events are kept in %s and retried, next in %.1f s",
            getattr(self.transport, "events_url", "transport"), what, result.message,
            self.settings.spool_run_dir, delay,
        )

    def _close(self) -> None:
        if self._closed or self._forked:
            return
        with self._spool_lock:
            self._close_locked()

    def _close_locked(self) -> None:
        self._closed = True
        try:
            self.spool.close()
            for orphan in self._orphans:
                orphan.release()
            self._orphans.clear()
            if self.transport is not None:
                self.transport.close()
        except Exception as exc:
            report_internal_error(exc)
            self._warn.warning("close", "goodput: error closing the spool: %r", exc)
