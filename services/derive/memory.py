"""The collector process's memory: freed memory given back to the operating system, and glibc's allocator set up
so that a long-lived process does not fragment.

A build allocates and frees hundreds of MB of numpy and pandas buffers, from whichever thread runs it. glibc keeps
freed memory in per-thread arenas for reuse, and arenas fragment: a collector analysing live runs every few seconds
grew its resident memory steadily (benchmarks/load.py: +27 MiB/min at 1,024 ranks, while the memory Python itself
held, traced with tracemalloc, stayed flat). `malloc_trim(0)` after each build returns the free pages.

That left free memory resident that trimming cannot return: pieces of the heap between the decoded blocks a process
keeps (services.storage.summary_cache), where a build's large temporaries had been. glibc raises its mmap threshold
to the largest block freed (up to 32 MiB), so after the first large free, every later numpy buffer of a few MB is
carved out of an arena instead of mapped on its own, and up to 16 arenas (8 per core) each keep their own free pieces.
`tune_allocator()` fixes the threshold at 128 KiB (glibc's default before it moves: a large buffer is mapped and
unmapped whole) and allows 2 arenas. At 10,240 ranks (`python -m benchmarks.load`, 180 s, alternating runs) RSS less
the block cache grew 22-25 MiB/min against 40-50 before, with no change in CPU those runs can tell
(benchmarks/results/fleet-load-10240-180s-allocator-ab_2core-vm_202612.md). Over 20 minutes it still grows
(+10.6 MiB/min against +12.1): Python's own arenas (1 MiB each, returned only when empty) and memory in use that the
cache's gauge does not count.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from collections.abc import Callable

logger = logging.getLogger(__name__)

_M_MMAP_THRESHOLD = -3  # glibc's <malloc.h>; setting it also stops the threshold from moving
_M_ARENA_MAX = -8
MMAP_THRESHOLD_BYTES = 128 << 10
ARENAS = 2


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def _trimmer() -> Callable[[], None]:
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None)  # not glibc (musl, macOS): nothing to do
    if trim is None:
        return lambda: None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int

    def release() -> None:
        trim(0)

    return release


release_freed_memory = _trimmer()


def tune_allocator() -> bool:
    """Fix glibc's mmap threshold and cap its arenas (module docstring), for a process that serves nothing else: call
    it before the process starts its threads. False where the C library is not glibc (nothing changed)."""
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    done = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1 and mallopt(_M_ARENA_MAX, ARENAS) == 1)
    if not done:
        logger.warning("could not set the C allocator's mmap threshold and arena count; memory may fragment")
    return done
