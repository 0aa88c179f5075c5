"""Why a failed attempt failed: the first failing rank, its host, exit status and signal, the error text and, after a
hang, the ranks the others waited for, each as the constructed events say; the launcher's observation changes no
GPU-second of the ledger."""

from __future__ import annotations

from typing import Any

from services.analysis.failures import signal_name
from services.analysis.ledger import build_ledger
from services.analysis.run_data import run_data_from_events
from services.analysis.views import build_run_views
from services.schemas.views import FailureCause, RunViews
from tests.analysis.scenarios import ev, per_rank, steps
from tests.ledger_checks import assert_partition

W = 4
GLOO = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
        "[127.0.0.1]:29500 (this may indicate a remote worker crashing)")


def two_attempts(failure: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """World 4 on hosts h0 (ranks 0-1) and h1 (ranks 2-3). Attempt 0: steps 1-20 from 5 to 25, then `failure`.
    Attempt 1 starts at 40, resumes from 0, steps 1-10 from 50 to 60 and completes."""
    events = [ev("allocation_start", 0, gpus=W), ev("allocation_end", 70)]
    for attempt, start in ((0, 0), (1, 40)):
        events += [ev("attempt_start", start, attempt=attempt, rank=r, world_size=W, host=f"h{r // 2}")
                   for r in range(W)]
        events += per_rank("resume", start, W, attempt=attempt, step=0)
    events += steps(0, W, 1, 20, 5)
    events += failure
    events += steps(1, W, 1, 10, 50)
    events += per_rank("attempt_end", 60, W, attempt=1, reason="completed")
    events.append(ev("run_end", 60, status="finished"))
    return events


def views_of(events: list[dict[str, Any]]) -> RunViews:
    data = run_data_from_events("s1", events)
    ledger = build_ledger(data)
    assert_partition(ledger)
    return build_run_views(data, ledger, version=1)


def cause_of(events: list[dict[str, Any]]) -> FailureCause:
    views = views_of(events)
    (restart,) = views.restarts
    (failure,) = views.timeline.failures
    assert restart.cause == failure.cause
    assert restart.cause is not None
    return restart.cause


def killed_rank_3() -> list[dict[str, Any]]:
    """Rank 3 (on h1) is SIGKILLed in step 21 at 25.5; ranks 0-2 hit gloo's closed connection at 26 (rank 0 reports
    it first), then torchrun stops them."""
    out = [ev("attempt_end", 26.0 + r / 100, attempt=0, rank=r, reason="failed", detail=GLOO) for r in range(3)]
    return out


def launcher_saw(rank: int, exit_code: int, time: float) -> dict[str, Any]:
    return ev("attempt_end", time, attempt=0, rank=rank, reason="failed", exit_code=exit_code,
              detail=f"torchrun: failed (exitcode: {exit_code}) local_rank: {rank % 2}")


def test_the_launchers_word_names_the_rank_its_signal_and_host_and_the_peers_error_is_shown() -> None:
    cause = cause_of(two_attempts([*killed_rank_3(), launcher_saw(3, -9, 26.2)]))
    assert (cause.rank, cause.basis, cause.host) == (3, "exit", "h1")
    assert (cause.exit_code, cause.signal) == (-9, "SIGKILL")
    assert (cause.error, cause.error_rank) == (GLOO, 0)  # rank 3 said nothing: the first error a rank sent


def test_without_the_launcher_the_rank_that_went_silent_first_is_named() -> None:
    cause = cause_of(two_attempts(killed_rank_3()))
    assert (cause.rank, cause.basis, cause.host) == (3, "silent", "h1")
    assert cause.exit_code is None and cause.signal is None
    assert cause.error == GLOO


def test_a_rank_that_raised_first_is_named_with_its_own_error() -> None:
    own = "ValueError: loss is NaN at step 21"
    failure = [ev("attempt_end", 25.2, attempt=0, rank=2, reason="failed", detail=own),
               launcher_saw(2, 1, 25.4)]
    failure += [ev("attempt_end", 25.6, attempt=0, rank=r, reason="failed", detail="SIGTERM") for r in (0, 1, 3)]
    cause = cause_of(two_attempts(failure))
    assert (cause.rank, cause.host, cause.exit_code, cause.signal) == (2, "h1", 1, None)
    assert (cause.error, cause.error_rank) == (own, 2)


def test_after_a_hang_the_ranks_behind_the_others_are_named() -> None:
    """Step 21: ranks 0, 2 and 3 started their 5th collective, rank 1 only its 3rd; nothing moves until the job is
    killed at 35 (no attempt_end)."""
    beats = [ev("heartbeat", 30, attempt=0, rank=r, step=21, collectives=3 if r == 1 else 5) for r in range(W)]
    cause = cause_of(two_attempts(beats))
    assert cause.hung_ranks == [1]
    assert cause.rank is None  # every rank went silent together: no first one to name


def test_the_launchers_word_changes_no_gpu_second_of_the_ledger() -> None:
    without = build_ledger(run_data_from_events("s1", two_attempts(killed_rank_3())))
    with_it = build_ledger(run_data_from_events("s1", two_attempts([*killed_rank_3(), launcher_saw(3, -9, 29.0)])))
    assert with_it.model_dump() == without.model_dump()


def test_negative_exit_codes_name_their_signal() -> None:
    assert [signal_name(c) for c in (-9, -6, -15, 1, 0, None)] == ["SIGKILL", "SIGABRT", "SIGTERM", None, None, None]
