"""Startup: the time to the first step and the cost of each restart; where the events split the startup
(the ledger's `startup_parts`), the largest parts by name, with their GPU time and what cuts each one."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from services.analysis.advice.causes import common_failure
from services.analysis.advice.context import RunContext, count
from services.analysis.advice.figures import STARTUP, gpus_of
from services.schemas.advice import Confidence, Evidence, Recommendation
from services.schemas.ledger import STARTUP_PART_LABELS, StartupParts

# what each part is (docs/ledger.md, "Startup, split", says where each begins and ends) and what cuts it
PART_SPANS: dict[str, str] = {
    "relaunch": ("the time before the processes started: the scheduler and the container start for the first "
                 "attempt; detection, teardown and relaunch after a failure"),
    "rendezvous": ("process start to the process group being up: imports, worker start and init_process_group "
                   "waiting for the last rank"),
    "restore": "the process group up to the checkpoint loaded (tracker.resumed())",
    "before_first_step": "the checkpoint loaded to the first step's start: model build, data loaders",
    "unsplit": ("startup whose events do not split it: no init_process_group phase (init() called after the "
                "process group was up) or no tracker.resumed()"),
}
PART_ACTIONS: dict[str, str] = {
    "relaunch": ("pre-pull the image onto the nodes, restart in place rather than through the scheduler's queue "
                 "(torchrun --max-restarts) and keep warm spares (torchrun --nnodes=MIN:MAX: nodes already in the "
                 "job take over from a failed one)"),
    "rendezvous": ("every rank waits for the slowest, so pre-pull the image and keep the Python environment on "
                   "local disk, start the nodes together rather than have many wait on one slow host, and with "
                   "torchrun --nnodes=MIN:MAX lower --rdzv-conf last_call_timeout (the wait for more nodes once MIN "
                   "have joined)"),
    "restore": ("load from local or faster storage, every rank reading its own shard in parallel "
                "(torch.distributed.checkpoint.load) rather than one rank reading and broadcasting"),
    "before_first_step": ("keep the data loader's workers across epochs (persistent_workers=True), build the "
                          "dataset index ahead of the job, build the model on the meta device, and keep the compile "
                          "cache across restarts (TORCHINDUCTOR_FX_GRAPH_CACHE=1, TORCHINDUCTOR_CACHE_DIR on shared "
                          "storage)"),
    "unsplit": ("call goodput's init() before init_process_group (goodput launch does) and tracker.resumed() once "
                "the checkpoint is loaded, and this advice names the part to cut"),
}


def ranked_parts(parts: StartupParts | None) -> list[tuple[str, float]]:
    """The parts with time in them, as (part, GPU-seconds), largest first (the order of the ledger's split on every
    surface: services.presentation.startup_split)."""
    if parts is None:
        return []
    return sorted(((k, v) for k, v in parts.model_dump().items() if v > 0), key=lambda kv: -kv[1])


def named_parts(parts: StartupParts | None) -> list[tuple[str, float]]:
    """The parts the advice names, as (part, GPU-seconds): the largest, and the next largest while those named hold
    less than half of the startup (two at most)."""
    ranked = ranked_parts(parts)
    total = sum(v for _, v in ranked)
    named = ranked[:1]
    if len(ranked) > 1 and ranked[0][1] * 2 < total:
        named.append(ranked[1])
    return named


@dataclass(slots=True)
class _Draft:
    title: str
    wording: str
    general: str  # what cuts startup in general: said when no part can be named
    saved: float
    condition: str
    evidence: list[Evidence]
    restarts: int


def startup(run: RunContext) -> Iterable[Recommendation]:
    if run.waste(STARTUP) <= 0:
        return
    draft = _timing(run)
    _name_parts(run, draft)
    failing = common_failure(run) if draft.restarts else None
    if failing is not None:
        draft.wording += " " + failing[0]
        draft.evidence += [run.ev(f"common_failure_{key}", f"most failures' {key}", str(shared.value), "text")
                           for key, shared in failing[1].items()]
    yield run.rec(
        "startup", STARTUP, title=draft.title, wording=draft.wording, at_stake=run.waste(STARTUP),
        evidence=draft.evidence,
        model=("startup_removed", "Startup is relaunch, process start and rendezvous, checkpoint load and the rest "
                                  "of the warm-up before the first step (after every restart too); at most the time "
                                  "addressed is saved."),
        saved=draft.saved, bound="at_most", condition=draft.condition,
        confidence=Confidence(basis="bound", text=f"measured over {count(run.f, len(run.ledger.attempts), 'attempt')}"
                                                  "; the saving is an upper bound"),
        small=run.small_share(STARTUP, run.config.startup_share))


def _timing(run: RunContext) -> _Draft:
    """The advice from the attempts' startup times: the first one, then the restarts'."""
    ledger, f, wasted = run.ledger, run.f, run.waste(STARTUP)
    per = [(a.gpu_seconds.get(STARTUP, 0.0), gpus_of(a, ledger)) for a in ledger.attempts]
    first = per[0][0] / per[0][1] if per else None
    restarts = [gpu_s / gpus for gpu_s, gpus in per[1:] if gpu_s > 0]
    restart_gpu_s = sum(gpu_s for gpu_s, _ in per[1:])
    evidence = [run.ev("startup_gpu_seconds", "startup waste", wasted, "gpu_seconds"),
                run.ev("startup_share", "of the allocation", run.share(STARTUP), "ratio"),
                run.ev("first_startup_seconds", "first attempt to its first step", first, "seconds"),
                *(run.ev(f"startup_{k}_gpu_seconds", f"startup: {STARTUP_PART_LABELS[k]}", v, "gpu_seconds")
                  for k, v in ranked_parts(ledger.startup_parts))]
    took = f"Starting up took {f.percent(run.share(STARTUP))} of the allocation ({f.gpu_time(wasted)})"
    if not restarts:
        return _Draft(
            title="Shorten the time to the first step",
            wording=f"{took}, {f.duration(first or 0.0)} from the start to the first step.",
            general=(" Shorten it: cache compilation (TORCHINDUCTOR_FX_GRAPH_CACHE=1), load the checkpoint sharded "
                     "(torch.distributed.checkpoint), pre-pull the image and build the dataset index ahead of the "
                     "job."),
            saved=wasted, condition="the job reached its first step at once", evidence=evidence, restarts=0)
    mean = statistics.fmean(restarts)
    evidence += [run.ev("restarts", "restarts", len(restarts), "count"),
                 run.ev("mean_restart_seconds", "mean restart (failure to first step)", mean, "seconds"),
                 run.ev("restart_startup_gpu_seconds", "startup of the restarts", restart_gpu_s, "gpu_seconds")]
    return _Draft(
        title="Make restarts cheaper: warm spares, cached warm-up",
        wording=(f"{took}: {f.duration(first or 0.0)} before the first step, then {f.duration(mean)} per restart "
                 f"over {count(f, len(restarts), 'restart')} ({f.gpu_time(restart_gpu_s)})."),
        general=(" Keep warm spares (nodes already in the job that take over from a failed one: torchrun "
                 "--nnodes=MIN:MAX) and make a restart cheap: cache compilation (TORCHINDUCTOR_FX_GRAPH_CACHE=1, the "
                 "cache on shared storage), load the checkpoint sharded (torch.distributed.checkpoint) rather than "
                 "from one rank, pre-pull the image."),
        saved=restart_gpu_s, condition="every restart reached its first step at once", evidence=evidence,
        restarts=len(restarts))


def _name_parts(run: RunContext, draft: _Draft) -> None:
    """Where the events split the startup: the largest parts by name, with what cuts each; the advice is then
    about them (its title, and a saving of at most their GPU time)."""
    named = named_parts(run.ledger.startup_parts)
    draft.wording += "".join(" " + _part_sentence(run, k, v, i) for i, (k, v) in enumerate(named))
    cuttable = [(k, v) for k, v in named if k != "unsplit"]
    if not cuttable:
        draft.wording += draft.general
        return
    plural = "" if len(cuttable) == 1 else "s"
    labels = ", ".join(STARTUP_PART_LABELS[k] for k, _ in cuttable)
    draft.title = f"Cut the startup's largest part{plural}: {labels}"
    draft.saved = sum(v for _, v in cuttable)
    draft.condition = f"the startup's largest part{plural} ({labels}) took no time"


def _part_sentence(run: RunContext, part: str, gpu_s: float, index: int) -> str:
    f, wasted = run.f, run.waste(STARTUP)
    which = "The largest part" if index == 0 else "The next"
    return (f"{which} is {STARTUP_PART_LABELS[part]}, {f.gpu_time(gpu_s)} ({f.percent(gpu_s / wasted)} of the "
            f"startup), {PART_SPANS[part]}. {'To cut it' if part != 'unsplit' else 'To split it'}: "
            f"{PART_ACTIONS[part]}.")
