"""The per-process Tracker: the hot-path API used inside the training loop.

Every hot-path call (steps, collectives, digests) reads the clock, builds one small tuple and appends it to a
bounded deque (:class:`ingest_client.worker.buffer.RowBuffer`). No locks, no logging, no I/O, no formatting: the
``goodput-flusher`` thread does the rest (:mod:`ingest_client.worker.flusher`), every ``flush_interval_s``; a process
killed meanwhile loses what it recorded in its last interval.

The calls that define what state exists (``start``'s ``attempt_start``, ``resumed``, ``checkpoint`` start and end,
``end_attempt``, ``finish``'s ``run_end``) are durable: they are written and fsynced to the spool, with every row
recorded before them, before they return (:meth:`ingest_client.worker.flusher.Pipeline.write_durable`). They happen a
few times per attempt and cost a write and an fsync (``benchmarks/client_overhead.py``).
"""

from __future__ import annotations

import bisect
import collections
import logging
import os
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import Any, SupportsFloat

from ingest_client.common.config import ClientConfig, Mode
from ingest_client.common.events import (
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
from ingest_client.transport.base import Transport
from ingest_client.transport.http import HttpTransport
from ingest_client.transport.relayed import RelayedTransport
from ingest_client.worker.buffer import RowBuffer
from ingest_client.worker.context import RunContext
from ingest_client.worker.flusher import ClientStats, Pipeline, PipelineSettings, Rows
from ingest_client.worker.hooks import build_ddp_comm_hook
from ingest_client.worker.phases import PhaseSpan
from ingest_client.worker.poller import SignalPoller
from ingest_client.worker.timing import (
    CudaStepTimer,
    Emit,
    IntervalTimer,
    NcclCollectiveTimer,
    cuda_in_use,
    enqueued_collectives,
)

logger = logging.getLogger(__name__)

_time = time.time
_perf = time.perf_counter
# Durable events are fsynced too (measured on a 2-core VM: write 4 us, fsync 0.2 ms median and 10 ms p99; they come
# a few times per attempt and a checkpoint takes seconds), so a machine crash cannot lose the end of a checkpoint
# whose files the trainer fsynced.
DURABLE_FSYNC = True
LAUNCHED_ENV = "GOODPUT_LAUNCHED"  # "1" in processes started by `goodput launch` (ingest_client/launcher/launch.py)
_UNDECIDED: Any = object()  # the step clock before the first step (Tracker._step_timer)
STEP_LOG_LENGTH = 8192  # host step boundaries kept to place NCCL's collectives in their steps
NCCL_PROBE_STEPS = 20  # steps watched before NCCL's timers are switched on: their cost, against the step's


class StepSpan:
    """``with tracker.step(n) as s:`` times one optimizer step; set ``s.loss`` / ``s.lr`` inside.

    Pass plain floats: a tensor works but is converted with ``float()`` on the flusher thread. A step that raises is
    not recorded. On a CUDA job the step is its interval on the GPU's timeline (``Tracker.step_clock``): from when
    the GPU finished the work queued before it to when it has run the work queued inside it.
    """

    __slots__ = ("_tracker", "step", "loss", "lr", "_start", "_p0", "_token")

    def __init__(self, tracker: Tracker, step: int) -> None:
        self._tracker = tracker
        self.step = step
        self.loss: SupportsFloat | None = None
        self.lr: SupportsFloat | None = None

    def __enter__(self) -> StepSpan:
        tracker = self._tracker
        tracker._next_step = self.step
        timer = tracker._step_timer
        if timer is _UNDECIDED:
            timer = tracker._choose_step_clock()
        if tracker._nccl_go:
            tracker._install_nccl()  # once, between two steps
        log = tracker._step_log
        if log is not None:
            log.append((_time(), self.step))
        if timer is None:
            self._start = _time()
            self._p0 = _perf()
        else:
            self._token = timer.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        p1 = _perf()
        tracker = self._tracker
        timer = tracker._step_timer
        if exc_type is None:
            if timer is None:
                start = self._start
                tracker._put((ROW_STEP, self.step, start, start + (p1 - self._p0), self.loss, self.lr))
            else:
                timer.stop(self._token, tracker._emit_step, self.step, self.loss, self.lr)
            tracker._next_step = self.step + 1
            log = tracker._step_log
            if log is not None:
                log.append((_time(), self.step + 1))
        elif timer is not None:
            timer.discard(self._token)


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

    On a CUDA job (steps timed on the GPU) it first waits until the GPU has run the work queued before it, as the
    save itself would (``torch.save`` or a checkpoint's staging copies the tensors off the GPU): the checkpoint
    blocks from that moment to the end of the save, and the steps before it are recorded (and on disk) before
    ``checkpoint_start`` is.

    When a checkpoint request is pending (``tracker.should_checkpoint()``), both events carry its id as
    ``request_id`` and the request counts as honoured: ``should_checkpoint()`` turns false again.
    """

    __slots__ = ("_tracker", "_step", "request_id")

    def __init__(self, tracker: Tracker, step: int) -> None:
        self._tracker = tracker
        self._step = step
        self.request_id: int | None = None

    def __enter__(self) -> CheckpointSpan:
        self._tracker._wait_for_device()  # the checkpoint blocks from when the GPU has run the steps before it
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
        # The last heartbeat, or the last tick that saw a step end: a rank is heard from at least every heartbeat
        # interval, by its step records while it steps, by heartbeats while it does not (see _tick).
        self._last_heard_s = 0.0
        self._heard_step = 1  # _next_step as the last tick saw it
        self._last_stats_s = 0.0
        self._last_stats: tuple[int, ...] = (0, 0, 0, 0, 0)
        self._force_stats = False
        self._pipeline: Pipeline | None = None
        self._poller: SignalPoller | None = None
        self._coll_step = 0  # the step whose collectives _coll_started counts (see collective_started)
        self._coll_started = 0
        self._timers_to_drain: list[IntervalTimer | NcclCollectiveTimer] = []
        # The step clock, chosen at the first step (config.step_clock): None = the host's clocks, else a timer.
        self._step_timer: IntervalTimer | None = None if config.step_clock == "cpu" else _UNDECIDED
        self._collective_clock: str | None = None  # "cpu", "cuda" (comm hook) or "nccl", once collectives are timed
        self._nccl: NcclCollectiveTimer | None = None
        # NCCL's timers asked for, not on yet: (group, its timing methods), the steps watched so far, and the flag
        # that the next step's entry switches them on (time_collectives, _probe_nccl).
        self._nccl_found: tuple[Any, Any] | None = None
        self._nccl_probe: tuple[float, int, int] | None = None
        self._nccl_go = False
        self._nccl_max_overhead = 0.01
        self._nccl_device: int | None = None
        self._nccl_done_in_step: dict[int, int] = {}  # NCCL's collectives completed per step (the latest few)
        self._nccl_last_seq: int | None = None
        # (host time, step in progress from then on): the step boundaries that place NCCL's collectives in their
        # steps; kept only while NCCL times them.
        self._step_log: collections.deque[tuple[float, int]] | None = None
        if config.mode is Mode.DISABLED:
            buffer = RowBuffer(64, 64)
            buffer.enabled = False
        else:
            if config.mode is Mode.OFFLINE:
                transport = None
            elif transport is None:
                transport = _transport(config, self.proc_id)
            builder = RecordBuilder(
                RecordContext(run_id=context.run_id, attempt=context.attempt, rank=context.rank,
                              launch=context.launch), self.proc_id
            )
            settings = PipelineSettings.from_config(
                config, context.run_id, self.proc_id,
                {"pid": context.pid, "host": context.host, "run_id": context.run_id, "rank": context.rank,
                 "attempt": context.attempt},
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
    def step_clock(self) -> str | None:
        """Which clock times steps: ``"cpu"`` (the host's), ``"cuda"`` (CUDA events: the GPU's timeline), or None
        before the first step (``config.step_clock="auto"`` chooses CUDA events when the process uses CUDA)."""
        timer = self._step_timer
        if timer is _UNDECIDED:
            return None
        return "cpu" if timer is None else timer.kind

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
        self._last_heard_s = self._last_stats_s = _time()
        self._pipeline.start()
        if self._poller is not None:
            self._poller.start()
        return self

    def _choose_step_clock(self) -> IntervalTimer | None:
        """At the first step: CUDA events when the process uses CUDA (or ``step_clock="cuda"``), else host clocks."""
        timer: IntervalTimer | None = None
        wanted = self.config.step_clock
        if wanted == "cuda" or (wanted == "auto" and cuda_in_use()):
            try:
                timer = CudaStepTimer()
            except Exception as exc:
                logger.warning("goodput: steps are timed with the host's clocks: CUDA events are not available "
                               "here (%s)", exc)
        self._step_timer = timer
        if timer is not None:
            self._timers_to_drain.append(timer)
        self._force_stats = True  # the next client_stats says which clock timed the steps
        return timer

    def _emit_step(self, start: float, end: float, step: int, loss: SupportsFloat | None,
                   lr: SupportsFloat | None) -> None:
        self._put((ROW_STEP, step, start, end, loss, lr))

    def _wait_for_device(self) -> None:
        """Until the GPU has run the work queued so far, then record the steps it completed (CUDA step clock)."""
        timer = self._step_timer
        if timer is None or timer is _UNDECIDED:
            return
        timer.wait_for_device()
        timer.resolve_ready()

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

    def resumed(self, step: int, *, checkpoint_step: int | None = None, checkpoint: str | None = None,
                digest: str | None = None) -> None:
        """Record where training (re)starts: ``step`` = the last completed step, 0 for a fresh start.

        When the state was loaded from a checkpoint, say which: ``checkpoint`` (its path or id, 1-256 printable
        characters) and/or ``checkpoint_step`` (the step it was saved at; defaults to ``step`` when ``checkpoint``
        is given). The collector then knows that checkpoint existed even if the ``checkpoint_end`` of the
        process that wrote it was lost, and a ``checkpoint_step`` other than ``step`` (a lost step counter) is
        flagged by the resume check.

        ``digest``: the digest of the state just loaded (1-128 printable characters), made as the writer made
        the ``tracker.digest`` of that step when it saved it: the same function over the same state (e.g.
        ``ingest_client.state_digest(model, optimizer, {"step": step, ...})``). The resume check compares the
        two, so a resume is checked the moment it loads, whatever else arrives. An invalid value is dropped on
        the flusher thread (the resume still counts). Durable: on disk when this returns.
        """
        fields: dict[str, Any] = {"step": step}
        if digest is not None:
            fields["digest"] = digest
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
        ``init_process_group`` (recorded by goodput itself, see :mod:`ingest_client.worker.process_group`)."""
        return PhaseSpan(self, name)

    def collective_started(self, op: str) -> Emit:
        """Count a collective as started in the in-progress step; return ``emit(start, end)``, which records it.

        For code that times collectives itself and learns their end later, maybe on another thread (the DDP comm
        hook, :mod:`ingest_client.worker.hooks`). Heartbeats report how many collectives of the in-progress step were
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
        run yet, :mod:`ingest_client.worker.timing`), each waiting up to its ``timeout_s``."""
        self._timers_to_drain.append(timer)

    def ddp_comm_hook(self, op: str = "all_reduce") -> Callable[..., Any]:
        """A DDP comm hook (torch's default allreduce) that records one collective per bucket.

        A Python comm hook runs once per bucket on the gradient path: on NCCL prefer :meth:`time_collectives`,
        which costs nothing there."""
        return build_ddp_comm_hook(self, op)

    def time_collectives(self, model: Any = None, *, process_group: Any = None, op: str = "all_reduce",
                         max_overhead: float | None = 0.01) -> str:
        """Time this rank's collectives (per-rank collective time: the straggler accounting) the cheapest way there is.

        - NCCL: ProcessGroupNCCL's own timers (CUDA events in C++) report every collective of ``process_group``
          (None: the default group) to a completion hook off the training thread: DDP, FSDP and your own
          collectives alike, with no Python on the gradient path. They cost a timed CUDA event or two per
          collective (~15 us on an H200 VM): the tracker watches the first 20 steps and switches them on, between
          two steps, only if that is at most ``max_overhead`` of a step (a launch-bound loop of 40 small buckets in
          8 ms steps would pay 7.5 %); else collectives stay untimed, with a warning. ``max_overhead=None``: on at
          once, whatever the cost (call it before training: it waits for the group's collectives in flight).
        - Otherwise (gloo), with a DDP ``model``: registers :meth:`ddp_comm_hook` on it (``op`` names its rows).

        Returns ``"nccl"``, ``"hook"`` (the comm hook: CPU clocks or CUDA events per bucket), or ``"off"`` (nothing
        to time with: a warning says why). ``client_stats`` says which clock timed them (``collective_clock``).
        """
        if self._nccl is not None or self._nccl_found is not None:
            return "nccl"
        found = NcclCollectiveTimer.find(process_group)
        if found is not None:
            self._nccl_found = found
            if max_overhead is None:
                self._install_nccl()
            else:
                self._nccl_max_overhead = max_overhead
                self._nccl_device = _current_cuda_device()
            return "nccl"
        if model is not None and hasattr(model, "register_comm_hook"):
            model.register_comm_hook(process_group, self.ddp_comm_hook(op))
            self._collective_clock = "hook"  # the hook names its clock at the first bucket
            return "hook"
        logger.warning("goodput: collectives are not timed: the process group has no NCCL backend that reports "
                       "completed collectives, and no DDP model was given for a comm hook; pass the DDP model: "
                       "tracker.time_collectives(model)")
        return "off"

    def _install_nccl(self) -> None:
        """NCCL's timers on (training thread, between steps; NcclCollectiveTimer.install waits once)."""
        found, self._nccl_found, self._nccl_go = self._nccl_found, None, False
        nccl = NcclCollectiveTimer.install(found) if found is not None else None
        if nccl is None:
            return
        self._nccl = nccl
        self._step_log = collections.deque(maxlen=STEP_LOG_LENGTH)
        self._timers_to_drain.append(nccl)
        self.note_collective_clock("nccl")

    def _probe_nccl(self, now: float) -> None:
        """Flusher thread: after NCCL_PROBE_STEPS steps, what NCCL's timers would cost a step here; below
        ``max_overhead`` the next step's entry switches them on."""
        found = self._nccl_found
        if found is None or self._nccl_go:
            return
        seq, step = enqueued_collectives(found[0]), self._next_step
        if seq is None:  # nothing to estimate with: torch does not count the group's collectives
            self._nccl_go = True
            return
        if self._nccl_probe is None:
            self._nccl_probe = (now, seq, step)
            return
        since, seq0, step0 = self._nccl_probe
        steps = step - step0
        if steps < NCCL_PROBE_STEPS:
            return
        per_step, step_s = (seq - seq0) / steps, (now - since) / steps
        try:
            cost_s = per_step * _on_device(self._nccl_device, NcclCollectiveTimer.timing_cost_s)
        except Exception as exc:  # CUDA refused a few event records: the cost is unknown, the timers go on
            logger.debug("goodput: NCCL's timing cost not measured: %s", exc)
            cost_s = 0.0
        if step_s > 0 and cost_s <= self._nccl_max_overhead * step_s:
            self._nccl_go = True
            return
        self._nccl_found = None
        self.note_collective_clock("off")
        logger.warning("goodput: collectives are not timed: NCCL's timers would cost %.1f%% of this job's steps "
                       "(%.0f collectives a step of %.1f ms, about %.0f us each); the client keeps its cost under "
                       "%.1f%%. tracker.time_collectives(model, max_overhead=None) times them anyway.",
                       100.0 * cost_s / step_s, per_step, 1000.0 * step_s, 1e6 * cost_s / max(per_step, 1.0),
                       100.0 * self._nccl_max_overhead)

    def note_collective_clock(self, kind: str) -> None:
        """Record which clock times collectives (said in the next ``client_stats``)."""
        self._collective_clock = kind
        self._force_stats = True

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
        for timer in self._timers_to_drain:  # what the GPU has finished, without waiting (a failing job)
            timer.resolve_ready()
        self._durable((ROW_EVENT, EventKind.ATTEMPT_END, _time(), fields))
        return True

    def finish(self, status: str | RunStatus | None = None, timeout_s: float = 5.0) -> bool:
        """End the attempt as completed, report the run's end from rank 0, then shut down.

        Who ends the run: under ``goodput launch`` (``GOODPUT_LAUNCHED=1`` in the environment) the launcher
        reports ``run_end`` from torchrun's exit code, so ``finish()`` sends one only if ``status`` is given.
        Without the launcher nobody else will: ``finish()`` on rank 0 reports ``run_end`` with ``status``, or
        ``finished`` when no status is given (the script reached its end). Other ranks only end their attempt.
        """
        if self.records_in_this_process:
            self._drain_timers(timeout_s)  # the last steps' GPU times, recorded before the attempt's end
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
        if self._nccl_found is not None:
            self._probe_nccl(now)
        rows: Rows = self._nccl_rows() if self._nccl is not None else []
        # No heartbeat while steps end: the step records say the rank lives, and a fleet at a step a second sent one
        # heartbeat per five step rows, half its records and half the collector's rows, for nothing. Once steps stop
        # (a hang, a long evaluation, a stuck collective), heartbeats follow an interval after the last step end seen.
        step = self._next_step
        if step != self._heard_step:
            self._heard_step = step
            self._last_heard_s = now
        elif now - self._last_heard_s >= self.config.heartbeat_interval_s:
            self._last_heard_s = now
            fields: dict[str, int] = {"step": step}
            started = self._collectives_started_in(step)
            if started is not None:
                fields["collectives"] = started
            rows.append((ROW_EVENT, EventKind.HEARTBEAT, now, fields))
        if self._force_stats:
            self._force_stats = False
            self._last_stats_s = now
            rows.append(self._stats_row(now))
        elif now - self._last_stats_s >= self.config.stats_interval_s:
            self._last_stats_s = now
            assert self._pipeline is not None
            stats = self._pipeline.stats()
            if self._last_stats != (stats.dropped_events, stats.spool_dropped_events, stats.send_failures,
                                    stats.rejected_events, stats.unspooled_events):
                rows.append(self._stats_row(now))
        return rows

    def _collectives_started_in(self, step: int) -> int | None:
        """Collectives this rank started in the step in progress: counted by the comm hook, or, on NCCL, those
        completed in it plus those issued after the last completed one (None when torch does not number them)."""
        if self._nccl is None:
            return self._coll_started if self._coll_step == step else 0
        now, last = self._nccl.enqueued(), self._nccl_last_seq
        if now is None or last is None:
            return None
        return self._nccl_done_in_step.get(step, 0) + max(0, now - last)

    def _nccl_rows(self) -> Rows:
        """NCCL's completed collectives as rows, each in the step that was in progress when the host enqueued it."""
        assert self._nccl is not None and self._step_log is not None
        done = self._nccl.take()
        if not done:
            return []
        log = list(self._step_log)
        times = [entry[0] for entry in log]
        counts = self._nccl_done_in_step
        rows: Rows = []
        for op, start, duration, seq in done:
            i = bisect.bisect_right(times, start) - 1
            step = log[i][1] if i >= 0 else (log[0][1] if log else self._next_step)
            rows.append((ROW_COLLECTIVE, step, op, start, start + duration))
            counts[step] = counts.get(step, 0) + 1
            if seq is not None:
                self._nccl_last_seq = max(seq, self._nccl_last_seq or 0)
        for old in sorted(counts)[:-4]:  # the step in progress and a few before it
            del counts[old]
        return rows

    def _stats_row(self, now: float) -> tuple[Any, ...]:
        assert self._pipeline is not None
        stats = self._pipeline.stats()
        self._last_stats = (stats.dropped_events, stats.spool_dropped_events, stats.send_failures,
                            stats.rejected_events, stats.unspooled_events)
        fields: dict[str, object] = {
            "dropped_events": stats.dropped_events,
            "spool_dropped_events": stats.spool_dropped_events,
            "send_failures": stats.send_failures,
            "rejected_events": stats.rejected_events,
        }
        if stats.unspooled_events:  # only then: a collector older than the field refuses it
            fields["unspooled_events"] = stats.unspooled_events
        if self.step_clock is not None:
            fields["step_clock"] = self.step_clock
        if self._collective_clock in ("cpu", "cuda", "nccl", "off"):
            fields["collective_clock"] = self._collective_clock
        return (ROW_EVENT, EventKind.CLIENT_STATS, now, fields)

    def _after_fork_in_child(self) -> None:
        self._buffer.disable()
        self._poller = None  # its thread is not in the child
        if self._pipeline is not None:
            self._pipeline.after_fork_in_child()


def _on_device(device: int | None, measure: Callable[[], float]) -> float:
    """``measure()`` with ``device`` current on this thread (a flusher thread's default would be GPU 0)."""
    if device is None:
        return measure()
    import torch

    with torch.cuda.device(device):
        return measure()


def _current_cuda_device() -> int | None:
    try:
        import torch

        return int(torch.cuda.current_device())
    except Exception:
        return None


def _transport(config: ClientConfig, sender: str) -> Transport:
    """To the collector; through the node relay when `goodput launch` runs one, falling back to the collector."""
    assert config.send_url is not None and config.events_url is not None
    direct = HttpTransport(config.events_url, token=config.token, timeout_s=config.http_timeout_s, sender=sender)
    if config.send_url == config.events_url:
        return direct
    relay = HttpTransport(config.send_url, token=config.token, timeout_s=config.http_timeout_s, sender=sender)
    return RelayedTransport(relay, direct, relay_url=config.send_url, direct_url=config.events_url)
