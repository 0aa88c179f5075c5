"""Recommendations: short, honest advice derived from a run's ledger (and, when given, its views).

Each provider is a function `(ReportInput) -> Iterable[Recommendation]`; `recommend()` runs a tuple of them
(`DEFAULT_PROVIDERS` unless told otherwise) and orders the advice by the GPU-seconds at stake. A new kind of
advice (for example a checkpoint-interval advisor after Young/Daly, weighing checkpoint cost against rework
given the run's MTBF) is one more provider appended to that tuple; nothing else changes.

A provider says nothing when its evidence is weak: every rule has a threshold on its category's share of the
allocated GPU-seconds (the constants below), and the advice names the numbers it rests on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from services.analysis.advice import checkpoint_advice
from services.analysis.categories import WasteCategory
from services.analysis.ledger_types import Ledger
from services.analysis.resume_types import ResumeCheck
from services.analysis.view_types import RunViews
from services.presentation import timestamp

CHECKPOINT_SHARE = 0.05  # checkpoint blocking above this share of allocated: checkpoint less often / async
HANG_SHARE = 0.02  # hang above this: lower the timeout / detect hangs
STRAGGLER_SHARE = 0.02  # straggler above this: look at the slow rank(s)
REWORK_SHARE = 0.05  # rework above this while ...
CHEAP_CHECKPOINT_SHARE = 0.02  # ... checkpoints cost less than this: checkpoint more often
STARTUP_SHARE = 0.05  # startup above this: look at restart time
IDLE_SHARE = 0.10  # idle above this: gaps between steps or GPUs beyond the world size
INTERVAL_GAIN = 0.01  # Young/Daly interval: advise only when the model expects this much more goodput


class Recommendation(BaseModel):
    model_config = ConfigDict(frozen=True)

    code: str  # stable identifier, e.g. "checkpoint_blocking"
    title: str
    detail: str
    gpu_seconds: float  # waste the advice addresses (what is at stake, not a promised saving)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportInput:
    ledger: Ledger  # as GET /v1/runs/{id}/waste serves it
    views: RunViews | None = None  # services.analysis.views.build_run_views(), when available
    resume_check: ResumeCheck | None = None  # GET /v1/runs/{id}/resume-check, when available

    def share(self, category: WasteCategory) -> float:
        allocated = self.ledger.allocated_gpu_seconds
        return self.waste(category) / allocated if allocated > 0 else 0.0

    def waste(self, category: WasteCategory) -> float:
        return self.ledger.waste_gpu_seconds[category.value]

    def host_of(self, rank: int) -> str | None:
        rows = self.views.ranks.rows if self.views is not None else []
        return next((r.host for r in rows if r.rank == rank), None)


Provider = Callable[[ReportInput], Iterable[Recommendation]]


def _hours(gpu_s: float) -> str:
    return f"{gpu_s / 3600:,.2f} GPU-h"


def checkpoint_blocking(inp: ReportInput) -> Iterable[Recommendation]:
    share = inp.share(WasteCategory.CHECKPOINT)
    if share < CHECKPOINT_SHARE:
        return
    wasted = inp.waste(WasteCategory.CHECKPOINT)
    median = inp.ledger.checkpoints.median_blocking_seconds
    interval = inp.ledger.checkpoints.median_interval_seconds
    facts = f"Writing checkpoints blocked training for {share:.1%} of the allocation ({_hours(wasted)})"
    if median is not None and interval is not None:
        facts += f": about {median:,.0f} s per checkpoint, one every {interval:,.0f} s"
    yield Recommendation(
        code="checkpoint_blocking", title="Checkpoint less often, or asynchronously",
        detail=facts + ". Save asynchronously (for example torch.distributed.checkpoint.async_save, or copy to "
               "host memory and write in a background thread) or lengthen the interval; weigh a longer interval "
               "against the rework a failure would cost.",
        gpu_seconds=wasted)


def hang_detection(inp: ReportInput) -> Iterable[Recommendation]:
    provisional = inp.ledger.provisional
    if provisional:  # flagged hung now: the most urgent advice whatever its share so far
        yield Recommendation(
            code="hung_now", title="The run is hung now",
            detail=f"No progress since {timestamp(provisional.since)} ({_hours(provisional.hang_gpu_seconds)} so "
                   "far, booked as provisional hang; it grows until the attempt ends). Look at the suspect ranks "
                   "(GET /v1/runs/{id}/live, or py-spy dump on their processes), then stop the job or let the "
                   "collective timeout end it; lower that timeout (init_process_group(timeout=...)) so the next "
                   "hang costs less.",
            gpu_seconds=inp.waste(WasteCategory.HANG))
        return
    share = inp.share(WasteCategory.HANG)
    if share < HANG_SHARE:
        return
    wasted = inp.waste(WasteCategory.HANG)
    yield Recommendation(
        code="hang_detection", title="Detect hangs sooner",
        detail=f"Failed attempts spent {share:.1%} of the allocation ({_hours(wasted)}, over {inp.ledger.failures} "
               "failure(s)) between their last step and being torn down. Lower the collective timeout "
               "(init_process_group(timeout=...), TORCH_NCCL_ASYNC_ERROR_HANDLING=1) to a few times the longest "
               "expected step, and alert on seconds since progress (goodput_run_seconds_since_progress).",
        gpu_seconds=wasted)


def straggler_ranks(inp: ReportInput) -> Iterable[Recommendation]:
    """Name a rank only when the flag rule (docs/ledger.md, "Straggler") found it consistently slower; the
    ledger's cost per rank alone cannot tell (with two ranks one of them always carries most of it)."""
    share = inp.share(WasteCategory.STRAGGLER)
    if share < STRAGGLER_SHARE:
        return
    wasted = inp.waste(WasteCategory.STRAGGLER)
    by_rank = inp.ledger.straggler_gpu_seconds_by_rank
    total = sum(by_rank.values())
    flagged = inp.views.ranks.straggler_ranks if inp.views is not None else None
    if flagged and total > 0:
        rank = max(flagged, key=lambda r: by_rank.get(int(r), 0.0))
        cost = by_rank.get(int(rank), 0.0)
        host = inp.host_of(rank)
        where = f"rank {rank}" + (f" on host {host}" if host else "")
        others = f" (also flagged: {', '.join(f'rank {r}' for r in sorted(flagged) if r != rank)})" \
            if len(flagged) > 1 else ""
        yield Recommendation(
            code="straggler_rank", title=f"Look at {where}",
            detail=f"Waiting for the slowest rank cost {share:.1%} of the allocation "
                   f"({_hours(wasted)}); {where} was consistently slower than the others and "
                   f"accounts for {cost / total:.0%} of it{others}. Check that host: thermal or power throttling, "
                   "a degraded link or NIC, another process on the GPU; exclude it from the next allocation if it "
                   "stays slow.",
            gpu_seconds=wasted)
        return
    spread = ("no rank was consistently slower than the others" if flagged is not None
              else "the ledger alone does not say whether one rank was consistently slower "
                   "(GET /v1/runs/{id}/stragglers does)")
    yield Recommendation(
        code="straggler_spread", title="Even out the work per rank",
        detail=f"Waiting for the slowest rank cost {share:.1%} of the allocation ({_hours(wasted)}), "
               f"and {spread}: look at uneven batches (variable sequence lengths), data loading stalls and "
               "per-rank work outside the model.",
        gpu_seconds=wasted)


