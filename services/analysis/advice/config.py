"""The advice's inputs and thresholds: what the engine reads for one run, how it writes figures, and from which
share of the allocation each kind of advice is material."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from services.schemas.clocks import HostClock
from services.schemas.ledger import Ledger
from services.schemas.resume import ResumeCheck
from services.schemas.views import RunViews


@dataclass(frozen=True, slots=True, kw_only=True)
class AdviceConfig:
    """Thresholds (shares are of the allocated GPU-seconds): a recommendation below its threshold is *small*; it is
    still listed when it is among the run's `top_actions` largest by GPU-seconds at stake, and says it is small."""

    top_actions: int = 3  # every run shows at least its this many largest actions (those it has)
    min_failures: int = 3  # fewer in the run: pool its project's runs of similar size for the failure rate
    min_gain_share: float = 0.01  # a modelled change (interval, timeout) is advised from this expected saving on
    hang_share: float = 0.02
    straggler_share: float = 0.02
    checkpoint_share: float = 0.05  # blocking writes: save asynchronously
    startup_share: float = 0.05
    unused_gpu_share: float = 0.01  # GPUs beyond the world size: said from this share on
    idle_share: float = 0.10  # the rest of idle
    queue_min_seconds: float = 600.0
    queue_share: float = 0.25  # of the time from submission to the end of the allocation
    timeout_floor_seconds: float = 300.0  # the first collectives wait for every rank's loading and warm-up
    timeout_step_factor: float = 10.0  # the collective timeout must outlast this many mean steps
    timeout_checkpoint_factor: float = 2.0  # ... and this many checkpoint writes
    clock_offset_s: float = 1.0  # a host's clock this far off (from the others', or the collector's) is said

    def __post_init__(self) -> None:
        if self.top_actions < 1:
            raise ValueError(f"top_actions must be at least 1, got {self.top_actions}")
        if self.min_failures < 1:
            raise ValueError(f"min_failures must be at least 1, got {self.min_failures}")
        for name in ("min_gain_share", "hang_share", "straggler_share", "checkpoint_share", "startup_share",
                     "unused_gpu_share", "idle_share", "queue_share"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {value}")
        for name in ("queue_min_seconds", "timeout_floor_seconds", "timeout_step_factor",
                     "timeout_checkpoint_factor", "clock_offset_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


DEFAULT_CONFIG = AdviceConfig()


@dataclass(frozen=True, slots=True, kw_only=True)
class Formats:
    """How figures are written: services.presentation's functions (services.reports.advice.formats_for)."""

    gpu_time: Callable[[float], str]  # GPU-seconds, in the run's unit
    percent: Callable[[float], str]  # a ratio: 57.7%
    duration: Callable[[float], str]  # wall seconds: 12 min 05 s
    integer: Callable[[int], str]  # 1,234


@dataclass(frozen=True, slots=True, kw_only=True)
class AdviceInput:
    ledger: Ledger  # as GET /v1/runs/{id}/waste serves it (a hung run's provisional hang included)
    views: RunViews | None = None  # the run's views (hosts and straggler flags); None: not known
    resume_check: ResumeCheck | None = None
    peers: Sequence[Ledger] = ()  # ledgers of the run's project (the run itself is skipped): for the failure rate
    # each host's clock minus the collector's, as the collector measured it from the requests (its latest attempt)
    collector_clocks: Sequence[HostClock] = ()

