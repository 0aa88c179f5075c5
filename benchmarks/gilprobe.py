"""Which single C calls of the collector's background threads run long: the calls that may hold the GIL while the
event loop and the writer wait (docs/architecture.md, "The GIL").

Not imported by anything: installed as the interpreter's `sitecustomize` for one measured run, it profiles, in every
process whose command line holds "serve" and that has GILPROBE set, the threads started after it whose name begins
with one of GILPROBE_THREADS (comma-separated; "goodput-analysis,goodput-warm" by default: the analyses' builds and
the background analyst; on PostgreSQL the latter runs in a process of its own, `goodput analyst`, unless the
collector has GOODPUT_ANALYST=thread: set it to see the analyst's calls in the serving process). Every C function
they call directly from Python that takes longer than GILPROBE_MS (4) of wall time is counted by thread, function
and calling line; every GILPROBE_EVERY_S (10) the 40 with the most such time go to GILPROBE/gil-<pid>.txt (total ms,
calls, longest). Wall time: a call that releases the GIL (a socket read, a lock wait, numpy's sorts) or one that
calls back into Python (a generator, `sorted` with a key) shows up too and holds nothing; one converting Python
objects in C (`np.array` over a list of tuples, `sorted` of ints, pydantic) holds the GIL for all of it. Read the
names.

    cp benchmarks/gilprobe.py "$(.venv/bin/python -c 'import site; print(site.getsitepackages()[0])')/sitecustomize.py"
    mkdir -p /tmp/gp && GILPROBE=/tmp/gp python -m benchmarks.requests --rounds 1 --duration 60
    rm "$(.venv/bin/python -c 'import site; print(site.getsitepackages()[0])')/sitecustomize.py"
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import Counter
from types import FrameType
from typing import Any

_REPORTED = 40


class _Probe:
    def __init__(self, folder: str, prefixes: tuple[str, ...], *, threshold_s: float, every_s: float) -> None:
        self._folder = folder
        self._every_s = every_s
        self._prefixes = prefixes
        self._threshold_s = threshold_s
        self._lock = threading.Lock()
        self._seconds: Counter[str] = Counter()
        self._calls: Counter[str] = Counter()
        self._longest: dict[str, float] = {}
        self._local = threading.local()

    def hook(self, frame: FrameType, event: str, arg: Any) -> None:
        local = self._local
        started = getattr(local, "started", None)
        if started is None:  # this thread's first event: keep profiling it only if it is one of ours
            if not threading.current_thread().name.startswith(self._prefixes):
                sys.setprofile(None)
                return
            started = local.started = []
        if event == "c_call":
            started.append(time.perf_counter())
        elif event in ("c_return", "c_exception") and started:
            seconds = time.perf_counter() - started.pop()
            if seconds >= self._threshold_s:
                key = (f"{threading.current_thread().name[:24]:24} {getattr(arg, '__qualname__', repr(arg))[:60]} "
                       f"@{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno}")
                with self._lock:
                    self._seconds[key] += seconds
                    self._calls[key] += 1
                    self._longest[key] = max(self._longest.get(key, 0.0), seconds)

    def report_forever(self) -> None:
        path = os.path.join(self._folder, f"gil-{os.getpid()}.txt")
        while True:
            time.sleep(self._every_s)
            with self._lock:
                rows = [(self._seconds[k], self._calls[k], self._longest[k], k) for k in self._seconds]
            rows.sort(reverse=True)
            with open(path, "w") as out:
                out.write("total ms   calls  longest ms  thread, C function @ calling line\n")
                for seconds, calls, longest, key in rows[:_REPORTED]:
                    out.write(f"{seconds * 1e3:8.1f} {calls:7d} {longest * 1e3:11.1f}  {key}\n")


def _install() -> None:
    with open("/proc/self/cmdline", "rb") as cmdline:
        if b"serve" not in cmdline.read():
            return
    threads = os.environ.get("GILPROBE_THREADS", "goodput-analysis,goodput-warm")
    probe = _Probe(os.environ["GILPROBE"], tuple(threads.split(",")),
                   threshold_s=float(os.environ.get("GILPROBE_MS", "4")) / 1e3,
                   every_s=float(os.environ.get("GILPROBE_EVERY_S", "10")))
    threading.setprofile(probe.hook)  # threads started from now on; each drops the hook unless it is one of ours
    threading.Thread(target=probe.report_forever, name="gilprobe", daemon=True).start()


if os.environ.get("GILPROBE"):
    _install()
