"""Idle: GPUs allocated beyond the world size, and the other idle time on the GPUs the job used."""

from __future__ import annotations

from collections.abc import Iterable

from services.analysis.advice.context import RunContext
from services.analysis.advice.figures import IDLE, unused_gpu_seconds
from services.schemas.advice import Confidence, Recommendation


def unused_gpus(run: RunContext) -> Iterable[Recommendation]:
    ledger, f = run.ledger, run.f
    unused_gpu_s, gpus, unused = unused_gpu_seconds(ledger)
    if not unused or unused_gpu_s <= 0:
        return
    used = gpus - unused
    yield run.rec(
        "unused_gpus", IDLE, title=f"{f.integer(unused)} of {f.integer(gpus)} GPUs never used",
        wording=(f"{f.integer(unused)} of {f.integer(gpus)} GPUs never used: the job ran {f.integer(used)} ranks on "
                 f"an allocation of {f.integer(gpus)} GPUs, so {f.gpu_time(unused_gpu_s)} "
                 f"({f.percent(unused_gpu_s / run.allocated)} of the allocation) sat idle. Allocate only "
                 f"{f.integer(used)} GPUs, or start {f.integer(gpus)} ranks (torchrun --nnodes / --nproc-per-node) to "
                 "use them."),
        at_stake=unused_gpu_s,
        evidence=[run.ev("allocated_gpus", "GPUs allocated", gpus, "gpus"),
                  run.ev("world_size", "ranks (world size)", used, "gpus"),
                  run.ev("unused_gpus", "GPUs never used", unused, "gpus"),
                  run.ev("unused_gpu_seconds", "idle on unused GPUs", unused_gpu_s, "gpu_seconds")],
        model=("right_size_allocation", "GPUs beyond the world size are idle for the whole allocation (docs/ledger.md: "
                                        "a claim counts on min(world size, allocated GPUs)); allocating only what the "
                                        "job uses saves all of it."),
        saved=unused_gpu_s, bound="expected", condition=f"only the {f.integer(used)} GPUs the job used were allocated",
        confidence=Confidence(basis="measured", text="measured: the allocation's GPU count against the world size"),
        small=run.below("idle on unused GPUs", unused_gpu_s, run.config.unused_gpu_share))


def idle_gaps(run: RunContext) -> Iterable[Recommendation]:
    f = run.f
    gaps = run.waste(IDLE) - unused_gpu_seconds(run.ledger)[0]
    if run.allocated <= 0 or gaps <= 0:
        return
    yield run.rec(
        "idle_gaps", IDLE, title="Name the idle time",
        wording=(f"{f.percent(gaps / run.allocated)} of the allocation ({f.gpu_time(gaps)}) was idle on GPUs the job "
                 "did use: gaps between steps (evaluation, logging, data loading outside the step) or the allocation "
                 "held before the first attempt or after the last step. Wrap long non-step work in a tracker span so "
                 "it is named, overlap data loading with compute, and end the allocation when the job ends."),
        at_stake=gaps,
        evidence=[run.ev("idle_gap_gpu_seconds", "idle on used GPUs", gaps, "gpu_seconds"),
                  run.ev("idle_gap_share", "of the allocation", gaps / run.allocated, "ratio")],
        model=("gaps_closed", "Idle time is allocated time no claim covers; at most all of it is saved."),
        saved=gaps, bound="at_most", condition="no allocated time passed outside the job's steps and writes",
        confidence=Confidence(basis="bound", text="an upper bound: part of the gaps may be needed work"),
        small=run.below("idle on the GPUs used", gaps, run.config.idle_share))
