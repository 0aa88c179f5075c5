"""Hot-path cost of the ingest client, and its overhead on a ~10 ms CPU training step.

    python benchmarks/client_overhead.py [--calls 20000] [--steps 300]

Measures each hot-path call (median and p99, microseconds) with the flusher running, first
against a live in-process fake collector and then against an unreachable one (a closed port).
Then the durable calls (a checkpoint span, ``resumed``, ``end_attempt``: written and fsynced to the
spool before they return), each after a few steps so that it also spools what was buffered, beside
the step hot path measured in the same run.
Then times a tiny torch MLP step of about 10 ms with and without the client, interleaving the
two so that drift and noise hit both equally, and prints the ratio.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ingest_client.common.config import ClientConfig, Mode
from ingest_client.worker.context import RunContext
from ingest_client.worker.tracker import Tracker
from tests.ingest_client.fake_collector import FakeCollector, closed_port_url

GOAL_MEDIAN_US = 5.0
GOAL_P99_US = 50.0
GOAL_STEP_OVERHEAD = 0.01
# Durable calls come a few times per attempt (a checkpoint takes seconds): a write and an fsync each.
GOAL_DURABLE_MEDIAN_US = 2000.0
GOAL_DURABLE_P99_US = 50_000.0
DURABLE_CALLS = 300


def make_tracker(url: str, spool_dir: str) -> Tracker:
    config = ClientConfig(mode=Mode.ONLINE, url=url, spool_dir=Path(spool_dir), run_id="bench",
                          install_handlers=False, http_timeout_s=0.5)
    context = RunContext(run_id="bench", attempt=0, rank=0, local_rank=0, world_size=1, host="bench",
                         pid=os.getpid())
    return Tracker(config, context).start()


def percentiles_us(samples_ns: list[int]) -> tuple[float, float]:
    samples_ns.sort()
    return statistics.median(samples_ns) / 1000, samples_ns[int(len(samples_ns) * 0.99)] / 1000


def time_calls(fn: Callable[[int], None], calls: int) -> tuple[float, float]:
    clock = time.perf_counter_ns
    samples = []
    for i in range(1, calls + 1):
        t0 = clock()
        fn(i)
        samples.append(clock() - t0)
    return percentiles_us(samples)


def hot_path_rows(tracker: Tracker, calls: int) -> list[tuple[str, float, float]]:
    def step_ctx(i: int) -> None:
        with tracker.step(i) as s:
            s.loss = 0.5

    def record_step(i: int) -> None:
        tracker.record_step(i, 1.7e9, 1.7e9 + 0.01, loss=0.5)

    def collective(i: int) -> None:
        with tracker.collective("all_reduce"):
            pass

    def empty(i: int) -> None:
        pass

    rows = []
    for name, fn in [("with tracker.step()", step_ctx), ("record_step()", record_step),
                     ("with tracker.collective()", collective), ("(empty call, baseline)", empty)]:
        time_calls(fn, 2000)  # warm up
        median, p99 = time_calls(fn, calls)
        rows.append((name, median, p99))
        tracker.flush(5.0)
    return rows


def durable_rows(url: str, calls: int) -> list[tuple[str, float, float]]:
    """Each durable call after 10 steps (so it also spools the rows buffered before it), on a fresh tracker
    per kind (end_attempt happens once per tracker)."""
    rows = []

    def measure(name: str, call: Callable[[Tracker, int], object], per_tracker: int) -> None:
        clock = time.perf_counter_ns
        samples: list[int] = []
        with tempfile.TemporaryDirectory() as spool:
            tracker = make_tracker(url, spool)
            step = 0
            for i in range(calls):
                if i and i % per_tracker == 0:
                    tracker.shutdown(1.0)
                    tracker = make_tracker(url, spool)
                for _ in range(10):
                    step += 1
                    with tracker.step(step):
                        pass
                t0 = clock()
                call(tracker, step)
                samples.append(clock() - t0)
            tracker.shutdown(1.0)
        median, p99 = percentiles_us(samples)
        rows.append((name, median, p99))

    def checkpoint_span(tracker: Tracker, step: int) -> None:
        with tracker.checkpoint(step):  # two durable events: checkpoint_start, checkpoint_end
            pass

    measure("with tracker.checkpoint()", checkpoint_span, calls)
    measure("resumed(step, checkpoint=)", lambda t, s: t.resumed(s, checkpoint=f"ckpt-{s}"), calls)
    measure("end_attempt()", lambda t, s: t.end_attempt("failed"), 1)
    return rows


def training_overhead(tracker: Tracker, steps: int) -> tuple[float, float, float]:
    import torch
    from torch import nn

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(512, 768), nn.ReLU(), nn.Linear(768, 768), nn.ReLU(), nn.Linear(768, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(128, 512), torch.randint(0, 10, (128,))
    loss_fn = nn.CrossEntropyLoss()

    def train_step() -> float:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return float(loss.detach())

    for _ in range(20):
        train_step()
    plain: list[float] = []
    tracked: list[float] = []
    for i in range(1, steps + 1):
        # Alternate the order in each pair so neither variant always runs second.
        for variant in ((0, 1) if i % 2 else (1, 0)):
            t0 = time.perf_counter()
            if variant:
                with tracker.step(i) as s:
                    with tracker.collective("all_reduce"):
                        pass
                    s.loss = train_step()
                tracked.append(time.perf_counter() - t0)
            else:
                train_step()
                plain.append(time.perf_counter() - t0)
    p, t = statistics.median(plain), statistics.median(tracked)
    return p * 1000, t * 1000, t / p - 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--durable-calls", type=int, default=DURABLE_CALLS)
    args = parser.parse_args()

    import torch

    print(f"Python {platform.python_version()}, torch {torch.__version__}, {platform.machine()}, "
          f"{os.cpu_count()} CPUs, {platform.platform()}")
    collector = FakeCollector()
    ok = True
    try:
        for label, url in (("live collector", collector.url), ("unreachable collector", closed_port_url())):
            with tempfile.TemporaryDirectory() as spool:
                tracker = make_tracker(url, spool)
                rows = hot_path_rows(tracker, args.calls)
                plain_ms, tracked_ms, overhead = training_overhead(tracker, args.steps)
                stats = tracker.stats()
                tracker.shutdown(1.0)
            durable = durable_rows(url, args.durable_calls)
            print(f"\n== {label} (flusher running; {args.calls} calls each) ==")
            print(f"{'call':<30}{'median us':>12}{'p99 us':>12}   goal")
            for name, median, p99 in rows:
                meets = median < GOAL_MEDIAN_US and p99 < GOAL_P99_US
                ok &= meets or name.startswith("(")
                print(f"{name:<30}{median:>12.2f}{p99:>12.2f}   {'ok' if meets else 'MISSED'}")
            print(f"durable calls ({args.durable_calls} each, after 10 steps each; write + fsync to the spool before "
                  "returning):")
            for name, median, p99 in durable:
                meets = median < GOAL_DURABLE_MEDIAN_US and p99 < GOAL_DURABLE_P99_US
                ok &= meets
                print(f"{name:<30}{median:>12.2f}{p99:>12.2f}   {'ok' if meets else 'MISSED'}")
            meets = overhead < GOAL_STEP_OVERHEAD
            ok &= meets
            print(f"training step (median of {args.steps}, interleaved): without {plain_ms:.3f} ms, "
                  f"with client {tracked_ms:.3f} ms, overhead {overhead * 100:+.2f}%   "
                  f"{'ok' if meets else 'MISSED'} (goal < {GOAL_STEP_OVERHEAD:.0%})")
            assert stats is not None
            print(f"client counters: sent {stats.sent_events}, dropped {stats.dropped_events}, "
                  f"send failures {stats.send_failures}")
    finally:
        collector.stop()
    print("\nall goals met" if ok else "\nsome goals MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
