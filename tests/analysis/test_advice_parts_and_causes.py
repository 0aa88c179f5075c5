"""The advice names the largest part of startup with its GPU time and what cuts it, the rank, host or signal most
failures share, and the ranks a hang waited for: constructed runs whose parts and causes are known by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from services import presentation as fmt
from services.analysis.ledger import build_ledger
from services.analysis.run_data import run_data_from_events
from services.analysis.views import build_run_views
from services.schemas.advice import RunAdvice
from services.schemas.ledger import Ledger
from tests.analysis.scenarios import ev, per_rank, steps
from tests.analysis.test_advice import advise, hang_events, only

W = 8


def advise_events(run_id: str, events: list[dict[str, Any]]) -> tuple[Ledger, RunAdvice]:
    data = run_data_from_events(run_id, events)
    ledger = build_ledger(data)
    return ledger, advise(ledger, views=build_run_views(data, ledger, version=1))


def gpu(ledger: Ledger, gpu_seconds: float) -> str:
    """A figure in the unit of the run's advice (its allocation's)."""
    return fmt.gpu_time(gpu_seconds, fmt.gpu_time_unit(ledger.allocated_gpu_seconds))


def one_attempt(group_up: float | None, loaded: float | None, first: float) -> list[dict[str, Any]]:
    """8 ranks on hosts h0 and h1, allocated from 0: the processes start at 5, the process group is up at
    `group_up` (the init_process_group phase; None: no phase), the checkpoint is loaded at `loaded` (None: no
    resume), steps 1-100 of 1 s run from `first`, and the attempt completes."""
    run, end = "split", first + 100
    out = [ev("allocation_start", 0, run, gpus=W), ev("allocation_end", end, run)]
    out += [ev("attempt_start", 5, run, attempt=0, rank=r, world_size=W, host=f"h{r // 4}") for r in range(W)]
    if group_up is not None:
        out += per_rank("phase_start", 5, W, run, attempt=0, name="init_process_group", step=0)
        out += per_rank("phase_end", group_up, W, run, attempt=0, name="init_process_group", step=0, ok=True)
    if loaded is not None:
        out += per_rank("resume", loaded, W, run, attempt=0, step=0)
    out += steps(0, W, 1, 100, first, run_id=run)
    out += per_rank("attempt_end", end, W, run, attempt=0, reason="completed")
    out.append(ev("run_end", end, run, status="finished"))
    return out


def test_a_slow_checkpoint_load_is_named_with_its_gpu_time_and_how_to_cut_it() -> None:
    # relaunch 0-5, rendezvous 5-10, restore 10-70, before the first step 70-75, on 8 GPUs
    ledger, advice = advise_events("split", one_attempt(10.0, 70.0, 75.0))
    assert ledger.waste_gpu_seconds["startup"] == pytest.approx(75 * W)
    rec = only(advice, "startup")
    assert rec.at_stake_gpu_seconds == pytest.approx(75 * W)  # the whole startup: its category
    assert rec.title == "Cut the startup's largest part: checkpoint load"
    assert (f"The largest part is checkpoint load, {gpu(ledger, 60 * W)} (80.0% of the startup), the process group "
            "up to the checkpoint loaded (tracker.resumed()). To cut it: load from local or faster storage, every "
            "rank reading its own shard in parallel (torch.distributed.checkpoint.load)") in rec.wording
    assert "The next" not in rec.wording
    assert rec.gain.bound == "at_most" and rec.gain.gpu_seconds == pytest.approx(60 * W)
    assert "if the startup's largest part (checkpoint load) took no time" in rec.prediction
    evidence = {e.key: e.value for e in rec.evidence}
    assert evidence["startup_restore_gpu_seconds"] == pytest.approx(60 * W)
    assert evidence["startup_relaunch_gpu_seconds"] == pytest.approx(5 * W)
    labels = [e.label for e in rec.evidence if e.key.startswith("startup_") and e.key.endswith("_gpu_seconds")
              and e.key != "startup_gpu_seconds"]
    assert labels == [f"startup: {label}" for label, _ in fmt.startup_split(ledger.startup_parts)]  # the ledger's


def test_two_parts_are_named_when_the_largest_holds_less_than_half() -> None:
    # relaunch 5, rendezvous 5, restore 30, before the first step 25 (s, on 8 GPUs): 240 of 520 GPU-s is under half
    ledger, advice = advise_events("split", one_attempt(10.0, 40.0, 65.0))
    rec = only(advice, "startup")
    assert rec.title == "Cut the startup's largest parts: checkpoint load, before the first step"
    assert f"The largest part is checkpoint load, {gpu(ledger, 30 * W)} (46.2% of the startup)" in rec.wording
    assert (f"The next is before the first step, {gpu(ledger, 25 * W)} (38.5% of the startup), the checkpoint loaded "
            "to the first step's start") in rec.wording
    assert "persistent_workers=True" in rec.wording and "TORCHINDUCTOR_FX_GRAPH_CACHE=1" in rec.wording
    assert rec.gain.gpu_seconds == pytest.approx(55 * W)


def test_a_slow_rendezvous_is_told_what_holds_it() -> None:
    ledger, advice = advise_events("split", one_attempt(50.0, 52.0, 55.0))  # rendezvous 5-50
    rec = only(advice, "startup")
    assert rec.title == "Cut the startup's largest part: rendezvous"
    assert f"The largest part is rendezvous, {gpu(ledger, 45 * W)} (81.8% of the startup)" in rec.wording
    assert "--rdzv-conf last_call_timeout" in rec.wording and "slow host" in rec.wording


def test_an_unsplit_startup_says_which_markers_would_split_it_and_keeps_the_general_advice() -> None:
    ledger, advice = advise_events("split", one_attempt(None, None, 75.0))
    assert ledger.startup_parts is not None and ledger.startup_parts.unsplit == pytest.approx(70 * W)
    rec = only(advice, "startup")
    assert rec.title == "Shorten the time to the first step"
    assert f"The largest part is not split (no marker), {gpu(ledger, 70 * W)} (93.3% of the startup)" in rec.wording
    assert "To split it: call goodput's init() before init_process_group" in rec.wording
    assert "pre-pull the image and build the dataset index" in rec.wording  # nothing split: the general levers
    assert rec.gain.gpu_seconds == pytest.approx(75 * W)


# -- failures: the rank, host or signal most of them share ---------------------------------------------------------


def failing_run(culprits: list[tuple[int, int]], hosts: int = 2) -> list[dict[str, Any]]:
    """8 ranks on `hosts` hosts; attempt i (one per culprit) starts at 100 i, loads at +10, steps 1-50 from +20 and
    fails at +75, the launcher seeing (rank, exit code) of its culprit first; a last attempt completes."""
    run, per_host = "failing", W // hosts
    out = [ev("allocation_start", 0, run, gpus=W)]
    for i in range(len(culprits) + 1):
        t = 100.0 * i
        out += [ev("attempt_start", t, run, attempt=i, rank=r, world_size=W, host=f"node{r // per_host}")
                for r in range(W)]
        out += per_rank("resume", t + 10, W, run, attempt=i, step=0)
        out += steps(i, W, 1, 50, t + 20, run_id=run)
        if i < len(culprits):
            rank, code = culprits[i]
            out.append(ev("attempt_end", t + 75, run, attempt=i, rank=rank, reason="failed", exit_code=code,
                          detail=f"torchrun: failed (exitcode: {code}) local_rank: {rank % per_host}"))
            out += [ev("attempt_end", t + 76, run, attempt=i, rank=r, reason="failed", detail="SIGTERM")
                    for r in range(W) if r != rank]
    end = 100.0 * len(culprits) + 70
    out += per_rank("attempt_end", end, W, run, attempt=len(culprits), reason="completed")
    out += [ev("run_end", end, run, status="finished"), ev("allocation_end", end, run)]
    return out


def test_restart_advice_names_the_host_rank_and_signal_most_failures_share() -> None:
    ledger, advice = advise_events("failing", failing_run([(5, -9), (5, -9), (2, -9)]))
    assert ledger.failures == 3
    rec = only(advice, "startup")
    assert rec.wording.endswith(
        "2 of the 3 failures began on host node1 (rank 5): check it (dmesg, nvidia-smi -q for ECC and Xid errors) or "
        "drain it before the next run; all 3 were killed by SIGKILL, which the kernel's OOM killer and a scheduler's "
        "kill send (check dmesg and the scheduler's log). Fewer failures mean fewer restarts to pay for.")
    evidence = {e.key: e.value for e in rec.evidence}
    assert (evidence["common_failure_host"], evidence["common_failure_rank"],
            evidence["common_failure_signal"]) == ("node1", "5", "SIGKILL")


def test_on_one_host_the_rank_is_named_not_the_host() -> None:
    _, advice = advise_events("failing", failing_run([(3, 1), (3, 1), (6, -9)], hosts=1))
    rec = only(advice, "startup")
    assert "2 of the 3 failures began with rank 3: look at what it does differently" in rec.wording
    assert "host" not in rec.wording.split("began")[1].split(".")[0] and "SIGKILL" not in rec.wording


def test_failures_that_share_nothing_name_nothing() -> None:
    # two on each host, four ranks, four exit statuses: none shared by more than half
    _, advice = advise_events("failing", failing_run([(1, -9), (6, 1), (2, -6), (5, -11)]))
    rec = only(advice, "startup")
    assert "failures began" not in rec.wording and "were killed by" not in rec.wording
    assert not any(e.key.startswith("common_failure_") for e in rec.evidence)


# -- hangs: the ranks the others waited for ------------------------------------------------------------------------


def test_the_hang_advice_names_the_rank_that_hung_and_its_host() -> None:
    events = hang_events()  # 8 ranks on h0, steps 1-100 end at 110, a checkpoint to 112, failure at 1,012
    events += [ev("heartbeat", 200, "hang", attempt=0, rank=r, step=101, collectives=2 if r == 6 else 7)
               for r in range(W)]
    _, advice = advise_events("hang", events)
    rec = only(advice, "hang_timeout")
    assert rec.wording.endswith("Rank 6 on host h0 was behind the others when the attempt stopped: the others "
                                "waited for it. Look at what it did then (py-spy dump on the process, nvidia-smi -q "
                                "on the GPU).")
    assert {e.key: e.value for e in rec.evidence}["hung_ranks"] == "rank 6 on host h0"


def test_a_hang_whose_ranks_stood_together_names_no_rank() -> None:
    _, advice = advise_events("hang", hang_events())
    rec = only(advice, "hang_timeout")
    assert "behind the others" not in rec.wording and "hung_ranks" not in {e.key for e in rec.evidence}


def test_the_docs_worked_startup_example_to_the_digit() -> None:
    _, advice = advise_events("split", one_attempt(10.0, 70.0, 75.0))
    rec = only(advice, "startup")
    docs = (Path(__file__).resolve().parents[2] / "docs" / "advice.md").read_text().replace("\n", " ")
    assert f'"{rec.title}"' in docs and rec.prediction in docs
