"""Stragglers: the ranks (or the host) the flag rule found consistently slower, or uneven work when none was."""

from __future__ import annotations

from collections.abc import Iterable

from services.analysis.advice.context import RunContext, count, sentence
from services.schemas.advice import Confidence, Recommendation
from services.schemas.categories import WasteCategory

STRAGGLER = WasteCategory.STRAGGLER.value


def stragglers(run: RunContext) -> Iterable[Recommendation]:
    ledger, f, config = run.ledger, run.f, run.config
    if run.waste(STRAGGLER) <= 0:
        return
    small = run.small_share(STRAGGLER, config.straggler_share)
    wasted = run.waste(STRAGGLER)
    views = run.inp.views
    flagged = list(views.ranks.straggler_ranks) if views is not None else None
    by_rank = ledger.straggler_gpu_seconds_by_rank
    total = sum(by_rank.values())
    if flagged and total > 0:
        rows = {r.rank: r for r in views.ranks.rows} if views is not None else {}
        host_of = {rank: row.host for rank, row in rows.items() if row.host}
        cost = sum(by_rank.get(r, 0.0) for r in flagged)
        ordered = sorted(flagged, key=lambda r: -by_rank.get(r, 0.0))
        who = ", ".join(f"rank {r}" + (f" on host {host_of[r]}" if r in host_of else "") for r in ordered)
        title, act = _straggler_action(ordered, host_of)
        evidence = [run.ev("straggler_gpu_seconds", "straggler waste", wasted, "gpu_seconds"),
                    run.ev("straggler_share", "of the allocation", run.share(STRAGGLER), "ratio"),
                    run.ev("flagged_gpu_seconds", "carried by the flagged ranks", cost, "gpu_seconds"),
                    run.ev("flagged_share", "of the straggler waste", cost / total, "ratio")]
        median = views.ranks.median_compute_s if views is not None and views.ranks.heatmap is not None else None
        for r in sorted(flagged):
            if r in rows:
                evidence.append(run.ev(f"rank_{r}_median_compute_seconds", f"rank {r} median compute",
                                       rows[r].median_compute_s, "seconds"))
        if median is not None:
            evidence.append(run.ev("run_median_compute_seconds", "median compute of all ranks", median, "seconds"))
        yield run.rec(
            "straggler_rank", STRAGGLER, title=title,
            wording=(f"{who[0].upper()}{who[1:]} {'was' if len(flagged) == 1 else 'were'} consistently slower than "
                     f"the other ranks and carried {f.percent(cost / total)} of the {f.gpu_time(wasted)} the job "
                     f"spent waiting for its slowest rank. {act}."),
            at_stake=wasted, evidence=evidence,
            model=("flagged_ranks_keep_pace", "The straggler cost of a step is (slowest compute - median compute) x "
                                              "world size, charged to the slowest rank; if the flagged ranks kept "
                                              "pace, the cost charged to them goes (at most: another rank may then be "
                                              "the slowest by less). Flags: docs/ledger.md, 'Straggler'."),
            saved=cost, bound="at_most", condition=f"{who} kept pace with the others",
            confidence=Confidence(basis="bound", text=(
                f"{count(f, len(flagged), 'rank')} flagged by the straggler rule: slower than the others' median in "
                "at least 75% of at least 20 steps, not by chance (p < 0.01 / ranks), by at least 5% of the median "
                "compute")), small=small)
        return
    why = ("no rank was consistently slower than the others" if flagged is not None
           else "whether one rank was consistently slower is not known here "
                f"(GET /v1/runs/{ledger.run_id}/stragglers says)")
    yield run.rec(
        "straggler_spread", STRAGGLER, title="Even out the work per rank",
        wording=(f"Waiting for the slowest rank cost {f.percent(run.share(STRAGGLER))} of the allocation "
                 f"({f.gpu_time(wasted)}), and {why}: look at uneven batches (variable sequence lengths), data "
                 "loading stalls and per-rank work outside the model."),
        at_stake=wasted,
        evidence=[run.ev("straggler_gpu_seconds", "straggler waste", wasted, "gpu_seconds"),
                  run.ev("straggler_share", "of the allocation", run.share(STRAGGLER), "ratio")],
        model=("balanced_ranks", "If every rank took the median compute time in every step, no rank would wait: "
                                 "at most the whole straggler waste is saved."),
        saved=wasted, bound="at_most", condition="every rank took the median compute time in every step",
        confidence=Confidence(basis="bound", text="an upper bound: no single rank to blame"), small=small)


def cause_hosts(flagged: list[int], host_of: dict[int, str]) -> list[str]:
    """The hosts that are the cause: most of their ranks flagged, in a run of more than one host. A host with one
    slow rank among fast ones is not (the rank's GPU is), nor the only host of a one-node job."""
    ranks_on: dict[str, int] = {}
    for host in host_of.values():
        ranks_on[host] = ranks_on.get(host, 0) + 1
    if len(ranks_on) < 2:
        return []
    slow_on: dict[str, int] = {}
    for rank in flagged:
        if rank in host_of:
            slow_on[host_of[rank]] = slow_on.get(host_of[rank], 0) + 1
    return sorted(h for h, slow in slow_on.items() if slow > ranks_on[h] / 2)


def _straggler_action(ordered: list[int], host_of: dict[int, str]) -> tuple[str, str]:
    """The title and the action: drain the hosts that are the cause, look at the GPUs of the other slow ranks."""
    hosts = cause_hosts(ordered, host_of)
    lone = [r for r in ordered if host_of.get(r) not in hosts]
    named = ", ".join(f"rank {r}" + (f" (host {host_of[r]})" if r in host_of else "") for r in lone)
    check = (f"look at the GPU of {named} (nvidia-smi -q -d PERFORMANCE,ECC for throttling and memory errors, "
             "another process on it, its share of the data); if it stays slow, replace the GPU or exclude its "
             "node from the next allocation" if lone else "")
    if not hosts:
        title = f"Look at the GPU of {named}: slower than the other ranks"
        if not host_of:
            check += " (the run reported no host names: set GOODPUT_HOST to know where it ran)"
        return title, sentence(check)
    names = ", ".join(hosts)
    slow = ", ".join(f"rank {r}" for r in ordered if host_of.get(r) in hosts)
    title = f"Drain host{'s' if len(hosts) > 1 else ''} {names} ({slow})"
    act = (f"Drain {names}: most of {'their' if len(hosts) > 1 else 'its'} ranks are slow (Slurm: scontrol update "
           f"nodename={hosts[0]} state=drain reason=straggler; Kubernetes: kubectl cordon {hosts[0]}), then replace "
           f"it or exclude it from the next allocation (sbatch --exclude={','.join(hosts)}); check it for thermal or "
           "power throttling and a degraded NIC or link")
    return title, act + (f"; and {check}" if check else "")
