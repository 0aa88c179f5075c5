"""The collector process's C allocator, set up against fragmentation (services/derive/memory.py): a large buffer is
mapped and unmapped whole even after a larger one was freed, and at most two arenas serve the process's threads.
Checked in a fresh interpreter (the test process keeps its own allocator as it is) through glibc's own counters."""

from __future__ import annotations

import ctypes.util
import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest

glibc_only = pytest.mark.skipif(not sys.platform.startswith("linux") or "libc.so.6" not in str(
    ctypes.util.find_library("c")), reason="glibc's mallopt and mallinfo2: Linux with glibc only")

PROBE = textwrap.dedent("""
    import ctypes, json, sys, threading
    from services.derive.memory import tune_allocator

    class Info(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in
                    "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = Info
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    tuned = tune_allocator() if sys.argv[1] == "tuned" else None
    libc.free(libc.malloc(4 << 20))  # untuned, glibc raises its mmap threshold to 4 MiB here
    before = libc.mallinfo2().hblks
    kept = libc.malloc(1 << 20)
    mapped = libc.mallinfo2().hblks - before  # 1: this 1 MiB buffer has a mapping of its own
    libc.free(kept)

    arenas = set()
    together = threading.Barrier(8)
    def allocate():  # each thread's buffer comes from the arena the thread is given, all threads alive at once
        together.wait()
        p = libc.malloc(64)
        arenas.add(p >> 26)  # arenas other than the main one are 64 MiB aligned heaps
        together.wait()
        libc.free(p)
    threads = [threading.Thread(target=allocate) for _ in range(8)]
    for t in threads: t.start()
    for t in threads: t.join()
    print(json.dumps({"tuned": tuned, "mapped": mapped, "thread_arenas": len(arenas)}))
""")


def _probe(mode: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True).stdout
    return json.loads(out)


@glibc_only
def test_a_large_buffer_is_mapped_on_its_own_after_a_larger_one_was_freed() -> None:
    assert _probe("plain")["mapped"] == 0  # glibc's moving threshold: carved out of the heap
    tuned = _probe("tuned")
    assert tuned["tuned"] is True
    assert tuned["mapped"] == 1


@glibc_only
def test_threads_share_at_most_two_arenas() -> None:
    assert _probe("plain")["thread_arenas"] > 2
    assert _probe("tuned")["thread_arenas"] <= 2


def test_the_served_app_tunes_the_allocator_and_the_gil_and_a_test_app_does_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from services.collector import app as app_module

    calls: list[object] = []

    def tune() -> bool:
        calls.append("tuned")
        return True

    def create_app(**kwargs: object) -> object:
        calls.append(kwargs)
        return "app"

    monkeypatch.setattr(app_module, "tune_allocator", tune)
    monkeypatch.setattr(app_module, "create_app", create_app)
    before = sys.getswitchinterval()
    try:
        served: object = app_module.create_served_app()
        assert sys.getswitchinterval() == pytest.approx(app_module.GIL_SWITCH_INTERVAL_S)
    finally:
        sys.setswitchinterval(before)
    assert served == "app"
    assert calls == ["tuned", {"freeze_heap_at_start": True}]  # tuned before the app starts any thread