def rework_vs_checkpoint(inp: ReportInput) -> Iterable[Recommendation]:
    share, checkpoint_share = inp.share(WasteCategory.REWORK), inp.share(WasteCategory.CHECKPOINT)
    if share < REWORK_SHARE or checkpoint_share >= CHEAP_CHECKPOINT_SHARE:
        return
    wasted = inp.waste(WasteCategory.REWORK)
    interval = inp.ledger.checkpoints.median_interval_steps
    every = f" (now every {interval:,.0f} steps)" if interval else ""
    yield Recommendation(
        code="checkpoint_more_often", title="Checkpoint more often",
        detail=f"Restarts threw away {share:.1%} of the allocation ({_hours(wasted)}) in recomputed "
               f"steps, while checkpoints cost only {checkpoint_share:.1%}. Saving more often{every} "
               "shortens what a failure throws away.",
        gpu_seconds=wasted)


def startup_time(inp: ReportInput) -> Iterable[Recommendation]:
    share = inp.share(WasteCategory.STARTUP)
    if share < STARTUP_SHARE:
        return
    wasted = inp.waste(WasteCategory.STARTUP)
    attempts = inp.ledger.restarts + 1
    yield Recommendation(
        code="startup_time", title="Shorten the time to the first step",
        detail=f"Starting up took {share:.1%} of the allocation ({_hours(wasted)}) over {attempts} "
               "attempt(s). Look at restart time: image pull and environment setup, dataset indexing, checkpoint "
               "loading (load only on one rank and broadcast, or read sharded) and compile warm-up (cache it).",
        gpu_seconds=wasted)


