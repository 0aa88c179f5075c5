"""Clocks for steps and collectives: CPU clocks, CUDA events, or NCCL's own collective timers.

The one place with CUDA and NCCL specifics (torch is imported only by the CUDA and NCCL classes).

Why not always the CPU clock: a CUDA job's host runs ahead of its GPU. With no read-back inside the step (a
``torch.compile``d loop, CUDA graphs, a loop that logs every N steps) the host enters step 101 while step 40 is
still on the GPU, and a later ``torch.save`` waits for the 60 queued steps; host clocks then book that compute as
checkpoint blocking (+38 % checkpoint, -23 % productive, measured on an H200). And a DDP comm hook sees an NCCL
collective end when its CUDA future completes, which is as soon as later kernels can be *ordered* after it, before
it has run (pytorch/pytorch#48305): a CPU clock reads it as nearly free and a slow rank's wait disappears.

Intervals (``IntervalTimer``: ``start()`` and ``stop()`` are on the hot path and never block):

- ``CpuTimer``: start = ``time.time()`` and ``perf_counter()`` at ``start()``, end = start + the ``perf_counter()``
  interval at ``stop()``; reported at once.
- ``CudaTimer``: ``start()`` and ``stop()`` each record a CUDA event on the current stream, so the interval is the
  stream's: it starts when the GPU has finished the work queued before it and ends when the GPU has run the work
  queued inside it. Nothing waits: a resolver thread (``goodput-cuda-timer``) polls ``event.query()`` and, once
  both events are complete, turns them into wall-clock times through an anchor, an event recorded on an idle
  private stream at a known ``time.time()`` (re-anchored every ``ANCHOR_EVERY_S``): wall = anchor wall +
  ``anchor.elapsed_time(event)``. Events come from a pool. ``drain()`` resolves what is left (``Tracker.flush``
  and ``shutdown`` call it); ``wait_for_device()`` waits until the GPU has run the work queued so far (a
  checkpoint's start: the save would wait for it anyway).

Collectives on NCCL (``NcclCollectiveTimer``): ProcessGroupNCCL times every collective itself, in C++, with CUDA
events when collective timing is on (``TORCH_NCCL_ENABLE_TIMING=1`` or ``_enable_collectives_timing()``), and hands
each completed one (its kind, host enqueue time and active GPU duration) to a completion hook on its own thread.
The hook only appends to a deque; the flusher takes them. No Python runs on the gradient path, where any Python
comm hook costs a launch-bound DDP loop x1.6 or more.

Both interval timers report through the ``emit(start_s, end_s, *payload)`` callback given to ``stop``, on the
thread that resolved them. Internal failures are counted, never raised.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

logger = logging.getLogger(__name__)

Emit = Callable[..., None]  # emit(start_s, end_s, *payload): wall-clock seconds since the epoch

ANCHOR_EVERY_S = 60.0  # re-anchor CUDA event times to time.time() this often (GPU and CPU clocks drift apart)
POLL_INTERVAL_S = 0.01  # the resolver's poll while events are pending
IDLE_WAIT_S = 1.0  # the resolver's sleep when nothing is pending (a stop() wakes it sooner)
MAX_NCCL_COMPLETIONS = 1 << 16  # completed collectives held between two flusher ticks
PREFILLED_EVENTS = 64  # CUDA events created with a timer (cudaEventCreate is the slow part of a first record)

_time = time.time
_perf = time.perf_counter


class IntervalTimer(Protocol):
    """Times intervals; ``start()`` and ``stop()`` are on the hot path and never block."""

    kind: str  # "cpu" or "cuda"

    def start(self) -> Any: ...  # Any: a token opaque to the caller, handed back to stop() or discard()

    def stop(self, token: Any, emit: Emit, *payload: Any) -> None: ...

    def discard(self, token: Any) -> None: ...  # the interval is not wanted (a step that raised)

    def resolve_ready(self) -> bool: ...  # emit what has completed, without waiting; True when nothing is left

    def drain(self, timeout_s: float) -> bool: ...  # True when nothing is left pending

    def wait_for_device(self) -> None: ...  # until the device has run the work queued so far


class CpuTimer:
    """The host's clocks: ``time.time()`` for the start, ``perf_counter()`` for the duration."""

    kind = "cpu"

    def start(self) -> tuple[float, float]:
        return _time(), _perf()

    def stop(self, token: tuple[float, float], emit: Emit, *payload: Any) -> None:
        start, p0 = token
        emit(start, start + (_perf() - p0), *payload)

    def discard(self, token: tuple[float, float]) -> None:
        pass

    def resolve_ready(self) -> bool:
        return True

    def drain(self, timeout_s: float) -> bool:
        return True

    def wait_for_device(self) -> None:
        pass


