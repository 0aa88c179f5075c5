"""Steps of a CUDA job timed on the GPU's timeline, and NCCL's collectives placed in their steps.

The GPU is simulated (tests/ingest_client/simulated_gpu.py): a host that never reads back runs ahead of it, and a
save waits for the queue, as on the H200 loops of the issue (``pytest -m gpu`` runs the same loops on a GPU:
tests/gpu/test_gpu_step_timing.py). Truth is kept by the test as it queues the work.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from ingest_client.worker import timing
from ingest_client.worker import tracker as tracker_module
from ingest_client.worker.timing import PREFILLED_EVENTS, CudaStepTimer
from tests.ingest_client.conftest import spooled_records
from tests.ingest_client.simulated_gpu import SimulatedGpu

KERNEL_S = 0.02  # one step's GPU work
WRITE_S = 0.2  # one checkpoint's write, after the state is off the GPU
STEPS, EVERY = 30, 10


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> SimulatedGpu:
    sim = SimulatedGpu()
    monkeypatch.setattr(tracker_module, "cuda_in_use", lambda: True)
    monkeypatch.setattr(tracker_module, "CudaStepTimer", lambda: CudaStepTimer(cuda=sim))
    return sim


def _train_without_read_back(tracker: Any, gpu: SimulatedGpu, spool: Path | None = None) -> dict[str, Any]:
    """The issue's third loop: no read-back inside the step, a blocking save every EVERY steps. Returns the truth:
    each step's interval on the GPU's timeline, each checkpoint's blocking interval, and (with ``spool``) the steps
    on disk when each save began."""
    truth: dict[str, Any] = {"steps": {}, "checkpoints": {}, "on_disk": {}}
    for step in range(1, STEPS + 1):
        with tracker.step(step) as s:
            begins = gpu.idle_at()  # the GPU reaches this step when it has run the work queued before it
            gpu.launch(KERNEL_S)
            truth["steps"][step] = (begins, gpu.idle_at())
            s.loss = 1.0 / step
        time.sleep(0.001)  # the host's own per-step work: it runs ahead of the GPU
        if step % EVERY == 0:
            blocked_from = gpu.idle_at()  # the loop is blocked from when the GPU has run the steps queued before
            with tracker.checkpoint(step):
                if spool is not None:
                    truth["on_disk"][step] = {s for r in spooled_records(spool) if r["kind"] == "steps"
                                              for s in r["step"]}
                gpu.synchronize_all()  # torch.save copies the tensors off the GPU: it waits for the queue
                time.sleep(WRITE_S)
                truth["checkpoints"][step] = (blocked_from, time.time())
    return truth


def test_a_cuda_jobs_steps_are_timed_on_the_gpu_and_a_checkpoint_blocks_only_for_its_write(
        make_tracker: Any, gpu: SimulatedGpu, tmp_path: Path) -> None:
    tracker = make_tracker(spool_dir=tmp_path / "spool")
    truth = _train_without_read_back(tracker, gpu, tmp_path / "spool")
    assert tracker.step_clock == "cuda"
    tracker.finish()

    records = spooled_records(tmp_path / "spool")
    rows = {step: (start, end) for r in records if r["kind"] == "steps"
            for step, start, end in zip(r["step"], r["start"], r["end"], strict=True)}
    assert sorted(rows) == list(range(1, STEPS + 1))
    for step, (start, end) in truth["steps"].items():
        assert rows[step] == pytest.approx((start, end), abs=0.002), f"step {step} on the GPU's timeline"
    starts = {r["step"]: r["time"] for r in records if r["kind"] == "checkpoint_start"}
    ends = {r["step"]: r["time"] for r in records if r["kind"] == "checkpoint_end"}
    for step, (blocked_from, done) in truth["checkpoints"].items():
        # blocked from when the GPU ran the queue (a few ms later on a loaded machine: the tracker's own entry)
        assert blocked_from - 0.003 <= starts[step] <= blocked_from + 0.02, "blocked from when the GPU ran the queue"
        assert done - 0.003 <= ends[step] <= done + 0.02

    # The checkpoint's durable write carries the steps the GPU finished before it: a save killed midway keeps them.
    for step in truth["checkpoints"]:
        assert truth["on_disk"][step] >= set(range(1, step + 1)), f"steps on disk as the save of {step} began"
    stats = [r for r in records if r["kind"] == "client_stats"]
    assert stats and stats[-1]["step_clock"] == "cuda"


def test_the_ledger_of_a_loop_without_read_back_matches_the_gpu_truth(
        make_tracker: Any, gpu: SimulatedGpu, tmp_path: Path) -> None:
    """Host clocks booked the queued steps' compute as checkpoint blocking (+38 % checkpoint, -23 % productive on
    the H200); on the GPU's timeline both are within 2 % of the truth."""
    pytest.importorskip("pandas")
    from tests.ledger_checks import assert_partition, ledger_of_events

    tracker = make_tracker(spool_dir=tmp_path / "spool", run_id="s1")
    truth = _train_without_read_back(tracker, gpu)
    tracker.finish("finished")
    ledger = ledger_of_events(spooled_records(tmp_path / "spool"))
    assert_partition(ledger)
    checkpoint = sum(done - start for start, done in truth["checkpoints"].values())
    productive = sum(end - start for start, end in truth["steps"].values())
    # within 2 % on a quiet machine; a loaded one delays the tracker's own entry into a checkpoint by a few ms
    assert ledger.waste_gpu_seconds["checkpoint"] == pytest.approx(checkpoint, rel=0.05)
    assert ledger.productive_gpu_seconds == pytest.approx(productive, rel=0.02)


