"""/healthz latency while clients post gzip bombs in a loop, against the same collector left alone.

    python -m benchmarks.gzip_bombs [--bombers 3] [--requests 300]

A real `goodput serve` (SQLite, one worker). Each bomb is a ~40 kB gzip body that inflates past the body limit
(32 MiB of spaces); the collector inflates at most the limit, on its one inflating thread, and refuses it 413.
Reported: /healthz p50/p99 quiet, then with N bomber threads posting back to back, and their ratios. A loop that
inflated on the event loop would put every /healthz behind a whole inflation (tens of ms per bomb); the threshold-
free proof that it does not is tests/collector/test_inflation_off_the_event_loop.py.
"""

from __future__ import annotations

import argparse
import gzip
import statistics
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

from benchmarks._common import collector, machine

BODY_LIMIT = 32 << 20


def _latencies(client: httpx.Client, url: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        client.get(f"{url}/healthz").raise_for_status()
        out.append(time.perf_counter() - t0)
        time.sleep(0.01)
    return out


def _p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bombers", type=int, default=3, help="client threads posting bombs back to back")
    ap.add_argument("--requests", type=int, default=300, help="/healthz requests per phase")
    args = ap.parse_args(argv)

    bomb = gzip.compress(b'{"events": [' + b" " * (BODY_LIMIT + 1024) + b"]}", compresslevel=9)
    print(f"machine: {machine()}; bomb {len(bomb) / 1024:.0f} kB gzip -> {BODY_LIMIT >> 20} MiB+ inflated")
    with tempfile.TemporaryDirectory() as tmp, collector(f"sqlite:///{Path(tmp) / 'bombs.db'}") as url:
        stop = threading.Event()
        answers: Counter[int] = Counter()

        def bomber() -> None:
            with httpx.Client(timeout=60) as c:
                while not stop.is_set():
                    answers[c.post(f"{url}/v1/events", content=bomb, headers={
                        "Content-Encoding": "gzip", "Content-Type": "application/json"}).status_code] += 1

        with httpx.Client(timeout=30) as client:
            quiet = _latencies(client, url, args.requests)
            threads = [threading.Thread(target=bomber, daemon=True) for _ in range(args.bombers)]
            for t in threads:
                t.start()
            time.sleep(1.0)
            started = time.perf_counter()
            loaded = _latencies(client, url, args.requests)
            elapsed = time.perf_counter() - started
            stop.set()
            for t in threads:
                t.join(60)

    bombs = sum(answers.values())
    print(f"bombs: {bombs} posted by {args.bombers} threads ({bombs / elapsed:.1f}/s), answers {dict(answers)}")
    print(f"{'':>16} {'p50 ms':>8} {'p99 ms':>8}")
    for name, values in (("quiet", quiet), ("under bombs", loaded)):
        print(f"{name:>16} {_p(values, 50) * 1000:8.1f} {_p(values, 99) * 1000:8.1f}")
    print(f"{'ratio':>16} {_p(loaded, 50) / _p(quiet, 50):8.2f} {_p(loaded, 99) / _p(quiet, 99):8.2f}")
    return 0 if set(answers) == {413} else 1


if __name__ == "__main__":
    raise SystemExit(main())
