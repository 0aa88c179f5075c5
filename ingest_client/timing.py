"""One interface for timing intervals whose end is known on another thread: CPU clocks, or CUDA events.

Why two: a DDP comm hook sees a collective end when its future's callback runs. With gloo (CPU) that is when the
data has arrived. With NCCL a CUDA future is complete as soon as later kernels can be *ordered* after the
collective, before it has run on the GPU (pytorch/pytorch#48305, ``Work.get_future``), so a CPU clock reads a
collective as nearly free and the waiting for a slow rank disappears from ``comm``.

- ``CpuTimer``: start = ``time.time()`` and ``perf_counter()`` when ``start()`` is called, end = start + the
  ``perf_counter()`` interval when ``stop()`` is called; reported at once. This is what the client always did.
- ``CudaTimer``: ``start()`` records a CUDA event on the current stream; ``stop()`` records one on the current
  stream. Inside a CUDA future's ``then`` callback that stream is a dedicated one that torch has made wait on the
  collective's kernels, so the end event completes when the collective has finished on the GPU. Nothing waits:
  a resolver thread (``goodput-cuda-timer``) polls ``event.query()`` and, once both events are complete, turns
  them into wall-clock times through an anchor, an event recorded on an idle private stream at a known
  ``time.time()`` (re-anchored every ``ANCHOR_EVERY_S``): wall = anchor wall + ``anchor.elapsed_time(event)``.
  ``drain()`` resolves what is left (``Tracker.flush`` and ``shutdown`` call it).

Both report through the ``emit(start_s, end_s)`` callback given to ``stop``, on the thread that resolved them.
torch is imported only by ``CudaTimer``.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

logger = logging.getLogger(__name__)

Emit = Callable[[float, float], None]  # (start_s, end_s): wall-clock seconds since the epoch

ANCHOR_EVERY_S = 60.0  # re-anchor CUDA event times to time.time() this often (GPU and CPU clocks drift apart)
POLL_INTERVAL_S = 0.01  # the resolver's poll while events are pending

_time = time.time
_perf = time.perf_counter


class IntervalTimer(Protocol):
    """Times an interval; ``start()`` and ``stop()`` are on the hot path and never block."""

    kind: str  # "cpu" or "cuda"

    def start(self) -> Any: ...  # Any: a token opaque to the caller, handed back to stop()

    def stop(self, token: Any, emit: Emit) -> None: ...

    def drain(self, timeout_s: float) -> bool: ...  # True when nothing is left pending


class CpuTimer:
    """The current clocks: ``time.time()`` for the start, ``perf_counter()`` for the duration."""

    kind = "cpu"

    def start(self) -> tuple[float, float]:
        return _time(), _perf()

    def stop(self, token: tuple[float, float], emit: Emit) -> None:
        start, p0 = token
        emit(start, start + (_perf() - p0))

    def drain(self, timeout_s: float) -> bool:
        return True


class CudaTimer:
    """CUDA events on the streams current at ``start()`` / ``stop()``, resolved off the hot path."""

    kind = "cuda"

    def __init__(self, device: Any = None) -> None:  # Any: a torch.device, an index or None (current device)
        import torch

        self._torch = torch
        self._device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        self._anchor_stream = torch.cuda.Stream(device=self._device)  # idle: its events run when recorded
        self._anchor: tuple[Any, float] = self._new_anchor()
        self._pending: collections.deque[tuple[tuple[Any, float], Any, Any, Emit]] = collections.deque()
        self._free: list[Any] = []
        self._lock = threading.Lock()  # the resolver thread and drain() both resolve
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.resolved = 0
        self.failed = 0

    def _new_anchor(self) -> tuple[Any, float]:
        event = self._torch.cuda.Event(enable_timing=True)
        before = _time()
        event.record(self._anchor_stream)
        after = _time()
        return event, (before + after) / 2.0

    def _event(self) -> Any:
        try:
            return self._free.pop()
        except IndexError:
            return self._torch.cuda.Event(enable_timing=True)

    def start(self) -> tuple[Any, tuple[Any, float]]:
        event = self._event()
        event.record()  # the current stream: for a collective, where its inputs were produced
        return event, self._anchor  # the anchor current now; re-anchoring later does not move this interval

    def stop(self, token: tuple[Any, tuple[Any, float]], emit: Emit) -> None:
        end = self._event()
        end.record()  # in a CUDA future's callback: a stream that waits on the collective's kernels
        start, anchor = token
        self._pending.append((anchor, start, end, emit))  # deque append: thread-safe, no lock
        if self._thread is None:
            self._start_resolver()
        self._wake.set()

    def _start_resolver(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="goodput-cuda-timer", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        self._torch.cuda.set_device(self._device)
        last_anchor = _perf()
        while True:
            self._wake.wait(1.0)
            self._wake.clear()
            while self._pending:
                if not self.resolve_ready():
                    time.sleep(POLL_INTERVAL_S)
            if _perf() - last_anchor >= ANCHOR_EVERY_S:
                self._anchor, last_anchor = self._new_anchor(), _perf()

    def resolve_ready(self) -> bool:
        """Emit every interval at the head of the queue whose events have completed; False if the head has not."""
        with self._lock:
            while self._pending:
                anchor, start, end, emit = self._pending[0]
                if not end.query():
                    return False
                self._pending.popleft()
                self._emit(anchor, start, end, emit)
            return True

    def _emit(self, anchor: tuple[Any, float], start: Any, end: Any, emit: Emit) -> None:
        try:
            anchor_event, anchor_wall = anchor
            start_s = anchor_wall + anchor_event.elapsed_time(start) / 1000.0
            end_s = anchor_wall + anchor_event.elapsed_time(end) / 1000.0
            emit(start_s, max(start_s, end_s))
            self.resolved += 1
        except Exception as exc:  # an event that was never recorded, a device error: count, never raise
            self.failed += 1
            logger.warning("goodput: a CUDA interval could not be resolved: %s", exc)
        self._free.extend((start, end))

    def drain(self, timeout_s: float) -> bool:
        """Resolve what is pending, waiting up to ``timeout_s`` for the GPU to complete it."""
        deadline = _perf() + timeout_s
        while not self.resolve_ready():
            if _perf() >= deadline:
                return False
            time.sleep(min(POLL_INTERVAL_S, max(0.0, deadline - _perf())))
        return True


def timer_for(tensor: Any, clock: str = "auto") -> IntervalTimer:
    """``CudaTimer`` for a CUDA tensor (``clock="auto"`` or ``"cuda"``), else ``CpuTimer``."""
    if clock not in ("auto", "cpu", "cuda"):
        raise ValueError(f"clock must be 'auto', 'cpu' or 'cuda', got {clock!r}")
    if clock == "cpu" or (clock == "auto" and not getattr(tensor, "is_cuda", False)):
        return CpuTimer()
    return CudaTimer(tensor.device if getattr(tensor, "is_cuda", False) else None)
