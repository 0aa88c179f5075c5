"""Deadlines for whole HTTP requests: when one passes, its connection is shut down, which ends whatever read or
write the request's thread is blocked in (:mod:`ingest_client.transport.request`).

One daemon thread, ``goodput-deadlines``, keeps every deadline of the process, started with the first request and
again in a forked child. Not a timer per request: Python 3.12 refuses to start threads while the interpreter
exits, when the exit hooks still send the last records. Should the thread not start, a request still has its
per-operation socket timeout.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import socket
import threading
import time


class Deadline:
    """The deadline of one request and the sockets it watches.

    It holds its own duplicate of each socket's descriptor: shutdown(2) acts on the socket, so it wakes a read
    blocked in the request's thread (plain or TLS), and the duplicate is never a descriptor the request has
    closed and the process reused for something else."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.at = time.monotonic() + timeout_s
        self.expired = False
        self._done = False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        _WATCHDOG.add(self)

    def watch(self, sock: socket.socket) -> None:
        watched = sock.dup()
        with self._lock:
            if self._done:
                watched.close()
                return
            self._sockets.append(watched)
            if self.expired:
                _shut(watched)

    def expire(self) -> None:
        with self._lock:
            if self._done:
                return
            self.expired = True
            for sock in self._sockets:
                _shut(sock)

    def cancel(self) -> None:
        """The request is over: close the duplicates; a later expiry does nothing."""
        with self._lock:
            self._done = True
            for sock in self._sockets:
                sock.close()
            self._sockets.clear()

    @property
    def done(self) -> bool:
        return self._done


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed by the server
        sock.shutdown(socket.SHUT_RDWR)


class _Watchdog:
    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, Deadline]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def add(self, deadline: Deadline) -> None:
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                thread = threading.Thread(target=self._run, name="goodput-deadlines", daemon=True)
                try:
                    thread.start()
                except RuntimeError:  # the interpreter is exiting (3.12): per-operation timeouts only
                    return
                self._thread = thread
            heapq.heappush(self._heap, (deadline.at, next(self._order), deadline))
            self._cond.notify()

    def _run(self) -> None:
        while True:
            due: list[Deadline] = []
            with self._cond:
                while not due:
                    now = time.monotonic()
                    while self._heap and (self._heap[0][2].done or self._heap[0][0] <= now):
                        deadline = heapq.heappop(self._heap)[2]
                        if not deadline.done:
                            due.append(deadline)
                    if not due:
                        self._cond.wait(self._heap[0][0] - now if self._heap else None)
            for deadline in due:
                deadline.expire()

    def after_fork_in_child(self) -> None:
        self._reset()  # the parent's thread is not in the child, and its lock may have been held at the fork


_WATCHDOG = _Watchdog()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_WATCHDOG.after_fork_in_child)
