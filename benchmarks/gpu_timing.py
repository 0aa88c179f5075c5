"""What timing steps and collectives costs a GPU job: ratios against the same loop untimed, in one process.

    python -m benchmarks.gpu_timing [--rounds 5] [--steps 300] [--json OUT]

Needs one CUDA GPU (NCCL, world size 1; torchrun is not needed: the process group is made here). Prints:

1. The hot path of ``tracker.step()`` (enter + exit, median and p99 microseconds, 20,000 calls around an empty
   body): host clocks, CUDA events (the default on a CUDA job), CUDA events with NCCL's step log.
2. A launch-bound DDP loop (40 x Linear(1024), batch 64, ~40 buckets a step), ``--rounds`` rounds of ``--steps``
   steps, variants interleaved within each round, median ms per step and the ratio to DDP's built-in all-reduce:
   torch's own Python ``allreduce_hook``, ``tracker.ddp_comm_hook()`` (CUDA events per bucket), NCCL's timers
   switched on (no hook), and ``tracker.time_collectives(model)`` (NCCL's timers and the completion hook). Every
   variant runs inside ``tracker.step()`` (CUDA step clock); "no tracker" is the bare loop.
3. A realistic loop (16 x Linear(8192) bf16, batch 8192, DDP's default 25 MB buckets, >= 100 ms a step): the same
   ratios.

NCCL's timers cannot be switched off again in a process, so the variants without them run first in each loop.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GOAL_HOT_PATH_MEDIAN_US = 5.0
GOAL_COMM_OVERHEAD = 0.01


def _hot_path(tracker: Any, calls: int = 5_000, gap_s: float = 0.001) -> tuple[float, float]:
    """Median and p99 microseconds of ``with tracker.step(i): pass``, steps ``gap_s`` apart (a training loop's
    cadence: the resolver recycles events between steps, as it does in training)."""
    clock = time.perf_counter_ns
    samples = []
    for i in range(1, calls + 1):
        t0 = clock()
        with tracker.step(i):
            pass
        samples.append(clock() - t0)
        if gap_s:
            time.sleep(gap_s)
    samples.sort()
    return statistics.median(samples) / 1000, samples[int(len(samples) * 0.99)] / 1000


def _cuda_calls() -> dict[str, tuple[float, float]]:
    """What single CUDA driver calls cost here through torch (median and p99 us of 2,000 each, 1 ms apart)."""
    import torch

    stream = torch.cuda.current_stream()
    record = torch._C._CudaEventBase.record
    timed = [torch.cuda.Event(enable_timing=True) for _ in range(8)]
    plain = [torch.cuda.Event() for _ in range(8)]
    for event in (*timed, *plain):
        event.record(stream)
    torch.cuda.synchronize()
    anchor = timed[0]

    def measure(call: Callable[[int], object]) -> tuple[float, float]:
        samples = []
        for i in range(2_000):
            t0 = time.perf_counter_ns()
            call(i)
            samples.append(time.perf_counter_ns() - t0)
            time.sleep(0.0005)
        samples.sort()
        return statistics.median(samples) / 1000, samples[int(len(samples) * 0.99)] / 1000

    out = {
        "time.time()": measure(lambda i: time.time()),
        "record, timing event (C method)": measure(lambda i: record(timed[1 + i % 7], stream)),
        "record, timing event (Event.record())": measure(lambda i: timed[1 + i % 7].record()),
        "record, no-timing event (C method)": measure(lambda i: record(plain[i % 8], stream)),
        "query": measure(lambda i: timed[1 + i % 7].query()),
        "elapsed_time": measure(lambda i: anchor.elapsed_time(timed[1 + i % 7])),
        "new Event(enable_timing=True) + first record": measure(
            lambda i: torch.cuda.Event(enable_timing=True).record(stream)),
    }
    group: Any = torch.distributed.distributed_c10d._get_default_group()
    out["ProcessGroup._get_sequence_number_for_group()"] = measure(lambda i: group._get_sequence_number_for_group())
    return out


def _model(kind: str) -> tuple[Any, Any, Callable[[Any], Any]]:
    import torch
    from torch import nn

    if kind == "launch-bound":
        model = nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(40)]).cuda()
        x = torch.randn(64, 1024, device="cuda")
        bucket_mb = 4.0  # one Linear(1024) a bucket: ~40 buckets a step
    else:
        model = nn.Sequential(*[nn.Linear(8192, 8192, bias=False) for _ in range(16)]).cuda().to(torch.bfloat16)
        x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        bucket_mb = 25.0
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-6)

    def step(_: Any) -> None:
        loss = ddp(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return ddp, opt, step


def _round(tracker: Any, step_fn: Callable[[Any], None], steps: int, use_tracker: bool) -> float:
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    if use_tracker:
        for i in range(steps):
            with tracker.step(i + 1):
                step_fn(None)
    else:
        for i in range(steps):
            step_fn(i)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps * 1000.0


def _compare(tracker: Any, kind: str, rounds: int, steps: int) -> dict[str, float]:
    """Median ms per step of each variant (interleaved within rounds), NCCL-timer variants last."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    from ingest_client.worker.hooks import build_ddp_comm_hook

    variants: dict[str, Callable[[Any], None]] = {}
    builtin = _model(kind)[2]
    variants["no tracker"] = builtin
    variants["built-in all-reduce"] = builtin
    ddp, _, fn = _model(kind)
    ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    variants["torch allreduce_hook (Python)"] = fn
    ddp, _, fn = _model(kind)
    ddp.register_comm_hook(None, build_ddp_comm_hook(tracker, clock="cuda"))
    variants["tracker.ddp_comm_hook() (CUDA events)"] = fn
    first = _measure(tracker, variants, rounds, steps)

    group: Any = dist.distributed_c10d._get_default_group()
    group._enable_collectives_timing()
    timed_builtin = _model(kind)[2]
    ddp, _, fn = _model(kind)
    assert tracker.time_collectives(ddp, max_overhead=None) == "nccl"
    second = _measure(tracker, {"NCCL timers on, no hook": timed_builtin,
                                "tracker.time_collectives() (NCCL timers + hook)": fn}, rounds, steps)
    return {**first, **second}


