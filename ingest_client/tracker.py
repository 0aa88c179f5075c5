"""The per-process Tracker: the hot-path API used inside the training loop.

Every hot-path call (steps, collectives, digests) reads the clock, builds one small tuple and appends it to a
bounded deque (:class:`ingest_client.buffer.RowBuffer`). No locks, no logging, no I/O, no formatting: the
``goodput-flusher`` thread does the rest (:mod:`ingest_client.flusher`), every ``flush_interval_s``; a process
killed meanwhile loses what it recorded in its last interval.

The calls that define what state exists (``start``'s ``attempt_start``, ``resumed``, ``checkpoint`` start and end,
``end_attempt``, ``finish``'s ``run_end``) are durable: they are written and fsynced to the spool, with every row
recorded before them, before they return (:meth:`ingest_client.flusher.Pipeline.write_durable`). They happen a
few times per attempt and cost a write and an fsync (``benchmarks/client_overhead.py``).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import Any, SupportsFloat

from ingest_client.buffer import RowBuffer
from ingest_client.config import ClientConfig, Mode
from ingest_client.context import RunContext
from ingest_client.events import (
    MAX_CHECKPOINT_CHARS,
    MAX_DETAIL_CHARS,
    ROW_COLLECTIVE,
    ROW_EVENT,
    ROW_STEP,
    AttemptEndReason,
    EventKind,
    RecordBuilder,
    RecordContext,
    RunStatus,
)
from ingest_client.flusher import ClientStats, Pipeline, PipelineSettings, Rows
from ingest_client.phases import PhaseSpan
from ingest_client.poller import SignalPoller
from ingest_client.spool import run_dir_name
from ingest_client.timing import Emit, IntervalTimer
from ingest_client.transport.base import Transport
from ingest_client.transport.http import HttpTransport
from ingest_client.transport.relayed import RelayedTransport

_time = time.time
_perf = time.perf_counter
# Durable events are fsynced too (measured on a 2-core VM: write 4 us, fsync 0.2 ms median and 10 ms p99; they come
# a few times per attempt and a checkpoint takes seconds), so a machine crash cannot lose the end of a checkpoint
# whose files the trainer fsynced.
DURABLE_FSYNC = True
LAUNCHED_ENV = "GOODPUT_LAUNCHED"  # "1" in processes started by `goodput launch` (ingest_client/launch.py)


class StepSpan:
    """``with tracker.step(n) as s:`` times one optimizer step; set ``s.loss`` / ``s.lr`` inside.

    Pass plain floats: a tensor works but is converted with ``float()`` on the flusher thread.
    A step that raises is not recorded.
    """

    __slots__ = ("_tracker", "step", "loss", "lr", "_start", "_p0")

    def __init__(self, tracker: Tracker, step: int) -> None:
        self._tracker = tracker
        self.step = step
        self.loss: SupportsFloat | None = None
        self.lr: SupportsFloat | None = None

    def __enter__(self) -> StepSpan:
        self._tracker._next_step = self.step
        self._start = _time()
        self._p0 = _perf()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        p1 = _perf()
        if exc_type is None:
            tracker = self._tracker
            start = self._start
            tracker._put((ROW_STEP, self.step, start, start + (p1 - self._p0), self.loss, self.lr))
            tracker._next_step = self.step + 1


class CollectiveSpan:
    """``with tracker.collective("all_reduce"):`` times one collective of the in-progress step."""

    __slots__ = ("_tracker", "_op", "_step", "_start", "_p0")

    def __init__(self, tracker: Tracker, op: str) -> None:
        self._tracker = tracker
        self._op = op

    def __enter__(self) -> CollectiveSpan:
        self._step = self._tracker._next_step
        self._start = _time()
        self._p0 = _perf()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        p1 = _perf()
        start = self._start
        self._tracker._put((ROW_COLLECTIVE, self._step, self._op, start, start + (p1 - self._p0)))


class CheckpointSpan:
    """``with tracker.checkpoint(step):`` emits checkpoint_start, then checkpoint_end(ok).

    When a checkpoint request is pending (``tracker.should_checkpoint()``), both events carry its id as
    ``request_id`` and the request counts as honoured: ``should_checkpoint()`` turns false again.
    """

    __slots__ = ("_tracker", "_step", "request_id")

    def __init__(self, tracker: Tracker, step: int) -> None:
        self._tracker = tracker
        self._step = step
        self.request_id: int | None = None

    def __enter__(self) -> CheckpointSpan:
        poller = self._tracker._poller
        self.request_id = poller.take() if poller is not None else None
        fields: dict[str, Any] = {"step": self._step}
        if self.request_id is not None:
            fields["request_id"] = self.request_id
        self._tracker._durable((ROW_EVENT, EventKind.CHECKPOINT_START, _time(), fields))
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        fields: dict[str, Any] = {"step": self._step, "ok": exc_type is None}
        if self.request_id is not None:
            fields["request_id"] = self.request_id
        self._tracker._durable((ROW_EVENT, EventKind.CHECKPOINT_END, _time(), fields))


_LIVE_TRACKERS: weakref.WeakSet[Tracker] = weakref.WeakSet()


def _disable_trackers_in_child() -> None:
    for tracker in list(_LIVE_TRACKERS):
        tracker._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_disable_trackers_in_child)


class Tracker:
    """Records one process's training events. Create it with :func:`ingest_client.init`.

    Checkpoint requests: a scheduler posts ``POST /v1/runs/{run_id}/checkpoint-request``; rank 0's
    ``goodput-signals`` thread polls the collector every ``signal_poll_s`` (2 s) and ``should_checkpoint()``
    turns true (a non-blocking attribute read). Every rank of a DDP job must checkpoint at the same step, and
    only rank 0 polls, so share the flag with one small collective, every step or every few::

        flag = torch.tensor([1 if tracker.should_checkpoint() else 0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)     # or dist.broadcast(flag, src=0)
        if flag.item() or step % checkpoint_every == 0:
            checkpoint(step)                            # the writer uses `with tracker.checkpoint(step):`

    The checkpoint that follows carries the request's id (``request_id``) and the collector marks the request
    fulfilled. ``GOODPUT_POLL_ALL_RANKS=1`` makes every rank poll (then all_reduce MAX of every rank's flag).
    """

    def __init__(
        self,
        config: ClientConfig,
        context: RunContext,
        *,
        transport: Transport | None = None,
        proc_id: str | None = None,
    ) -> None:
        self.config = config
        self.context = context
        self.proc_id = proc_id or uuid.uuid4().hex
        self._pid = os.getpid()
        self._next_step = 1  # the in-progress step: last completed + 1
        self._ended = False
        self._end_lock = threading.Lock()
        self._started = False
        self._last_heartbeat_s = 0.0
        self._last_stats_s = 0.0
        self._last_stats: tuple[int, int, int, int] = (0, 0, 0, 0)
        self._force_stats = False
        self._pipeline: Pipeline | None = None
        self._poller: SignalPoller | None = None
        self._coll_step = 0  # the step whose collectives _coll_started counts (see collective_started)
        self._coll_started = 0
        self._timers_to_drain: list[IntervalTimer] = []
        if config.mode is Mode.DISABLED:
            buffer = RowBuffer(64, 64)
            buffer.enabled = False
        else:
            if config.mode is Mode.OFFLINE:
                transport = None
            elif transport is None:
                transport = _transport(config, self.proc_id)
            builder = RecordBuilder(
                RecordContext(run_id=context.run_id, attempt=context.attempt, rank=context.rank), self.proc_id
            )
            settings = PipelineSettings(
                spool_run_dir=config.spool_dir / run_dir_name(context.run_id),
                proc_id=self.proc_id,
                spool_max_bytes=config.spool_max_bytes,
                queue_capacity=config.queue_capacity,
                flush_interval_s=config.flush_interval_s,
                http_timeout_s=config.http_timeout_s,
                max_batch_events=config.max_batch_events,
                max_batch_bytes=config.max_batch_bytes,
                replay_orphans=True,
                spool_metadata={"pid": context.pid, "host": context.host, "run_id": context.run_id,
                                "rank": context.rank, "attempt": context.attempt},
            )
            self._pipeline = Pipeline(settings, builder, transport, tick=self._tick)
            buffer = self._pipeline.buffer
        self._buffer = buffer
        self._put: Callable[[tuple[Any, ...]], None] = buffer.put
        if config.polls_signals and (context.rank == 0 or config.poll_all_ranks):
            assert config.url is not None
            self._poller = SignalPoller(config.url, context.run_id, interval_s=config.signal_poll_s,
                                        timeout_s=config.http_timeout_s, token=config.token)
        _LIVE_TRACKERS.add(self)

    @property
    def enabled(self) -> bool:
        return self._buffer.enabled

    @property
    def records_in_this_process(self) -> bool:
        """True while this tracker records: enabled, and not the copy a forked child inherited."""
        return os.getpid() == self._pid and self._buffer.enabled

    @property
    def spool_dir(self) -> str | None:
        return None if self._pipeline is None else str(self._pipeline.settings.spool_run_dir)

    def start(self) -> Tracker:
        """Emit ``attempt_start`` and start the flusher (called by ``init``)."""
        if self._started or self._pipeline is None:
            return self
        self._started = True
        ctx = self.context
        self._durable((ROW_EVENT, EventKind.ATTEMPT_START, _time(), ctx.attempt_start_fields()))
        self._last_heartbeat_s = self._last_stats_s = _time()
        self._pipeline.start()
        if self._poller is not None:
            self._poller.start()
        return self

    # -- hot path --------------------------------------------------------------------------

    def step(self, step: int) -> StepSpan:
        return StepSpan(self, step)

    def record_step(self, step: int, start: float, end: float, loss: SupportsFloat | None = None,
                    lr: SupportsFloat | None = None) -> None:
        """Record a step timed by the caller (``start``/``end`` are ``time.time()`` seconds)."""
        self._put((ROW_STEP, step, start, end, loss, lr))
        self._next_step = step + 1

    def collective(self, op: str) -> CollectiveSpan:
        return CollectiveSpan(self, op)

    def checkpoint(self, step: int | None = None) -> CheckpointSpan:
        """Time a checkpoint save; ``step`` defaults to the last completed step."""
        return CheckpointSpan(self, self._next_step - 1 if step is None else step)

    def resumed(self, step: int, *, checkpoint_step: int | None = None, checkpoint: str | None = None) -> None:
        """Record where training (re)starts: ``step`` = the last completed step, 0 for a fresh start.

        When the state was loaded from a checkpoint, say which: ``checkpoint`` (its path or id, 1-256 printable
        characters) and/or ``checkpoint_step`` (the step it was saved at; defaults to ``step`` when ``checkpoint``
        is given). The collector then knows that checkpoint existed even if the ``checkpoint_end`` of the
        process that wrote it was lost, and a ``checkpoint_step`` other than ``step`` (a lost step counter) is
        flagged by the resume check. Durable: on disk when this returns.
        """
        fields: dict[str, Any] = {"step": step}
        if checkpoint is not None:
            fields["checkpoint"] = str(checkpoint)[-MAX_CHECKPOINT_CHARS:]  # a long path keeps its end
            if checkpoint_step is None:
                checkpoint_step = step
        if checkpoint_step is not None:
            fields["checkpoint_step"] = checkpoint_step
        self._durable((ROW_EVENT, EventKind.RESUME, _time(), fields))
        self._next_step = step + 1

    def digest(self, step: int, value: str) -> None:
        """Record a digest of the training state after ``step`` (``value``: 1-128 printable characters, e.g.
        ``ingest_client.state_digest(model, optimizer)``). The collector compares the digests of a step computed
        before and after a restart (``GET /v1/runs/{id}/resume-check``). Computing the digest costs a pass over
        the state: call it every N steps, not every step. An invalid value is dropped on the flusher thread."""
        self._put((ROW_EVENT, EventKind.DIGEST, _time(), {"step": step, "value": value}))

    def should_checkpoint(self) -> bool:
        """True while a checkpoint request from the collector is pending (rank 0, or every rank with
        ``poll_all_ranks``); the next ``tracker.checkpoint()`` honours it. Never blocks."""
        poller = self._poller
        return poller is not None and poller.pending is not None

    def phase(self, name: str) -> PhaseSpan:
        """``with tracker.phase("eval"):`` around validation or evaluation between steps: the ledger books its time
        as ``eval``, apart from idle and from waste (docs/ledger.md). Durable at both ends (a process killed inside
        it still left its start); the phase's ``step`` is the last completed step. Known names: ``eval``,
        ``init_process_group`` (recorded by goodput itself, see :mod:`ingest_client.process_group`)."""
        return PhaseSpan(self, name)

    def collective_started(self, op: str) -> Emit:
        """Count a collective as started in the in-progress step; return ``emit(start, end)``, which records it.

        For code that times collectives itself and learns their end later, maybe on another thread (the DDP comm
        hook, :mod:`ingest_client.hooks`). Heartbeats report how many collectives of the in-progress step were
        started (live hang detection compares ranks by it); ``emit`` (``time.time()`` seconds, from any thread)
        records the collective with the step it started in.
        """
        step = self._next_step
        if self._coll_step != step:
            self._coll_step, self._coll_started = step, 0
        self._coll_started += 1
        put = self._put

        def emit(start: float, end: float) -> None:
            put((ROW_COLLECTIVE, step, op, start, end))

        return emit

    def record_collective(self, op: str, start: float, end: float, step: int | None = None) -> None:
        """Record a collective timed by the caller (``start``/``end`` are ``time.time()`` seconds); ``step``
        defaults to the in-progress step."""
        self._put((ROW_COLLECTIVE, self._next_step if step is None else step, op, start, end))

    def drain_on_flush(self, timer: IntervalTimer) -> None:
        """Make ``flush()`` and ``shutdown()`` first resolve what ``timer`` still holds (CUDA events the GPU has not
        run yet, :mod:`ingest_client.timing`), each waiting up to its ``timeout_s``."""
        self._timers_to_drain.append(timer)

    def ddp_comm_hook(self, op: str = "all_reduce") -> Callable[..., Any]:
        """A DDP comm hook (torch's default allreduce) that records one collective per bucket."""
        from ingest_client.hooks import build_ddp_comm_hook

        return build_ddp_comm_hook(self, op)

    # -- lifecycle -------------------------------------------------------------------------

    def end_attempt(self, reason: str | AttemptEndReason, detail: str | None = None) -> bool:
        """Emit ``attempt_end`` once per process; later calls do nothing and return False."""
        if not self.records_in_this_process:
            return False
        # Non-blocking: a SIGTERM handler may interrupt this very method on the same thread.
        if not self._end_lock.acquire(blocking=False):
            return False
        try:
            if self._ended:
                return False
            self._ended = True
        finally:
            self._end_lock.release()
        fields: dict[str, object] = {"reason": AttemptEndReason(reason).value}
        if detail:
            fields["detail"] = detail[:MAX_DETAIL_CHARS]
        self._durable((ROW_EVENT, EventKind.ATTEMPT_END, _time(), fields))
        return True

    def finish(self, status: str | RunStatus | None = None, timeout_s: float = 5.0) -> bool:
        """End the attempt as completed, report the run's end from rank 0, then shut down.

        Who ends the run: under ``goodput launch`` (``GOODPUT_LAUNCHED=1`` in the environment) the launcher
        reports ``run_end`` from torchrun's exit code, so ``finish()`` sends one only if ``status`` is given.
        Without the launcher nobody else will: ``finish()`` on rank 0 reports ``run_end`` with ``status``, or
        ``finished`` when no status is given (the script reached its end). Other ranks only end their attempt.
        """
        self.end_attempt(AttemptEndReason.COMPLETED)
        if status is None and os.environ.get(LAUNCHED_ENV) != "1":
            status = RunStatus.FINISHED
        if status is not None and self.context.rank == 0 and self.enabled:
            self._durable((ROW_EVENT, EventKind.RUN_END, _time(), {"status": RunStatus(status).value}))
        return self.shutdown(timeout_s)

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Send what was recorded so far; True if all of it was acknowledged (offline: spooled)."""
        if self._pipeline is None or os.getpid() != self._pid:
            return False
        self._drain_timers(timeout_s)
        return self._pipeline.flush(timeout_s)

    def shutdown(self, timeout_s: float = 5.0) -> bool:
        """Flush within ``timeout_s`` and stop; unsent events stay in the spool for replay."""
        if self._pipeline is None or os.getpid() != self._pid:
            return False
        self._force_stats = True  # the flush cycle appends a final client_stats after draining
        self._drain_timers(timeout_s)
        if self._poller is not None:
            self._poller.stop(0.0)
        ok = self._pipeline.shutdown(timeout_s)
        self._buffer.enabled = False
        return ok

    def stats(self) -> ClientStats | None:
        return None if self._pipeline is None else self._pipeline.stats()

    def _drain_timers(self, timeout_s: float) -> None:
        for timer in self._timers_to_drain:
            timer.drain(timeout_s)

    def defer_while_spooling(self, callback: Callable[[], None]) -> bool:
        """For a signal handler: True if this thread was interrupted inside a durable spool write, in which case
        ``callback`` runs as soon as that write has finished; False (nothing deferred) otherwise."""
        pipeline = self._pipeline
        return pipeline is not None and os.getpid() == self._pid and pipeline.defer_while_writing(callback)

    def _durable(self, row: tuple[Any, ...]) -> None:
        """Write a state-defining event (and what was recorded before it) to the spool before returning."""
        pipeline = self._pipeline
        if pipeline is None or os.getpid() != self._pid:
            self._put(row)  # disabled, or a forked child: the buffer drops it
            return
        pipeline.write_durable([row], sync=DURABLE_FSYNC)

    # -- flusher thread ----------------------------------------------------------------------

    def _tick(self, now: float) -> Rows:
        rows: Rows = []
        if now - self._last_heartbeat_s >= self.config.heartbeat_interval_s:
            self._last_heartbeat_s = now
            step = self._next_step
            rows.append((ROW_EVENT, EventKind.HEARTBEAT, now, {
                "step": step, "collectives": self._coll_started if self._coll_step == step else 0}))
        if self._force_stats:
            self._force_stats = False
            self._last_stats_s = now
            rows.append(self._stats_row(now))
        elif now - self._last_stats_s >= self.config.stats_interval_s:
            self._last_stats_s = now
            assert self._pipeline is not None
            stats = self._pipeline.stats()
            if self._last_stats != (stats.dropped_events, stats.spool_dropped_events, stats.send_failures,
                                    stats.rejected_events):
                rows.append(self._stats_row(now))
        return rows

    def _stats_row(self, now: float) -> tuple[Any, ...]:
        assert self._pipeline is not None
        stats = self._pipeline.stats()
        self._last_stats = (stats.dropped_events, stats.spool_dropped_events, stats.send_failures,
                            stats.rejected_events)
        return (ROW_EVENT, EventKind.CLIENT_STATS, now, {
            "dropped_events": stats.dropped_events,
            "spool_dropped_events": stats.spool_dropped_events,
            "send_failures": stats.send_failures,
            "rejected_events": stats.rejected_events,
        })

    def _after_fork_in_child(self) -> None:
        self._buffer.disable()
        self._poller = None  # its thread is not in the child
        if self._pipeline is not None:
            self._pipeline.after_fork_in_child()


def _transport(config: ClientConfig, sender: str) -> Transport:
    """To the collector; through the node relay when `goodput launch` runs one, falling back to the collector."""
    assert config.send_url is not None and config.events_url is not None
    direct = HttpTransport(config.events_url, token=config.token, timeout_s=config.http_timeout_s, sender=sender)
    if config.send_url == config.events_url:
        return direct
    relay = HttpTransport(config.send_url, token=config.token, timeout_s=config.http_timeout_s, sender=sender)
    return RelayedTransport(relay, direct, relay_url=config.send_url, direct_url=config.events_url)
