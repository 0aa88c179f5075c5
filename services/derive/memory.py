"""Give the memory an analysis freed back to the operating system.

A build allocates and frees hundreds of MB of numpy and pandas buffers, from whichever thread runs it. glibc keeps
freed memory in per-thread arenas for reuse, and arenas fragment: a collector analysing live runs every few seconds
grew its resident memory steadily (benchmarks/load.py: +27 MiB/min at 1,024 ranks, while the memory Python itself
held, traced with tracemalloc, stayed flat). `malloc_trim(0)` after each build returns the free pages.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from collections.abc import Callable

logger = logging.getLogger(__name__)


def _trimmer() -> Callable[[], None]:
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to do
        trim = None
    if trim is None:
        return lambda: None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int

    def release() -> None:
        trim(0)

    return release


release_freed_memory = _trimmer()