def _measure(tracker: Any, variants: dict[str, Callable[[Any], None]], rounds: int, steps: int) -> dict[str, float]:
    for name, fn in variants.items():  # warm-up: kernels, NCCL communicator, allocator
        _round(tracker, fn, 10, name != "no tracker")
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            times[name].append(_round(tracker, fn, steps, name != "no tracker"))
    return {name: statistics.median(values) for name, values in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--realistic-steps", type=int, default=30)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--part", choices=["hot-path", "launch-bound", "realistic"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.part is None:  # each part in a process of its own: NCCL's timers, once on, stay on
        report: dict[str, Any] = {}
        for part in ("hot-path", "launch-bound", "realistic"):
            with tempfile.NamedTemporaryFile(suffix=".json") as out:
                cmd = [sys.executable, "-m", "benchmarks.gpu_timing", "--part", part, "--json", out.name,
                       "--rounds", str(args.rounds), "--steps", str(args.steps),
                       "--realistic-steps", str(args.realistic_steps)]
                done = subprocess.run(cmd, cwd=Path(__file__).resolve().parents[1])
                if done.returncode != 0:
                    return done.returncode
                report[part] = json.loads(Path(out.name).read_text() or "{}")
        if args.json:
            args.json.write_text(json.dumps(report, indent=2))
        return 0
    return _part(args)


def _part(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    import ingest_client as goodput

    if not torch.cuda.is_available():
        print("no CUDA GPU here: nothing to measure")
        return 2
    torch.cuda.set_device(0)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29533 + ("hot-path", "launch-bound", "realistic").index(args.part)))
    dist.init_process_group("nccl", rank=0, world_size=1)
    spool = tempfile.mkdtemp(prefix="goodput-bench-")
    report: dict[str, Any] = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}
    torch.zeros(1, device="cuda")  # CUDA in use: the tracker's step clock is CUDA events
    tracker = goodput.init(run_id="bench-gpu", mode="offline", spool_dir=spool, install_handlers=False)

    if args.part == "hot-path":
        print(f"torch {torch.__version__}, {report['gpu']}")
        calls = _cuda_calls()
        print("\n0. single calls (us, median / p99)")
        for name, (median, p99) in calls.items():
            print(f"   {name:<48} {median:7.2f} {p99:8.2f}")
        cpu = goodput.Tracker(goodput.ClientConfig(mode=goodput.Mode.OFFLINE, spool_dir=Path(spool),
                                                   run_id="bench-cpu", install_handlers=False, step_clock="cpu"),
                              tracker.context).start()
        hot = {"host clocks": _hot_path(cpu), "CUDA events": _hot_path(tracker),
               "CUDA events, back to back": _hot_path(tracker, 20_000, 0.0)}
        assert tracker.step_clock == "cuda", tracker.step_clock
        cpu.shutdown(1.0)
        ddp, _, step_fn = _model("launch-bound")
        assert tracker.time_collectives(ddp, max_overhead=None) == "nccl"
        hot["CUDA events + NCCL step log"] = _hot_path(tracker)
        print("\n1. tracker.step() hot path, enter + exit (us; goal: median < 5)")
        for name, (median, p99) in hot.items():
            print(f"   {name:<30} median {median:6.2f}  p99 {p99:7.2f}")
        nccl = tracker._nccl
        assert nccl is not None
        before = nccl.enqueued()
        for i in range(5):
            with tracker.step(10_000 + i):
                step_fn(None)
        torch.cuda.synchronize()
        drained = nccl.drain(5.0)
        infos = list(nccl._done)
        taken = nccl.take()
        print(f"\n   NCCL: enqueued {before} -> {nccl.enqueued()}, drained {drained}, {len(taken)} completions taken, "
              f"failed {nccl.failed}; first WorkInfo: "
              + (", ".join(f"{a}={getattr(infos[0], a, None)!r}" for a in ("op_type", "seq", "time_started",
                                                                            "active_duration")) if infos else "-"))
        report["cuda_calls_us"] = calls
        report["hot_path_us"] = hot
    else:
        kind = args.part
        number, steps = (2, args.steps) if kind == "launch-bound" else (3, args.realistic_steps)
        rounds = args.rounds if kind == "launch-bound" else max(3, args.rounds // 2)
        result = _compare(tracker, kind, rounds, steps)
        base = result["built-in all-reduce"]
        print(f"\n{number}. {kind} DDP loop: {rounds} rounds x {steps} steps, median ms per step (ratio to built-in; "
              f"goal: timing collectives <= x{1 + GOAL_COMM_OVERHEAD:.2f})")
        for name, ms in result.items():
            print(f"   {name:<48} {ms:8.2f} ms  x{ms / base:.3f}")
        report[kind] = result
    tracker.finish()
    dist.destroy_process_group()
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