class CudaDevice:
    """The torch.cuda calls a ``CudaTimer`` makes, on one device. Tests stand in a simulated GPU."""

    def __init__(self, device: Any = None) -> None:  # Any: a torch.device, an index or None (current device)
        import torch

        self._torch = torch
        index = torch.device(device).index if device is not None else None
        self.device = torch.device("cuda", torch.cuda.current_device() if index is None else index)
        self._index = self.device.index
        self._anchor_stream = torch.cuda.Stream(device=self.device)  # idle: its events run when recorded
        # The current stream, looked up by its raw handle (one C call) and cached: torch.cuda.current_stream()
        # builds a Stream object each time.
        self._raw_stream: Callable[[int], int] | None = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        self._stream: Any = None
        self._stream_handle = -1
        # torch.cuda.Event.record(stream) without its Python frame: the C method it calls.
        self._record: Callable[[Any, Any], None] = getattr(torch._C._CudaEventBase, "record",
                                                           lambda event, stream: event.record(stream))

    def new_event(self) -> Any:
        return self._torch.cuda.Event(enable_timing=True)

    def record(self, event: Any) -> None:
        """Record ``event`` on this device's current stream (the one the caller's work is queued on)."""
        raw = self._raw_stream
        if raw is None:
            event.record()
            return
        handle = raw(self._index)
        if handle != self._stream_handle:
            self._stream = self._torch.cuda.current_stream(self.device)
            self._stream_handle = handle
        self._record(event, self._stream)

    def record_anchor(self, event: Any) -> None:
        event.record(self._anchor_stream)

    def synchronize(self, event: Any) -> None:
        event.synchronize()

    def bind_thread(self) -> None:
        """Make this device current on the calling (resolver) thread."""
        self._torch.cuda.set_device(self.device)


