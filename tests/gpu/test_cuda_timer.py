"""The CUDA timer against a kernel of known duration (torch.cuda._sleep), on one GPU."""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.gpu


def _cycles_per_second() -> float:
    """torch.cuda._sleep spins for a number of GPU clock cycles: calibrate cycles -> seconds with events."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 50_000_000
    torch.cuda._sleep(1_000_000)  # warm up
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / (float(start.elapsed_time(end)) / 1000.0)


def test_cuda_timer_measures_a_kernel_of_known_duration_without_blocking_the_host() -> None:
    import torch

    from ingest_client.worker.timing import CudaTimer

    duration_s = 0.2
    cycles = int(duration_s * _cycles_per_second())
    timer = CudaTimer()
    rows: list[tuple[float, float]] = []
    torch.cuda.synchronize()
    host_before = time.time()
    token = timer.start()
    torch.cuda._sleep(cycles)
    timer.stop(token, lambda start, end: rows.append((start, end)))
    enqueued_s = time.time() - host_before
    assert enqueued_s < duration_s / 4, "start/stop only record events: the host did not wait for the kernel"
    assert timer.drain(10.0)
    ((start, end),) = rows
    assert end - start == pytest.approx(duration_s, rel=0.05)
    # wall-clock anchoring: the kernel ran between host_before and now, starting within a few ms of the record
    assert host_before - 0.005 <= start <= host_before + enqueued_s + 0.005
    assert end <= time.time() + 0.005


def test_cuda_timer_resolves_on_its_own_thread_once_the_gpu_is_done() -> None:
    import torch

    from ingest_client.worker.timing import CudaTimer

    cycles = int(0.05 * _cycles_per_second())
    timer = CudaTimer()
    rows: list[tuple[float, float]] = []
    for _ in range(5):
        token = timer.start()
        torch.cuda._sleep(cycles)
        timer.stop(token, lambda start, end: rows.append((start, end)))
    torch.cuda.synchronize()
    deadline = time.time() + 5.0
    while len(rows) < 5 and time.time() < deadline:
        time.sleep(0.01)
    assert len(rows) == 5, "the resolver thread emitted every interval without drain()"
    assert all(b - a == pytest.approx(0.05, rel=0.1) for a, b in rows)
    assert all(rows[i][1] <= rows[i + 1][0] + 1e-3 for i in range(4)), "back-to-back kernels, in order"