def idle_gpus(inp: ReportInput) -> Iterable[Recommendation]:
    share = inp.share(WasteCategory.IDLE)
    if share < IDLE_SHARE:
        return
    wasted = inp.waste(WasteCategory.IDLE)
    yield Recommendation(
        code="idle", title="Find the idle time",
        detail=f"{share:.1%} of the allocation ({_hours(wasted)}) was idle: gaps between steps "
               "(evaluation, logging, data loading outside the step) or GPUs allocated beyond the world size. "
               "Wrap long non-step work in the tracker so it is named, or allocate only what the job uses.",
        gpu_seconds=wasted)


def checkpoint_interval(inp: ReportInput) -> Iterable[Recommendation]:
    """Young/Daly: the interval that balances checkpoint cost against rework at the run's failure rate."""
    advice = checkpoint_advice(inp.ledger)
    current, daly = advice.option("current"), advice.option("daly")
    if current is None or daly is None:
        return
    gain = daly.expected_goodput - current.expected_goodput
    if gain < INTERVAL_GAIN:
        return
    yield Recommendation(
        code="checkpoint_interval", title="Change the checkpoint interval",
        detail=advice.summary[0].upper() + advice.summary[1:] + ".",
        gpu_seconds=gain * inp.ledger.allocated_gpu_seconds)


def resume_correctness(inp: ReportInput) -> Iterable[Recommendation]:
    """A restart that did not reproduce what it recomputed, or resumed or numbered its steps wrongly."""
    check = inp.resume_check
    if check is None or not check.flagged or not check.findings:
        return
    findings = check.findings
    kinds = ", ".join(sorted({f.code for f in findings}))
    yield Recommendation(
        code="resume_correctness", title="Make resumes restore the whole training state",
        detail=f"{len(findings)} resume finding(s) ({kinds}); the first: {findings[0].message}. A resume that "
               "restores only part of the state (optimizer buffers, RNG state, data position, step counter) trains "
               "on without an error, but not on the run that was checkpointed: save and load all of it, and report "
               "digests (tracker.digest) to catch it. GET /v1/runs/{run_id}/resume-check has the evidence.",
        gpu_seconds=check.gpu_seconds_since_first_finding)


DEFAULT_PROVIDERS: tuple[Provider, ...] = (
    checkpoint_blocking, hang_detection, straggler_ranks, rework_vs_checkpoint, startup_time, idle_gpus,
    checkpoint_interval, resume_correctness,
)


def recommend(inp: ReportInput, providers: Sequence[Provider] = DEFAULT_PROVIDERS) -> list[Recommendation]:
    """Every provider's advice, the largest GPU-seconds at stake first."""
    out = [r for provider in providers for r in provider(inp)]
    return sorted(out, key=lambda r: -r.gpu_seconds)
