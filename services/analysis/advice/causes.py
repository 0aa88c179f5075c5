"""What the failure causes (services.analysis.failures, in the views) say to the advice: the rank, host or signal
most of a run's failures share, and the ranks its hangs waited for."""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from services.analysis.advice.context import RunContext, sentence
from services.schemas.views import FailureCause


@dataclass(frozen=True, slots=True)
class Shared:
    """A value most of the failures share: `count` of `total` failures."""

    value: Hashable
    count: int
    total: int


def causes(run: RunContext) -> dict[int, FailureCause]:
    """attempt -> why it failed, for the failed attempts the views list (none without views)."""
    views = run.inp.views
    if views is None:
        return {}
    return {f.attempt: f.cause for f in views.timeline.failures if f.cause is not None}


def hosts_of_ranks(run: RunContext) -> dict[int, str]:
    views = run.inp.views
    if views is None:
        return {}
    return {r.rank: r.host for r in views.ranks.rows if r.host}


def shared(values: Sequence[Hashable | None], total: int) -> Shared | None:
    """The value more than half of `total` failures share, and at least two of them; None when none does."""
    counted = Counter(v for v in values if v is not None)
    if not counted:
        return None
    value, n = counted.most_common(1)[0]
    return Shared(value, n, total) if n >= 2 and n * 2 > total else None


def common_failure(run: RunContext) -> tuple[str, dict[str, Shared]] | None:
    """The sentence that says which rank, host or signal most failures share and what to look at, and what it
    rests on (host, rank, signal -> shared); None when no value is shared by most of them. A host is named only in
    a run of more than one host (on one host every failure is on it)."""
    found = list(causes(run).values())
    total = len(found)
    if total < 2:
        return None
    many_hosts = len({h for a in run.ledger.attempts for h in a.hosts}) > 1
    by = {"host": shared([c.host for c in found], total) if many_hosts else None,
          "rank": shared([c.rank for c in found], total),
          "signal": shared([c.signal for c in found], total)}
    common = {k: v for k, v in by.items() if v is not None}
    if not common:
        return None
    f, said = run.f, []
    host, rank, signal = common.get("host"), common.get("rank"), common.get("signal")

    def of(s: Shared) -> str:
        return (f"all {f.integer(s.total)}" if s.count == s.total else
                f"{f.integer(s.count)} of the {f.integer(s.total)}")

    if host is not None:
        with_rank = f" (rank {rank.value})" if rank is not None else ""
        said.append(f"{of(host)} failures began on host {host.value}{with_rank}: check it (dmesg, nvidia-smi -q for "
                    "ECC and Xid errors) or drain it before the next run")
    elif rank is not None:
        said.append(f"{of(rank)} failures began with rank {rank.value}: look at what it does differently (its data "
                    "shard, its GPU with nvidia-smi -q)")
    if signal is not None:
        why = (", which the kernel's OOM killer and a scheduler's kill send (check dmesg and the scheduler's log)"
               if signal.value == "SIGKILL" else " (the workers' own output has the trace: torchrun --log-dir)")
        said.append(f"{of(signal)}{'' if said else ' failures'} were killed by {signal.value}{why}")
    return sentence("; ".join(said)) + ". Fewer failures mean fewer restarts to pay for.", common


def hung_ranks(run: RunContext, attempts: Sequence[int]) -> tuple[str, str] | None:
    """The sentence that names the ranks the hangs of these failed attempts waited for, with their hosts, and those
    ranks as evidence writes them (`rank 5 on host node01`); None when the causes name none."""
    known = causes(run)
    behind = [known[a].hung_ranks for a in attempts if a in known and known[a].hung_ranks]
    if not behind:
        return None
    counted = Counter(r for ranks in behind for r in ranks)
    hosts = hosts_of_ranks(run)
    f, n = run.f, len(attempts)

    def who(rank: int) -> str:
        return f"rank {rank}" + (f" on host {hosts[rank]}" if rank in hosts else "")

    listed = sorted(counted, key=lambda r: (-counted[r], r))
    shown = [who(r) + ("" if n == 1 else f" ({f.integer(counted[r])} of {f.integer(n)} hangs)") for r in listed[:4]]
    more = f" and {f.integer(len(listed) - 4)} more" if len(listed) > 4 else ""
    one = len(listed) == 1
    subject = f"{shown[0]} was" if one else f"{', '.join(shown)}{more} were"
    said = (f"{sentence(subject)} behind the others when the attempt{'' if n == 1 else 's'} stopped: the others "
            f"waited for {'it' if one else 'them'}. Look at what {'it' if one else 'they'} did then (py-spy dump on "
            "the process, nvidia-smi -q on the GPU).")
    return said, ", ".join(who(r) for r in listed)
