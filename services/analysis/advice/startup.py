"""Startup: the time to the first step, and the cost of each restart (warm spares, a cached warm-up)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable

from services.analysis.advice.context import RunContext, count
from services.analysis.advice.figures import STARTUP, gpus_of
from services.schemas.advice import Confidence, Recommendation


def startup(run: RunContext) -> Iterable[Recommendation]:
    ledger, f = run.ledger, run.f
    if run.waste(STARTUP) <= 0:
        return
    wasted = run.waste(STARTUP)
    per = [(a.gpu_seconds.get(STARTUP, 0.0), gpus_of(a, ledger)) for a in ledger.attempts]
    first = per[0][0] / per[0][1] if per else None
    restarts = [gpu_s / gpus for gpu_s, gpus in per[1:] if gpu_s > 0]
    restart_gpu_s = sum(gpu_s for gpu_s, _ in per[1:])
    evidence = [run.ev("startup_gpu_seconds", "startup waste", wasted, "gpu_seconds"),
                run.ev("startup_share", "of the allocation", run.share(STARTUP), "ratio"),
                run.ev("first_startup_seconds", "first attempt to its first step", first, "seconds")]
    if restarts:
        mean = statistics.fmean(restarts)
        evidence += [run.ev("restarts", "restarts", len(restarts), "count"),
                     run.ev("mean_restart_seconds", "mean restart (failure to first step)", mean, "seconds"),
                     run.ev("restart_startup_gpu_seconds", "startup of the restarts", restart_gpu_s, "gpu_seconds")]
        wording = (f"Starting up took {f.percent(run.share(STARTUP))} of the allocation ({f.gpu_time(wasted)}): "
                   f"{f.duration(first or 0.0)} before the first step, then {f.duration(mean)} per restart over "
                   f"{count(f, len(restarts), 'restart')} ({f.gpu_time(restart_gpu_s)}). Keep warm spares (nodes "
                   "already in the job that take over from a failed one: torchrun --nnodes=MIN:MAX) and make a "
                   "restart cheap: cache compilation (TORCHINDUCTOR_FX_GRAPH_CACHE=1, the cache on shared storage), "
                   "load the checkpoint sharded (torch.distributed.checkpoint) rather than from one rank, pre-pull "
                   "the image.")
        saved, condition = restart_gpu_s, "every restart reached its first step at once"
        title = "Make restarts cheaper: warm spares, cached warm-up"
    else:
        wording = (f"Starting up took {f.percent(run.share(STARTUP))} of the allocation ({f.gpu_time(wasted)}), "
                   f"{f.duration(first or 0.0)} from the start to the first step. Shorten it: cache compilation "
                   "(TORCHINDUCTOR_FX_GRAPH_CACHE=1), load the checkpoint sharded (torch.distributed.checkpoint), "
                   "pre-pull the image and build the dataset index ahead of the job.")
        saved, condition = wasted, "the job reached its first step at once"
        title = "Shorten the time to the first step"
    yield run.rec(
        "startup", STARTUP, title=title, wording=wording, at_stake=wasted, evidence=evidence,
        model=("startup_removed", "Startup is process start, rendezvous, loading and warm-up before the first step "
                                  "(after every restart too); at most the time addressed is saved."),
        saved=saved, bound="at_most", condition=condition,
        confidence=Confidence(basis="bound", text=f"measured over {count(f, len(per), 'attempt')}; the saving is "
                                                  "an upper bound"),
        small=run.small_share(STARTUP, run.config.startup_share))
