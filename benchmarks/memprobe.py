"""Where a collector worker's RSS goes, sampled inside the process (docs/architecture.md, "A process's memory").

Not imported by anything: installed as the interpreter's `sitecustomize` for one measured run, it starts a thread
in every Python process that has MEMPROBE set, which every MEMPROBE_EVERY seconds (30) appends to
MEMPROBE/mem-<pid>.jsonl: RSS, glibc's `mallinfo2` (bytes in use, free but held, mmapped), and pymalloc's arenas
and bytes in use (`sys._debugmallocstats`); with MEMPROBE_TRIM=1 it then calls `malloc_trim(0)` and records its
time and the RSS after it; with MEMPROBE_CENSUS=1 it also counts the objects the garbage collector tracks by type
(the 30 most numerous, with their `sys.getsizeof` bytes) and the NumPy arrays they hold (count and bytes, each array
once): what stays, against what the allocators keep (a census holds the GIL for 0.1-0.5 s a worker at fleet shape: a
diagnostic only); with MEMPROBE_TRACE_AT=<seconds> it starts tracemalloc then (MEMPROBE_TRACE_FRAMES deep, 8) and
at each later sample records the 20 tracebacks that hold the most of what was allocated since and is still alive
(tracing slows the process several times over: its figures say where memory stays, not how fast the collector is).
MEMPROBE_ONLY=serve probes only the processes whose command line holds "serve" (the collector's, not the load
generator).

    cp benchmarks/memprobe.py "$(.venv/bin/python -c 'import site; print(site.getsitepackages()[0])')/sitecustomize.py"
    mkdir -p /tmp/mp && MEMPROBE=/tmp/mp python -m benchmarks.load --ranks 2048 --duration 480
    rm "$(.venv/bin/python -c 'import site; print(site.getsitepackages()[0])')/sitecustomize.py"

The collector's workers are the files whose "argv" holds "serve". Linux and glibc only.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import re
import sys
import tempfile
import threading
import time
import tracemalloc
from typing import Any

_PYMALLOC = {
    "arenas_now": r"# arenas allocated current\s*=\s*([\d,]+)",
    "alloc_blocks": r"# bytes in allocated blocks\s*=\s*([\d,]+)",
    "avail_blocks": r"# bytes in available blocks\s*=\s*([\d,]+)",
    "free_pools": r"(\d+) unused pools \*",
}


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def _pymalloc() -> dict[str, int]:
    """pymalloc's figures: sys._debugmallocstats writes them to the C stderr, so fd 2 goes to a file meanwhile."""
    with tempfile.TemporaryFile(mode="w+") as out:
        saved = os.dup(2)
        sys.stderr.flush()
        os.dup2(out.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read()
    found = {key: re.search(pattern, text) for key, pattern in _PYMALLOC.items()}
    return {key: int(m.group(1).replace(",", "")) for key, m in found.items() if m}


def _census() -> dict[str, Any]:
    """Objects by type (count, bytes) and the NumPy arrays they refer to, each array counted once."""
    counts: dict[str, list[int]] = {}
    arrays: dict[int, int] = {}
    ndarray = sys.modules["numpy"].ndarray if "numpy" in sys.modules else None
    for obj in gc.get_objects():
        name = type(obj).__qualname__
        entry = counts.setdefault(name, [0, 0])
        entry[0] += 1
        entry[1] += sys.getsizeof(obj, 0)
        if ndarray is not None:
            for ref in gc.get_referents(obj):
                if isinstance(ref, ndarray):
                    while isinstance(ref.base, ndarray):
                        ref = ref.base
                    arrays[id(ref)] = ref.nbytes
    top = sorted(counts.items(), key=lambda item: -item[1][0])[:30]
    return {"objects": sum(c for c, _ in counts.values()), "by_type": {name: c for name, c in top},
            "arrays": len(arrays), "array_bytes": sum(arrays.values())}


def _retained(frames: int) -> list[dict[str, Any]]:
    """What is still alive of what was allocated since tracing started: the 20 largest tracebacks."""
    snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, __file__),
                                                         tracemalloc.Filter(False, tracemalloc.__file__)])
    return [{"kib": stat.size >> 10, "count": stat.count,
             "where": [f"{frame.filename.rsplit('site-packages/', 1)[-1]}:{frame.lineno}"
                       for frame in stat.traceback][-frames:]}
            for stat in snapshot.statistics("traceback")[:20]]


def _rss_kib() -> int:
    with open(f"/proc/{os.getpid()}/status") as status:
        return next((int(line.split()[1]) for line in status if line.startswith("VmRSS")), 0)


def _sample(libc: Any, began: float) -> dict[str, Any]:
    info = libc.mallinfo2()
    record = {"t": round(time.time() - began, 1), "rss_kib": _rss_kib(), "argv": " ".join(sys.argv)[:80],
              "glibc_in_use": info.uordblks, "glibc_free": info.fordblks, "glibc_mmap": info.hblkhd, **_pymalloc()}
    if os.environ.get("MEMPROBE_CENSUS"):
        started = time.perf_counter()
        record["census"] = _census()
        record["census_s"] = round(time.perf_counter() - started, 2)
    trace_at = os.environ.get("MEMPROBE_TRACE_AT")
    if trace_at is not None:
        frames = int(os.environ.get("MEMPROBE_TRACE_FRAMES", "8"))
        if tracemalloc.is_tracing():
            record["retained"] = _retained(frames)
        elif record["t"] >= float(trace_at):
            tracemalloc.start(frames)
            record["tracing_since"] = record["t"]
    if os.environ.get("MEMPROBE_TRIM"):
        started = time.perf_counter()
        libc.malloc_trim(0)
        record["trim_ms"] = round((time.perf_counter() - started) * 1e3, 2)
        record["rss_after_trim_kib"] = _rss_kib()
    return record


def _loop(directory: str, every_s: float) -> None:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    began = time.time()
    time.sleep(1.0)  # a spawned process (uvicorn's workers) gets its parent's argv only after site's import
    if os.environ.get("MEMPROBE_ONLY", "") not in " ".join(sys.argv):
        return
    path = os.path.join(directory, f"mem-{os.getpid()}.jsonl")
    while True:
        time.sleep(every_s)
        with open(path, "a") as out:
            out.write(json.dumps(_sample(libc, began)) + "\n")


if os.environ.get("MEMPROBE"):
    threading.Thread(target=_loop, args=(os.environ["MEMPROBE"], float(os.environ.get("MEMPROBE_EVERY", "30"))),
                     daemon=True, name="memprobe").start()