class CudaTimer:
    """CUDA events on the current stream at ``start()`` / ``stop()``, resolved off the hot path."""

    kind = "cuda"

    def __init__(self, device: Any = None, *, cuda: CudaDevice | Any = None) -> None:
        self._cuda = cuda if cuda is not None else CudaDevice(device)
        self._anchor: tuple[Any, float] = self._new_anchor()
        self._pending: collections.deque[tuple[tuple[Any, float], Any, Any, Emit, tuple[Any, ...]]] = (
            collections.deque())
        self._free: list[Any] = []
        for _ in range(PREFILLED_EVENTS):  # created now, off the hot path: a first record creates the event
            event = self._cuda.new_event()
            self._cuda.record_anchor(event)
            self._free.append(event)
        self._lock = threading.Lock()  # the resolver thread and drain() both resolve
        self._wake = threading.Event()
        self._idle = True  # the resolver sleeps (or has not started): a stop() wakes it
        self._thread: threading.Thread | None = None
        self.resolved = 0
        self.failed = 0

    def _new_anchor(self) -> tuple[Any, float]:
        event = self._cuda.new_event()
        before = _time()
        self._cuda.record_anchor(event)
        after = _time()
        return event, (before + after) / 2.0

    def _event(self) -> Any:
        try:
            return self._free.pop()
        except IndexError:
            return self._cuda.new_event()

    def start(self) -> tuple[Any, tuple[Any, float]]:
        event = self._event()
        self._cuda.record(event)
        return event, self._anchor  # the anchor current now; re-anchoring later does not move this interval

    def stop(self, token: tuple[Any, tuple[Any, float]], emit: Emit, *payload: Any) -> None:
        end = self._event()
        self._cuda.record(end)  # in a CUDA future's callback: a stream that waits on the collective's kernels
        start, anchor = token
        self._pending.append((anchor, start, end, emit, payload))  # deque append: thread-safe, no lock
        if self._idle:
            self._idle = False
            if self._thread is None:
                self._start_resolver()
            self._wake.set()

    def discard(self, token: tuple[Any, tuple[Any, float]]) -> None:
        self._free.append(token[0])

    def wait_for_device(self) -> None:
        event = self._event()
        self._cuda.record(event)
        try:
            self._cuda.synchronize(event)
        except Exception as exc:  # a device error: the caller's own CUDA calls will report it
            logger.warning("goodput: cannot wait for the GPU: %s", exc)
        self._free.append(event)

    def _start_resolver(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="goodput-cuda-timer", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        try:
            self._cuda.bind_thread()
        except Exception as exc:
            logger.warning("goodput: the CUDA timer cannot use its device (%s); intervals resolve at flush", exc)
            return
        last_anchor = _perf()
        while True:
            self._wake.wait(IDLE_WAIT_S)
            self._wake.clear()
            while self._pending:
                if not self.resolve_ready():
                    time.sleep(POLL_INTERVAL_S)
            self._idle = True
            if self._pending:  # a stop() between the loop's last look and the flag: no wake-up was sent
                self._idle = False
                self._wake.set()
            if _perf() - last_anchor >= ANCHOR_EVERY_S:
                self._anchor, last_anchor = self._new_anchor(), _perf()

    def resolve_ready(self) -> bool:
        """Emit every interval at the head of the queue whose events have completed; False if the head has not.
        Never raises: a device error drops what is pending (counted in ``failed``)."""
        with self._lock:
            try:
                while self._pending:
                    anchor, start, end, emit, payload = self._pending[0]
                    if not end.query():
                        return False
                    self._pending.popleft()
                    self._emit(anchor, start, end, emit, payload)
            except Exception as exc:  # query() after a device error
                self.failed += len(self._pending)
                self._pending.clear()
                logger.warning("goodput: CUDA intervals could not be resolved (dropped): %s", exc)
            return True

    def _emit(self, anchor: tuple[Any, float], start: Any, end: Any, emit: Emit, payload: tuple[Any, ...]) -> None:
        try:
            start_s, end_s = self._interval(anchor, start, end)
            emit(start_s, max(start_s, end_s), *payload)
            self.resolved += 1
        except Exception as exc:  # an event that was never recorded, a device error: count, never raise
            self.failed += 1
            logger.warning("goodput: a CUDA interval could not be resolved: %s", exc)
        self._release(start, end)

    def _interval(self, anchor: tuple[Any, float], start: Any, end: Any) -> tuple[float, float]:
        anchor_event, anchor_wall = anchor
        return (anchor_wall + anchor_event.elapsed_time(start) / 1000.0,
                anchor_wall + anchor_event.elapsed_time(end) / 1000.0)

    def _release(self, start: Any, end: Any) -> None:
        self._free.extend((start, end))

    def drain(self, timeout_s: float) -> bool:
        """Resolve what is pending, waiting up to ``timeout_s`` for the GPU to complete it."""
        deadline = _perf() + timeout_s
        while not self.resolve_ready():
            if _perf() >= deadline:
                return False
            time.sleep(min(POLL_INTERVAL_S, max(0.0, deadline - _perf())))
        return True


class CudaStepTimer(CudaTimer):
    """Steps on the GPU's timeline with one CUDA event a step, recorded at its end.

    Steps follow one another on the stream, so a step begins where the GPU finished the work queued before it:
    the previous step's end, or, when the GPU was idle (it had run everything before the host entered the step),
    the host's ``time.time()`` at entry. One event a step instead of two halves the hot path's driver calls.
    Work the host queues between two steps outside any span (an evaluation that never reads back) is counted in
    the next step; a checkpoint waits for the GPU as it starts (``wait_for_device``), so the steps after it begin
    at their entry.
    """

    def __init__(self, device: Any = None, *, cuda: CudaDevice | Any = None) -> None:
        super().__init__(device, cuda=cuda)
        self._previous_end = 0.0  # wall time at which the GPU finished the previous step (resolver thread)

    def start(self) -> tuple[float, tuple[Any, float]]:  # a host time, not an event
        return _time(), self._anchor

    def discard(self, token: Any) -> None:
        pass

    def _interval(self, anchor: tuple[Any, float], start: Any, end: Any) -> tuple[float, float]:
        anchor_event, anchor_wall = anchor
        end_s = anchor_wall + anchor_event.elapsed_time(end) / 1000.0
        start_s = max(float(start), self._previous_end)
        self._previous_end = end_s
        return start_s, end_s

    def _release(self, start: Any, end: Any) -> None:
        self._free.append(end)


def timer_for(tensor: Any, clock: str = "auto") -> IntervalTimer:
    """``CudaTimer`` for a CUDA tensor (``clock="auto"`` or ``"cuda"``), else ``CpuTimer``."""
    if clock not in ("auto", "cpu", "cuda"):
        raise ValueError(f"clock must be 'auto', 'cpu' or 'cuda', got {clock!r}")
    if clock == "cpu" or (clock == "auto" and not getattr(tensor, "is_cuda", False)):
        return CpuTimer()
    return CudaTimer(tensor.device if getattr(tensor, "is_cuda", False) else None)


def cuda_in_use() -> bool:
    """True when this process has initialised CUDA (its model or data are on a GPU): steps are then timed with
    CUDA events. Never imports torch: a process that has not imported it does not use CUDA through it."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_available() and torch.cuda.is_initialized())
    except Exception:
        return False


# -- NCCL ------------------------------------------------------------------------------------------------------

_OP_NAMES = {
    "ALLREDUCE": "all_reduce", "ALLREDUCE_COALESCED": "all_reduce", "ALLGATHER": "all_gather",
    "_ALLGATHER_BASE": "all_gather", "ALLGATHER_COALESCED": "all_gather", "REDUCE_SCATTER": "reduce_scatter",
    "_REDUCE_SCATTER_BASE": "reduce_scatter", "REDUCE_SCATTER_TENSOR_COALESCED": "reduce_scatter",
    "BROADCAST": "broadcast", "REDUCE": "reduce", "ALLTOALL": "all_to_all", "ALLTOALL_BASE": "all_to_all",
    "GATHER": "gather", "SCATTER": "scatter", "SEND": "send", "RECV": "recv", "BARRIER": "barrier",
}

_NCCL_METHODS = ("_register_on_completion_hook", "_enable_collectives_timing", "_wait_for_pending_works")
# One timer per process group (ProcessGroupNCCL accepts a single completion hook), by id: the timer holds the group.
_NCCL_TIMERS: dict[int, NcclCollectiveTimer] = {}


def _op_name(op_type: Any) -> str:
    name = str(getattr(op_type, "name", op_type)).rsplit(".", 1)[-1].upper()
    return _OP_NAMES.get(name, name.lower()[:64] or "collective")


class NcclCollectiveTimer:
    """Every collective of one NCCL process group, timed by ProcessGroupNCCL in C++ (module docstring).

    ``find(group)`` looks for a group whose NCCL backend can report completions (no side effect); ``install(found)``
    switches its timers on and registers the hook. ``take()`` returns ``(op, start_s, duration_s, seq)`` per
    collective completed since the last call: ``start_s`` is when the host enqueued it (``time.time()`` clock),
    ``duration_s`` its active time on the GPU, from its start to its end event, which includes waiting for the
    slowest rank to join; ``seq`` the group's number for it (None where torch does not say). ``enqueued()`` is the
    group's count of collectives issued so far.
    """

    kind = "nccl"

    def __init__(self, nccl: Any, group: Any) -> None:
        self._done: collections.deque[Any] = collections.deque(maxlen=MAX_NCCL_COMPLETIONS)
        self._nccl = nccl
        self._group = group
        self.failed = 0
        # The hook runs on ProcessGroupNCCL's hook thread, where an exception would abort the communicators: a
        # bounded deque's append, which cannot raise and runs no Python frame.
        nccl._register_on_completion_hook(self._done.append)

    @staticmethod
    def find(group: Any = None) -> tuple[Any, Any] | None:
        """``(group, its object with the NCCL timing methods)`` for ``group`` (None: the default group), or None
        where the group has no NCCL backend that reports completions (gloo, an old torch)."""
        try:
            import torch
            import torch.distributed as dist

            if not (dist.is_available() and dist.is_initialized() and dist.is_nccl_available()):
                return None
            pg: Any = group if group is not None else dist.distributed_c10d._get_default_group()
            backend: Any = pg._get_backend(torch.device("cuda"))
        except Exception:  # no CUDA backend in this group
            return None
        if type(backend).__name__ != "ProcessGroupNCCL":
            return None
        # The backend's own methods where torch binds them there, else the group's, which forward to it.
        nccl = next((obj for obj in (backend, pg) if all(hasattr(obj, name) for name in _NCCL_METHODS)), None)
        return None if nccl is None else (pg, nccl)

    @classmethod
    def install(cls, found: tuple[Any, Any]) -> NcclCollectiveTimer | None:
        """Timers on and the hook registered, once per group; blocks until the group's collectives in flight have
        completed (call it between steps). None, with a warning, where torch refuses."""
        pg, nccl = found
        timer = _NCCL_TIMERS.get(id(pg))
        if timer is not None:
            return timer
        try:
            # Collectives issued before timing was on carry no start event: their duration would raise in the
            # hook thread, which aborts the communicators. So: timing on, then the group's earlier collectives
            # retired (one wait), then the hook.
            nccl._enable_collectives_timing()
            nccl._wait_for_pending_works()
            timer = _NCCL_TIMERS[id(pg)] = cls(nccl, pg)
        except Exception as exc:  # a group whose default backend is not NCCL, a hook already registered
            logger.warning("goodput: NCCL's collective timers are not available for this process group (%s)", exc)
            return None
        return timer

    @staticmethod
    def timing_cost_s(samples: int = 64) -> float:
        """What NCCL's timers add to one collective here: a CUDA event with timing recorded at its start, and its
        end event with timing (median of ``samples`` records of such an event on a private stream, twice)."""
        import statistics

        import torch

        stream = torch.cuda.Stream()
        events = [torch.cuda.Event(enable_timing=True) for _ in range(8)]
        for event in events:
            event.record(stream)
        costs = []
        for i in range(samples):
            t0 = _perf()
            events[i % 8].record(stream)
            costs.append(_perf() - t0)
        return 2.0 * statistics.median(costs)

    def take(self) -> list[tuple[str, float, float, int | None]]:
        out: list[tuple[str, float, float, int | None]] = []
        done = self._done
        to_wall = _time() - time.monotonic()  # torch may give the enqueue time on the steady (monotonic) clock
        for _ in range(len(done)):
            try:
                info = done.popleft()
            except IndexError:
                break
            try:
                started = info.time_started
                start_s = (started.timestamp() if hasattr(started, "timestamp")  # a datetime: the system clock
                           else started.total_seconds() + to_wall)  # a timedelta: std::chrono::steady_clock
                seq = getattr(info, "seq", None)
                out.append((_op_name(info.op_type), start_s, max(0.0, info.active_duration.total_seconds()),
                            None if seq is None else int(seq)))
            except Exception:  # a WorkInfo of another shape: counted, never raised
                self.failed += 1
        return out

    def enqueued(self) -> int | None:
        return enqueued_collectives(self._group)

    def resolve_ready(self) -> bool:
        return True  # completions wait in the deque for the flusher's next take()

    def drain(self, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) until NCCL has handed over every collective issued so far: its watchdog
        finds completions on its own schedule. The wait runs on a thread of its own, since a hung collective
        never completes."""
        waiter = threading.Thread(target=self._wait_for_pending, name="goodput-nccl-drain", daemon=True)
        waiter.start()
        waiter.join(timeout_s)
        return not waiter.is_alive()

    def _wait_for_pending(self) -> None:
        try:
            self._nccl._wait_for_pending_works()
        except Exception as exc:  # the group was destroyed meanwhile
            logger.debug("goodput: waiting for NCCL's completions: %s", exc)


def enqueued_collectives(group: Any) -> int | None:
    """The group's count of collectives issued so far (None where torch does not say)."""
    try:
        return int(group._get_sequence_number_for_group())
    except Exception:
        return None
