"""Why each failed attempt failed, as far as its events say (docs/ledger.md, "Why an attempt failed").

Pure: the run's events (services.analysis.run_data) and its attempts in, one `FailureCause` per failed attempt out.
What the events allow:

- the exit status: an `attempt_end` with `exit_code` is what `goodput launch` saw torchrun report for a worker
  ("failed (exitcode: -9) local_rank: 1"); negative codes are the signal that killed it;
- the first failing rank: the worker whose exit torchrun saw first; without the launcher's word, the rank that
  stopped first: its own `attempt_end failed` with an error, or its last event (a heartbeat at the latest) when it
  sent none (a rank killed without a word goes silent while its peers still report);
- its host: the `host` of its `attempt_start`;
- the error text: the `detail` of a rank's own `attempt_end failed` (the client's excepthook sends
  "<Type>: <message>"), the failing rank's when it sent one, else the first one sent; a "SIGTERM" (torchrun stopping
  the survivors) is no error;
- after a hang, the ranks that hung: those behind the furthest rank when the attempt stopped (the step they were in,
  then the collectives they had started in it, from their last heartbeat or completed step): the others waited.

Each rank's last completed step comes from the step rows or, where the run keeps its steps per block, from its
blocks (`last_steps`): the two give the same causes. A long run's early blocks may be folded into a sketch
(services.analysis.rank_sketch), which keeps no rank's last step: a failed attempt there names its hung ranks from
the heartbeats alone.

Where the launcher wrote its workers' logs is not in the events: `log_hint` says where torchrun keeps them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from services.analysis.attempts import Attempt
from services.analysis.run_data import ranks_own
from services.analysis.step_summary import StepSummary
from services.schemas.views import FailureCause

_NOT_AN_ERROR = frozenset({"SIGTERM"})  # what a survivor says when torchrun stops it: the failure was elsewhere
# Linux's numbers (torchrun's workers run there), not the collector's own platform's
_LINUX_SIGNALS = {1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 4: "SIGILL", 5: "SIGTRAP", 6: "SIGABRT", 7: "SIGBUS",
                  8: "SIGFPE", 9: "SIGKILL", 10: "SIGUSR1", 11: "SIGSEGV", 12: "SIGUSR2", 13: "SIGPIPE", 14: "SIGALRM",
                  15: "SIGTERM", 24: "SIGXCPU", 25: "SIGXFSZ"}
LOG_HINT = ("torchrun keeps each worker's output under --log-dir (<log dir>/<run id>/attempt_<restart>/<local rank>/) "
            "when given; else it is in the launcher's output")


def build_failure_causes(events: pd.DataFrame, last_steps: dict[int, dict[int, int]],
                         attempts: Sequence[Attempt]) -> dict[int, FailureCause]:
    """attempt number -> why it failed, for every failed attempt. `last_steps`: attempt -> rank -> the last step
    the rank completed in it (`last_completed_steps`)."""
    failed = [a for a in attempts if a.failed]
    if not failed or events.empty:
        return {a.attempt: FailureCause() for a in failed}
    with_attempt = events[events["attempt"].notna()]
    keys = with_attempt["attempt"].to_numpy(np.int64)
    return {a.attempt: _cause(with_attempt[keys == a.attempt], last_steps.get(a.attempt, {})) for a in failed}


def last_completed_steps(steps: pd.DataFrame, summary: StepSummary | None) -> dict[int, dict[int, int]]:
    """attempt -> rank -> the last step the rank has a row for: from the step rows, or, when the run keeps them per
    block (`steps` empty), from its whole blocks (a block folded into a sketch no longer says which rank did what:
    its ranks are placed by their heartbeats alone)."""
    out: dict[int, dict[int, int]] = {}
    if not steps.empty:  # sorted by attempt, rank, step (RunStructure.steps): a rank's rows are one run of rows
        attempt, rank = steps["attempt"].to_numpy(np.int64), steps["rank"].to_numpy(np.int64)
        first = np.flatnonzero(np.r_[True, (attempt[1:] != attempt[:-1]) | (rank[1:] != rank[:-1])])
        last = np.maximum.reduceat(steps["step"].to_numpy(np.int64), first)
        for a, r, step in zip(attempt[first].tolist(), rank[first].tolist(), last.tolist(), strict=True):
            out.setdefault(a, {})[r] = step
        return out
    for block in summary.blocks if summary is not None else ():
        mine = out.setdefault(block.attempt, {})
        has_row = ~np.isnan(block.compute)  # ranks x steps
        for i, rank in enumerate(block.ranks.tolist()):
            stepped = block.steps[has_row[i]]
            if len(stepped):
                mine[rank] = max(mine.get(rank, int(stepped[-1])), int(stepped[-1]))
    return out


def signal_name(exit_code: int | None) -> str | None:
    """"SIGKILL" for -9: the signal a negative exit status names (None: an exit code, or unknown)."""
    if exit_code is None or exit_code >= 0:
        return None
    return _LINUX_SIGNALS.get(-exit_code, f"signal {-exit_code}")


def _cause(ev: pd.DataFrame, last_steps: dict[int, int]) -> FailureCause:
    observed = ev[(ev["kind"] == "attempt_end") & ev["exit_code"].notna() & ev["rank"].notna()]
    observed = observed[observed["exit_code"] != 0].sort_values(["time", "rank"])
    own = ranks_own(ev)
    errors = own[(own["kind"] == "attempt_end") & (own["reason"] == "failed") & own["rank"].notna()]
    errors = errors[errors["detail"].notna() & ~errors["detail"].isin(_NOT_AN_ERROR)].sort_values(["time", "rank"])
    exit_code: int | None = None
    rank: int | None
    basis: str | None
    if not observed.empty:
        rank = int(observed["rank"].to_numpy(np.float64)[0])
        exit_code = int(observed["exit_code"].to_numpy(np.float64)[0])
        basis = "exit"
    else:
        rank, basis = _first_to_stop(own, errors)
    error_rows = errors[errors["rank"] == rank] if rank is not None else errors.iloc[:0]
    if error_rows.empty:
        error_rows = errors
    error = str(error_rows.iloc[0]["detail"]) if not error_rows.empty else None
    error_rank = int(error_rows.iloc[0]["rank"]) if not error_rows.empty else None
    return FailureCause(
        rank=rank, basis=basis, host=_host_of(own, rank), exit_code=exit_code, signal=signal_name(exit_code),
        error=error, error_rank=error_rank, hung_ranks=_behind(own, last_steps), log_hint=LOG_HINT)


def _first_to_stop(own: pd.DataFrame, errors: pd.DataFrame) -> tuple[int | None, str | None]:
    """(the rank that stopped first, how that was told): the earliest of each rank's own failure report or, for a
    rank that sent no `attempt_end`, its last event; None when the ranks stopped together."""
    ranks = own[own["rank"].notna()]
    if ranks.empty:
        return None, None
    ended = set(ranks.loc[ranks["kind"] == "attempt_end", "rank"].astype(np.int64).tolist())
    last_seen = _extreme_by_rank(ranks["rank"].to_numpy(np.int64), ranks["time"].to_numpy(np.float64), np.maximum)
    stopped = {r: (t, "silent") for r, t in last_seen.items() if r not in ended}
    for r, t in _extreme_by_rank(errors["rank"].to_numpy(np.int64), errors["time"].to_numpy(np.float64),
                                 np.minimum).items():
        stopped[r] = (t, "error")
    if not stopped:
        return None, None
    times = sorted((t, r, how) for r, (t, how) in stopped.items())
    if len(times) > 1 and times[0][0] == times[1][0] and times[0][2] == times[1][2]:
        return None, None  # several stopped at one instant: no first one to name
    return times[0][1], times[0][2]


def _extreme_by_rank(ranks: np.ndarray, values: np.ndarray, pick: np.ufunc) -> dict[int, float]:
    """rank -> `pick` (np.maximum, np.minimum) of its values."""
    if not len(ranks):
        return {}
    order = np.argsort(ranks, kind="stable")
    ranks, values = ranks[order], values[order]
    first = np.flatnonzero(np.r_[True, ranks[1:] != ranks[:-1]])
    return dict(zip(ranks[first].tolist(), pick.reduceat(values, first).tolist(), strict=True))


def _host_of(own: pd.DataFrame, rank: int | None) -> str | None:
    if rank is None:
        return None
    hosts = own.loc[(own["kind"] == "attempt_start") & (own["rank"] == rank), "host"].dropna()
    return str(hosts.iloc[0]) if not hosts.empty else None


def _behind(own: pd.DataFrame, last_steps: dict[int, int]) -> list[int]:
    """The ranks behind the furthest one when the attempt stopped: (step in progress, collectives started in it),
    from each rank's last heartbeat and last completed step. Empty when every rank stood at one place (nothing
    says which one the others waited for)."""
    beats = own[(own["kind"] == "heartbeat") & own["rank"].notna() & own["step"].notna()].sort_values("time")
    position: dict[int, tuple[int, int]] = {}
    columns = (beats[c].to_numpy(np.float64) for c in ("rank", "step", "collectives"))
    for rank, step, collectives in zip(*columns, strict=True):  # time order: each rank's last heartbeat stays
        position[int(rank)] = (int(step), 0 if np.isnan(collectives) else int(collectives))
    for rank, last in last_steps.items():
        mine = (last + 1, 0)
        position[rank] = max(position.get(rank, mine), mine)
    if len(position) < 2:
        return []
    front = max(position.values())
    behind = sorted(r for r, p in position.items() if p < front)
    return behind if len(behind) < len(position) else []
