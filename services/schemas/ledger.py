"""The ledger's type: what `build_ledger` returns, what storage keeps (as its JSON), what the API serves and what
every consumer (advice, reports, metrics, dashboard, CLI) reads. One definition; no dict travels in its place.

docs/ledger.md explains each figure. Seconds are wall seconds, GPU-seconds are seconds x GPUs, times are epoch seconds.
"""

from __future__ import annotations

from collections.abc import Iterator

from pydantic import BaseModel, ConfigDict, Field

from services.schemas.categories import WASTE_KEYS
from services.schemas.clocks import HostClock
from services.schemas.usage import Usage


def goodput_ratio(productive_gpu_seconds: float, allocated_gpu_seconds: float) -> float | None:
    """Goodput, the one definition: productive / allocated GPU-seconds, None when nothing was allocated. A run's
    (`Ledger.goodput`), a range's and a fleet's (the ratio of the sums, never a mean of ratios) alike."""
    return productive_gpu_seconds / allocated_gpu_seconds if allocated_gpu_seconds > 0 else None


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class WasteBreakdown(_Frozen):
    """GPU-seconds per waste category; reads like a mapping too (`waste[category]`, `waste.items()`)."""

    startup: float
    checkpoint: float
    rework: float
    hang: float
    straggler: float
    idle: float

    def __getitem__(self, category: str) -> float:
        if category not in WASTE_KEYS:
            raise KeyError(category)
        return float(getattr(self, category))

    def keys(self) -> list[str]:
        return list(WASTE_KEYS)

    def items(self) -> Iterator[tuple[str, float]]:
        return ((category, self[category]) for category in WASTE_KEYS)

    def total(self) -> float:
        return sum(self[category] for category in WASTE_KEYS)


class CheckpointSummary(_Frozen):
    count: int
    ok: int
    failed: int
    torn: int
    median_blocking_seconds: float | None
    median_interval_seconds: float | None
    median_interval_steps: float | None
    last_ok_step: int | None


class StepSummary(_Frozen):
    furthest: int | None
    kept: int
    reworked: int
    computed: int


class AttemptLedger(_Frozen):
    attempt: int
    start: float
    end: float
    end_reported: bool
    reason: str | None
    failed: bool
    world_size: int
    hosts: list[str]
    resume_step: int | None
    resume_reported: bool
    first_step: int | None
    last_step: int | None
    steps_kept: int
    steps_reworked: int
    gpu_seconds: dict[str, float] = Field(description="productive (before straggler), eval and each claimed waste "
                                          "category")


class Allocation(_Frozen):
    start: float
    end: float
    gpus: int
    open: bool
    reported: bool


class RunningTail(_Frozen):
    since: float = Field(description="start of the trailing time no claim covers (idle so far)")
    until: float = Field(description="the ledger's end (the run's latest event, or now with a provisional hang)")
    gpus: int = Field(description="GPUs the last attempt's claims count on")
    allocated_gpus: int
    grows: bool = Field(description="the allocation extends with time (open, or derived from the attempts)")


class ProvisionalHang(_Frozen):
    hang_gpu_seconds: float = Field(description="hang GPU-seconds booked provisionally (included in "
                                    "waste_gpu_seconds.hang): the run is flagged hung and its attempt has not ended")
    since: float = Field(description="the run's last progress (epoch seconds on the collector's clock, as as_of: "
                         "the hang so far is as_of - since)")
    as_of: float = Field(description="the collector's clock when it was booked; the figure grows with it")
    from_idle_gpu_seconds: float = Field(description="of it, time the stored ledger had booked as idle")
    added_allocated_gpu_seconds: float = Field(description="allocated GPU-seconds added from the ledger's end to as_of")


class StartupParts(_Frozen):
    """The startup waste split by what the attempts were doing (services.analysis.startup_parts; docs/ledger.md,
    "Startup, split"): the five add up to `waste_gpu_seconds.startup`."""

    relaunch: float = Field(description="before the attempt's processes started: the scheduler and container start for "
                            "the first, detection, teardown and relaunch after a failure for a restart")
    rendezvous: float = Field(description="process start to the process group being up (init_process_group)")
    restore: float = Field(description="process group up to the checkpoint loaded (the attempt's `resume`)")
    before_first_step: float = Field(description="checkpoint loaded to the first step's start: data loaders, model "
                                     "build and the rest of the setup")
    unsplit: float = Field(description="startup of attempts whose events lack the marker between two parts (no "
                           "init_process_group phase, or no resume): their parts together")


# the parts in words, as every surface and the advice write them
STARTUP_PART_LABELS: dict[str, str] = {
    "relaunch": "relaunch", "rendezvous": "rendezvous", "restore": "checkpoint load",
    "before_first_step": "before the first step", "unsplit": "not split (no marker)"}


class Ledger(_Frozen):
    run_id: str
    status: str
    allocated_gpu_seconds: float
    productive_gpu_seconds: float
    waste_gpu_seconds: WasteBreakdown
    eval_gpu_seconds: float = Field(0.0, description="validation / evaluation between steps (the `eval` phase): "
                                    "neither productive nor waste; productive + waste + eval = allocated")
    goodput: float | None = Field(description="productive / allocated; null when nothing was allocated")
    queue_seconds: float = Field(description="wall seconds waiting in the scheduler's queue (not GPU time)")
    allocated_wall_seconds: float
    at_risk_gpu_seconds: float = Field(description="a running run's work since its last checkpoint (in productive)")
    restarts: int
    failures: int
    mtbf_seconds: float | None
    checkpoints: CheckpointSummary
    steps: StepSummary
    straggler_gpu_seconds_by_rank: dict[int, float] = Field(description="straggler GPU-seconds per rank (ranks with "
                                                            "none are left out); JSON keys are the ranks as strings")
    attempts: list[AttemptLedger]
    allocations: list[Allocation]
    first_time: float | None
    latest_time: float | None
    running_tail: RunningTail | None = Field(None, description="a running run's trailing unclaimed time")
    usage: Usage | None = Field(None, description="when the GPU time went where: the figures above laid out on the "
                                "wall clock (services.analysis.usage); null in a ledger stored before it existed")
    provisional: ProvisionalHang | None = Field(None, description="present while the run is flagged hung: "
                                                "the hang so far, booked provisionally until the attempt ends")
    clocks: list[HostClock] = Field(default_factory=list, description="each host's clock offset from the run's "
                                    "reference clock, as measured from the step ends (hosts with steps)")
    startup_parts: StartupParts | None = Field(None, description=(
        "the startup waste split: relaunch, rendezvous, restore, before the first step (null in a ledger stored "
        "before it existed)"))

    @property
    def waste_total_gpu_seconds(self) -> float:
        return self.waste_gpu_seconds.total()