def test_a_process_without_cuda_times_steps_with_the_hosts_clocks(make_tracker: Any, tmp_path: Path) -> None:
    tracker = make_tracker(spool_dir=tmp_path / "spool")
    before = time.time()
    with tracker.step(1):
        time.sleep(0.02)
    assert tracker.step_clock == "cpu"
    tracker.finish()
    records = spooled_records(tmp_path / "spool")
    ((start, end),) = [(s, e) for r in records if r["kind"] == "steps" for s, e in zip(r["start"], r["end"],
                                                                                       strict=True)]
    assert before <= start <= before + 0.01 and end - start == pytest.approx(0.02, abs=0.01)
    assert [r["step_clock"] for r in records if r["kind"] == "client_stats"][-1] == "cpu"


def test_a_cuda_step_clock_asked_for_where_there_is_no_cuda_falls_back_to_the_hosts(
        make_tracker: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    tracker = make_tracker(spool_dir=tmp_path / "spool", step_clock="cuda")
    with tracker.step(1):
        pass
    assert tracker.step_clock == "cpu"
    assert "steps are timed with the host's clocks: CUDA events are not available" in caplog.text


def test_a_step_that_raises_is_not_recorded_and_costs_no_event(
        make_tracker: Any, gpu: SimulatedGpu, tmp_path: Path) -> None:
    tracker = make_tracker(spool_dir=tmp_path / "spool")
    with tracker.step(1):
        gpu.launch(0.001)
    with pytest.raises(RuntimeError), tracker.step(2):
        raise RuntimeError("out of memory")
    with tracker.step(2):
        gpu.launch(0.001)
    tracker.finish()
    steps = [s for r in spooled_records(tmp_path / "spool") if r["kind"] == "steps" for s in r["step"]]
    assert steps == [1, 2]
    assert gpu.events_created == PREFILLED_EVENTS + 1, "the pool's events (and the anchor's) did for every step"


class _FakeNccl:
    """What NcclCollectiveTimer hands the tracker: completed collectives, the group's count of enqueued ones."""

    kind = "nccl"

    def __init__(self) -> None:
        self.completed: list[tuple[str, float, float, int | None]] = []
        self.count = 0
        self.installed = 0

    def take(self) -> list[tuple[str, float, float, int | None]]:
        out, self.completed = self.completed, []
        return out

    def enqueued(self) -> int | None:
        return self.count

    def resolve_ready(self) -> bool:
        return True

    def drain(self, timeout_s: float) -> bool:
        return True


@pytest.fixture
def nccl(monkeypatch: pytest.MonkeyPatch) -> _FakeNccl:
    fake = _FakeNccl()

    def install(found: Any) -> _FakeNccl:
        fake.installed += 1
        return fake

    monkeypatch.setattr(timing.NcclCollectiveTimer, "find", staticmethod(lambda group=None: ("group", "nccl")))
    monkeypatch.setattr(timing.NcclCollectiveTimer, "install", staticmethod(install))
    monkeypatch.setattr(tracker_module, "enqueued_collectives", lambda group: fake.count)
    return fake


def test_nccls_collectives_land_in_the_step_the_host_enqueued_them_in(
        make_tracker: Any, tmp_path: Path, nccl: _FakeNccl) -> None:
    tracker = make_tracker(spool_dir=tmp_path / "spool", heartbeat_interval_s=3600)
    assert tracker.time_collectives(max_overhead=None) == "nccl" and nccl.installed == 1
    enqueued: dict[int, list[float]] = {}
    for step in (1, 2, 3):
        with tracker.step(step):
            for _ in range(4):  # four buckets a step, enqueued by the host during its step
                time.sleep(0.002)
                enqueued.setdefault(step, []).append(time.time())
                nccl.count += 1
        time.sleep(0.002)
        nccl.completed.extend(("all_reduce", t, 0.001, 4 * (step - 1) + i + 1) for i, t in enumerate(enqueued[step]))
    with tracker.step(4):
        tracker.flush()  # the completions so far are taken
        nccl.count += 2  # two collectives of step 4 enqueued, still running
        assert tracker._collectives_started_in(4) == 2
    tracker.finish()
    records = spooled_records(tmp_path / "spool")
    rows = [(s, op, a, b) for r in records if r["kind"] == "collectives"
            for s, op, a, b in zip(r["step"], r["op"], r["start"], r["end"], strict=True)]
    assert sorted((s, a) for s, _, a, _ in rows) == sorted((s, t) for s, ts in enqueued.items() for t in ts)
    assert all(op == "all_reduce" and b - a == pytest.approx(0.001, abs=1e-5) for _, op, a, b in rows)
    assert [r["collective_clock"] for r in records if r["kind"] == "client_stats"][-1] == "nccl"


@pytest.mark.parametrize(("cost_us", "on"), [(10.0, True), (1_000.0, False)])
def test_nccls_timers_go_on_between_two_steps_only_if_they_cost_at_most_1_percent_of_a_step(
        make_tracker: Any, tmp_path: Path, nccl: _FakeNccl, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture, cost_us: float, on: bool) -> None:
    """4 collectives in a ~5 ms step: at 10 us each they cost 0.8 %, at 1 ms each 80 %."""
    monkeypatch.setattr(timing.NcclCollectiveTimer, "timing_cost_s", staticmethod(lambda: cost_us / 1e6))
    tracker = make_tracker(spool_dir=tmp_path / "spool", flush_interval_s=0.02)
    assert tracker.time_collectives() == "nccl"
    for step in range(1, 80):
        with tracker.step(step):
            nccl.count += 4
            time.sleep(0.005)
    assert nccl.installed == (1 if on else 0)
    assert tracker._nccl is (nccl if on else None)
    tracker.finish()
    stats = [r for r in spooled_records(tmp_path / "spool") if r["kind"] == "client_stats"]
    assert stats[-1]["collective_clock"] == ("nccl" if on else "off")
    assert ("NCCL's timers would cost" in caplog.text) is not on


def test_nccls_enqueue_times_on_the_steady_clock_or_the_system_clock_become_wall_time() -> None:
    import datetime
    import types

    from ingest_client.worker.timing import NcclCollectiveTimer

    timer = object.__new__(NcclCollectiveTimer)
    timer._done, timer.failed = __import__("collections").deque(), 0
    wall = time.time() - 3.0
    steady = datetime.timedelta(seconds=time.monotonic() - 3.0)  # torch 2.11: std::chrono::steady_clock
    system = datetime.datetime.fromtimestamp(wall)  # torch 2.13: std::chrono::system_clock
    for started, seq in ((steady, 7), (system, None)):
        timer._done.append(types.SimpleNamespace(op_type=types.SimpleNamespace(name="ALLREDUCE"), seq=seq,
                                                 time_started=started,
                                                 active_duration=datetime.timedelta(microseconds=250)))
    ((op1, start1, d1, seq1), (op2, start2, d2, seq2)) = timer.take()
    assert (op1, op2, seq1, seq2) == ("all_reduce", "all_reduce", 7, None)
    assert start1 == pytest.approx(wall, abs=0.01) and start2 == pytest.approx(wall, abs=1e-3)
    assert d1 == d2 == pytest.approx(0.00025)


def test_an_eval_phase_on_a_cuda_job_covers_its_own_gpu_work_and_none_of_the_steps(
        make_tracker: Any, gpu: SimulatedGpu, tmp_path: Path) -> None:
    """No read-back anywhere: without the waits, the steps queued before the evaluation would be booked as eval,
    and the evaluation's own GPU work as the next step."""
    tracker = make_tracker(spool_dir=tmp_path / "spool")
    for step in (1, 2, 3):
        with tracker.step(step):
            gpu.launch(KERNEL_S)
    eval_from = gpu.idle_at()  # when the GPU has run the three steps
    with tracker.phase("eval"):
        gpu.launch(0.05)  # the evaluation's forward passes, queued
        eval_to = gpu.idle_at()  # when the GPU will have run them
    with tracker.step(4):
        gpu.launch(KERNEL_S)
    step4_to = gpu.idle_at()
    tracker.finish()
    records = spooled_records(tmp_path / "spool")
    (start,) = [r["time"] for r in records if r["kind"] == "phase_start"]
    (end,) = [r["time"] for r in records if r["kind"] == "phase_end"]
    # from when the GPU ran the steps (or later, a host slowed by the machine's load), to when it ran the evaluation
    assert eval_from - 0.003 <= start <= eval_from + 0.02 and eval_to - 0.003 <= end <= eval_to + 0.02
    step4 = [(a, b) for r in records if r["kind"] == "steps" for s, a, b in zip(r["step"], r["start"], r["end"],
                                                                                  strict=True) if s == 4]
    assert step4[0][1] - step4[0][0] == pytest.approx(KERNEL_S, abs=0.003) and step4[0][1] == pytest.approx(
        step4_to, abs=0.003)
