"""The advice engine: what to change in a run, from its measured ledger. Every surface shows its output as it is
(`GET /v1/runs/{run_id}/advice`, `goodput advise`, the JSON and HTML reports, the run page).

    advice = build_advice(AdviceInput(ledger=ledger, views=views, resume_check=check, peers=project_ledgers),
                          formats)  # -> RunAdvice (services.schemas.advice)

Pure: no I/O, no clock. Numbers are written by the `Formats` the caller passes (services.reports.advice passes
services.presentation's functions, the ones the dashboard and the CLI use), so the wording is made here, once.

One rule per lever (docs/advice.md states each with its thresholds and a worked example):

- hung_now: the run is hung now (provisional hang): stop it; the urgent one, listed first.
- hang_timeout: failed attempts' hangs (last step to teardown) are cut to a shorter collective timeout T.
- straggler_rank / straggler_spread: ranks the flag rule found consistently slower, by rank and host (drain,
  replace, exclude), or uneven work when none was.
- checkpoint_interval: Young/Daly at the failure rate of this run (or of its project, pooled with runs of similar
  size, said so); a run that did not fail is never told to checkpoint more often because other runs failed.
- checkpoint_missing, checkpoint_async: no checkpoint at all; blocking writes.
- startup: restart cost (warm spares, cached warm-up).
- unused_gpus, idle_gaps: GPUs allocated beyond the world size ("8 of 32 GPUs never used"); other idle time.
- resume_correctness: the resume check flagged the run, or could not check a restart that loaded a checkpoint
  (unverified: nothing compared).
- queue: time waiting for the scheduler (no GPU time: no goodput prediction).
- clock_offset: a host whose clock is off (from the run's other hosts, measured from the step ends; or from the
  collector's, measured from the requests): check its NTP (no GPU time: the ledger took the offset out).

Predictions are of the measured run: following the advice does the same productive work P on `allocated - saved`,
so the predicted goodput is P / (A - saved), always written next to the measured one ("measured goodput X% -> Y%
if ...").
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

from services.analysis.interval import daly_interval, young_interval
from services.schemas.advice import (
    AdviceCode,
    AdviceModel,
    Confidence,
    Evidence,
    EvidenceUnit,
    FailureRateSource,
    Gain,
    GainBound,
    MeasuredRun,
    Recommendation,
    RunAdvice,
)
from services.schemas.categories import PRODUCTIVE, WasteCategory
from services.schemas.clocks import HostClock
from services.schemas.ledger import AttemptLedger, Ledger
from services.schemas.resume import ResumeCheck
from services.schemas.views import RunViews

__all__ = ["AdviceConfig", "AdviceInput", "FailureRate", "Formats", "build_advice", "failure_rate",
           "restart_seconds", "world_size"]

HANG = WasteCategory.HANG.value
STARTUP = WasteCategory.STARTUP.value
CHECKPOINT = WasteCategory.CHECKPOINT.value
REWORK = WasteCategory.REWORK.value
STRAGGLER = WasteCategory.STRAGGLER.value
IDLE = WasteCategory.IDLE.value


@dataclass(frozen=True, slots=True, kw_only=True)
class AdviceConfig:
    """Thresholds: a rule speaks only when its evidence is material (shares are of the allocated GPU-seconds)."""

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


@dataclass(frozen=True, slots=True, kw_only=True)
class FailureRate:
    mtbf_seconds: float
    source: FailureRateSource
    failures: int
    runs: int
    observed_seconds: float
    world_range: tuple[int, int] | None  # the world sizes pooled (project source)


# -- ledger figures --------------------------------------------------------------------------------------------


def world_size(ledger: Ledger) -> int:
    return max((a.world_size for a in ledger.attempts), default=0)


def restart_seconds(ledger: Ledger) -> float | None:
    """Wall seconds from a failure to useful work again: detection (hang) plus restart (startup of the
    attempts that followed a failure), per failure."""
    attempts = ledger.attempts
    if not ledger.failures or len(attempts) < 2:
        return None
    gpu_s = sum(a.gpu_seconds.get(STARTUP, 0.0) for a in attempts[1:])
    gpu_s += sum(a.gpu_seconds.get(HANG, 0.0) for a in attempts)
    world = world_size(ledger) or 1
    return gpu_s / world / ledger.failures


def failure_rate(ledger: Ledger, peers: Iterable[Ledger], min_failures: int = DEFAULT_CONFIG.min_failures
                 ) -> FailureRate | None:
    """The run's own MTBF when it failed at least `min_failures` times; else pooled with its project's runs of
    half to twice its world size when that adds failures and reaches `min_failures`; else the run's own from
    fewer failures (rough); None when neither the run nor its peers failed."""
    failures, wall = ledger.failures, ledger.allocated_wall_seconds
    if failures >= min_failures and wall > 0:
        return FailureRate(mtbf_seconds=wall / failures, source="run", failures=failures, runs=1,
                           observed_seconds=wall, world_range=None)
    size = world_size(ledger)
    similar = [p for p in peers if p.run_id != ledger.run_id and size and size / 2 <= world_size(p) <= size * 2]
    pooled = failures + sum(p.failures for p in similar)
    pooled_wall = wall + sum(p.allocated_wall_seconds for p in similar)
    if pooled >= min_failures and pooled > failures and pooled_wall > 0:
        return FailureRate(mtbf_seconds=pooled_wall / pooled, source="project", failures=pooled,
                           runs=len(similar) + 1, observed_seconds=pooled_wall,
                           world_range=(max(size // 2, 1), size * 2))
    if failures and wall > 0:
        return FailureRate(mtbf_seconds=wall / failures, source="run", failures=failures, runs=1,
                           observed_seconds=wall, world_range=None)
    return None


def _gpus_of(attempt: AttemptLedger, ledger: Ledger) -> int:
    """GPUs an attempt's claims count on: min(world size, GPUs of the allocation it runs in)."""
    held = [a.gpus for a in ledger.allocations if a.start < attempt.end and a.end > attempt.start]
    return max(min(attempt.world_size, max(held)) if held else attempt.world_size, 1)


def _mean_step_seconds(ledger: Ledger) -> float | None:
    """Mean wall seconds of a kept step (first rank's start to last rank's end), from the attempts' productive
    GPU-seconds before the straggler carve-out."""
    gpu_s = sum(a.gpu_seconds.get(PRODUCTIVE, 0.0) for a in ledger.attempts)
    steps = sum(a.steps_kept * _gpus_of(a, ledger) for a in ledger.attempts)
    return gpu_s / steps if steps > 0 and gpu_s > 0 else None


def unused_gpu_seconds(ledger: Ledger) -> tuple[float, int, int]:
    """(GPU-seconds of allocated GPUs no attempt's world used, GPUs, of which unused) over the allocations; the
    GPUs figures are those of the allocation that left the most GPU-seconds unused."""
    total, worst, gpus, unused = 0.0, -1.0, 0, 0
    for alloc in ledger.allocations:
        used = max((a.world_size for a in ledger.attempts if a.start < alloc.end and a.end > alloc.start), default=0)
        spare = max(alloc.gpus - used, 0)
        gpu_s = spare * max(alloc.end - alloc.start, 0.0)
        total += gpu_s
        if spare and gpu_s > worst:
            worst, gpus, unused = gpu_s, alloc.gpus, spare
    return min(total, ledger.waste_gpu_seconds[IDLE]), gpus, unused


# -- the engine ------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Run:
    inp: AdviceInput
    f: Formats
    config: AdviceConfig
    notes: list[str] = field(default_factory=list)

    @property
    def ledger(self) -> Ledger:
        return self.inp.ledger

    @property
    def allocated(self) -> float:
        return self.ledger.allocated_gpu_seconds

    def waste(self, category: str) -> float:
        return self.ledger.waste_gpu_seconds[category]

    def share(self, category: str) -> float:
        return self.waste(category) / self.allocated if self.allocated > 0 else 0.0

    def ev(self, key: str, label: str, value: float | int | str | None, unit: EvidenceUnit) -> Evidence:
        return Evidence(key=key, label=label, value=value, unit=unit, text=self.text(value, unit))

    def text(self, value: float | int | str | None, unit: EvidenceUnit) -> str:
        if value is None or isinstance(value, str):
            return "—" if value is None else value
        if unit == "gpu_seconds":
            return self.f.gpu_time(float(value))
        if unit == "seconds":
            return self.f.duration(float(value))
        if unit == "ratio":
            return self.f.percent(float(value))
        return self.f.integer(round(value))

    def gain(self, saved: float | None, bound: GainBound, condition: str) -> tuple[Gain, str]:
        """The gain on the measured run and the sentence that says it: measured goodput -> predicted goodput."""
        ledger, f = self.ledger, self.f
        measured = ledger.goodput
        allocated, productive = self.allocated, ledger.productive_gpu_seconds
        if saved is None or bound == "none" or measured is None or allocated <= 0:
            return Gain(bound="none", gpu_seconds=None, measured_goodput=measured, predicted_goodput=None,
                        goodput_points=None), condition
        saved = min(max(saved, 0.0), allocated - productive)
        up_to = "up to " if bound == "at_most" else ""
        if productive <= 0:  # nothing kept: the same work takes no time, a goodput cannot be predicted
            return Gain(bound=bound, gpu_seconds=saved, measured_goodput=measured, predicted_goodput=None,
                        goodput_points=None), (
                f"No goodput prediction: the run kept none of its work (measured goodput {f.percent(measured)}); "
                f"{up_to}{f.gpu_time(saved)} of the {f.gpu_time(allocated)} allocated would have been saved if "
                f"{condition}.")
        predicted = productive / (allocated - saved) if allocated - saved > 0 else 1.0
        sentence = (f"Measured goodput {f.percent(measured)} -> {up_to}{f.percent(predicted)} if {condition}: "
                    f"{up_to}{f.gpu_time(saved)} saved, the same work on {f.gpu_time(allocated - saved)} instead "
                    f"of the {f.gpu_time(allocated)} measured.")
        return Gain(bound=bound, gpu_seconds=saved, measured_goodput=measured, predicted_goodput=predicted,
                    goodput_points=(predicted - measured) * 100.0), sentence

    def rec(self, code: AdviceCode, category: str, *, title: str, wording: str, at_stake: float,
            evidence: list[Evidence], model: tuple[str, str], saved: float | None, bound: GainBound,
            condition: str, confidence: Confidence) -> Recommendation:
        gain, prediction = self.gain(saved, bound, condition)
        return Recommendation(code=code, category=category, title=title, wording=wording, prediction=prediction,
                              at_stake_gpu_seconds=at_stake, at_stake_text=self.f.gpu_time(at_stake),
                              evidence=[e for e in evidence if e.value is not None],  # what was measured
                              model=AdviceModel(name=model[0], statement=model[1]), gain=gain, confidence=confidence)


def build_advice(inp: AdviceInput, formats: Formats, config: AdviceConfig = DEFAULT_CONFIG) -> RunAdvice:
    """Every rule's recommendation for the run: the urgent one (hung now) first, then the largest GPU-seconds at
    stake first; `notes` say what was weighed and not advised."""
    run = _Run(inp, formats, config)
    recs: list[Recommendation] = []
    if run.allocated > 0:
        for rule in RULES:
            recs.extend(rule(run))
    recs.sort(key=lambda r: (r.code != "hung_now", -r.at_stake_gpu_seconds, -(r.gain.gpu_seconds or 0.0), r.code))
    return RunAdvice(run_id=inp.ledger.run_id, measured=_measured(run), recommendations=recs, notes=run.notes)


def _measured(run: _Run) -> MeasuredRun:
    ledger, f = run.ledger, run.f
    waste = ledger.waste_total_gpu_seconds
    if ledger.goodput is None:
        text = "Nothing allocated yet: no goodput to measure."
    else:
        evaluating = (f", {f.gpu_time(ledger.eval_gpu_seconds)} in evaluation (not waste)"
                      if ledger.eval_gpu_seconds > 0 else "")
        text = (f"Measured goodput {f.percent(ledger.goodput)}: {f.gpu_time(ledger.productive_gpu_seconds)} "
                f"productive of {f.gpu_time(run.allocated)} allocated, {f.gpu_time(waste)} wasted{evaluating}; "
                f"{_count(f, ledger.failures, 'failure')}.")
    return MeasuredRun(status=ledger.status, allocated_gpu_seconds=run.allocated,
                       productive_gpu_seconds=ledger.productive_gpu_seconds, waste_gpu_seconds=waste,
                       goodput=ledger.goodput, failures=ledger.failures, text=text)


def _count(f: Formats, n: int, noun: str) -> str:
    return f"{f.integer(n)} {noun}" + ("" if n == 1 else "s")


# -- rules ----------------------------------------------------------------------------------------------------


def _hung_now(run: _Run) -> Iterable[Recommendation]:
    provisional = run.ledger.provisional
    if not provisional:
        return
    f, ledger = run.f, run.ledger
    tail = ledger.running_tail
    gpus = tail.gpus if tail is not None else world_size(ledger)
    silent = provisional.as_of - provisional.since
    yield run.rec(
        "hung_now", HANG, title="The run is hung now: stop it",
        wording=(f"No progress for {f.duration(silent)} ({f.gpu_time(provisional.hang_gpu_seconds)} so far, booked "
                 f"as provisional hang on {_count(f, gpus, 'GPU')}). Look at the suspect ranks "
                 f"(GET /v1/runs/{ledger.run_id}/live, or py-spy dump on their processes), then stop the job or "
                 "let the collective timeout end it."),
        at_stake=provisional.hang_gpu_seconds,
        evidence=[run.ev("seconds_since_progress", "no progress for", silent, "seconds"),
                  run.ev("provisional_hang_gpu_seconds", "hang so far", provisional.hang_gpu_seconds, "gpu_seconds"),
                  run.ev("gpus", "GPUs held", gpus, "gpus")],
        model=("provisional_hang", "Live detection calls the run hung (no progress for longer than its threshold); "
                                   "the time since the last progress is booked as hang until the attempt ends "
                                   "(docs/ledger.md, 'Running runs')."),
        saved=None, bound="none",
        condition=(f"No prediction: the hang grows by {f.gpu_time(gpus * 60.0)} every minute until the job is "
                   "stopped."),
        confidence=Confidence(basis="measured", text="measured: no step, checkpoint or attempt event since then"))


def _hang_timeout(run: _Run) -> Iterable[Recommendation]:
    ledger, f, config = run.ledger, run.f, run.config
    episodes = [(a, _gpus_of(a, ledger)) for a in ledger.attempts if a.failed and a.gpu_seconds.get(HANG, 0.0) > 0]
    if run.share(HANG) < config.hang_share or not episodes:
        return
    lengths = [a.gpu_seconds[HANG] / gpus for a, gpus in episodes]
    step = _mean_step_seconds(ledger)
    delta = ledger.checkpoints.median_blocking_seconds
    floors = {"the floor: the first collectives of an attempt wait for every rank's loading and warm-up":
              config.timeout_floor_seconds}
    if step is not None:
        floors[f"{config.timeout_step_factor:g} x the mean step ({f.duration(step)}), rounded up to a minute"] = \
            config.timeout_step_factor * step
    if delta is not None:
        floors[f"{config.timeout_checkpoint_factor:g} x the median checkpoint write ({f.duration(delta)}), rounded up "
               "to a minute"] = \
            config.timeout_checkpoint_factor * delta
    why, need = max(floors.items(), key=lambda kv: kv[1])
    minutes = max(math.ceil(need / 60.0 - 1e-9), 1)
    timeout = minutes * 60.0
    saved = sum(gpus * max(h - timeout, 0.0) for (_, gpus), h in zip(episodes, lengths, strict=True))
    hang = run.waste(HANG)
    n = len(episodes)
    if saved < config.min_gain_share * run.allocated:
        run.notes.append(f"Hangs: {_count(f, n, 'hang')} of at most {f.duration(max(lengths))} each; a collective "
                         f"timeout of {f.duration(timeout)} would save less than {f.percent(config.min_gain_share)} "
                         "of the allocation, so no timeout advice.")
        return
    median = statistics.median(lengths)
    lasted = (f"1 hang lasted {f.duration(median)}" if n == 1 else
              f"{_count(f, n, 'hang')} lasted {f.duration(median)} (median; longest {f.duration(max(lengths))})")
    yield run.rec(
        "hang_timeout", HANG, title=f"Lower the collective timeout to {f.duration(timeout)}",
        wording=(f"{lasted} from the last step to the failure being torn down, {f.gpu_time(hang)} in all: the stuck "
                 f"job held its GPUs until the collective timeout fired. Set it to {f.duration(timeout)}: "
                 f"init_process_group(..., timeout=timedelta(minutes={f.integer(minutes)})) (PyTorch's default is "
                 f"10 min for NCCL, 30 min for other backends); {f.duration(timeout)} is {why}. Alert on "
                 "goodput_run_seconds_since_progress to hear of a hang before the timeout."),
        at_stake=hang,
        evidence=[run.ev("hangs", "hangs (failed attempts)", n, "count"),
                  run.ev("median_hang_seconds", "median hang", median, "seconds"),
                  run.ev("longest_hang_seconds", "longest hang", max(lengths), "seconds"),
                  run.ev("hang_gpu_seconds", "hang", hang, "gpu_seconds"),
                  run.ev("mean_step_seconds", "mean step", step, "seconds"),
                  run.ev("median_checkpoint_seconds", "median checkpoint write", delta, "seconds"),
                  run.ev("timeout_seconds", "proposed collective timeout", timeout, "seconds")],
        model=("timeout_cut", "A hang lasts from the last progress until the collective timeout fires and the job is "
                              "torn down; with a timeout T every hang longer than T ends at T: saving = sum over "
                              "hangs of GPUs x max(hang - T, 0). T must outlast the longest legitimate wait: "
                              f"the largest of {f.duration(config.timeout_floor_seconds)}, "
                              f"{config.timeout_step_factor:g} mean steps and "
                              f"{config.timeout_checkpoint_factor:g} checkpoint writes."),
        saved=saved, bound="expected", condition=f"every hang ended {f.duration(timeout)} after the last step",
        confidence=Confidence(basis="model", failures=n, runs=1,
                              text=f"measured over this run's {_count(f, n, 'hang')}"))


def _stragglers(run: _Run) -> Iterable[Recommendation]:
    ledger, f, config = run.ledger, run.f, run.config
    if run.share(STRAGGLER) < config.straggler_share:
        return
    wasted = run.waste(STRAGGLER)
    views = run.inp.views
    flagged = list(views.ranks.straggler_ranks) if views is not None else None
    by_rank = ledger.straggler_gpu_seconds_by_rank
    total = sum(by_rank.values())
    if flagged and total > 0:
        rows = {r.rank: r for r in views.ranks.rows} if views is not None else {}
        hosts = sorted({h for r in flagged if (h := rows[r].host if r in rows else None)})
        cost = sum(by_rank.get(r, 0.0) for r in flagged)
        ordered = sorted(flagged, key=lambda r: -by_rank.get(r, 0.0))
        who = ", ".join(f"rank {r}" + (f" on host {rows[r].host}" if r in rows and rows[r].host else "")
                        for r in ordered)
        ranks = ", ".join(f"rank {r}" for r in ordered)
        if hosts:
            names = ", ".join(hosts)
            title = f"Drain host{'s' if len(hosts) > 1 else ''} {names} ({ranks})"
            act = (f"Drain {names} (Slurm: scontrol update nodename={hosts[0]} state=drain reason=straggler; "
                   f"Kubernetes: kubectl cordon {hosts[0]}), then replace it or exclude it from the next allocation "
                   f"(sbatch --exclude={','.join(hosts)})")
        else:
            title = f"Replace the node of {ranks}"
            act = ("Find the node that ran it (the run reported no host names: set GOODPUT_HOST or report hosts) and "
                   "drain it, then replace it or exclude it from the next allocation")
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
                     f"spent waiting for its slowest rank. {act}; check it for thermal or power throttling, a "
                     "degraded NIC or link, or another process on its GPU."),
            at_stake=wasted, evidence=evidence,
            model=("flagged_ranks_keep_pace", "The straggler cost of a step is (slowest compute - median compute) x "
                                              "world size, charged to the slowest rank; if the flagged ranks kept "
                                              "pace, the cost charged to them goes (at most: another rank may then be "
                                              "the slowest by less). Flags: docs/ledger.md, 'Straggler'."),
            saved=cost, bound="at_most", condition=f"{who} kept pace with the others",
            confidence=Confidence(basis="bound", text=(
                f"{_count(f, len(flagged), 'rank')} flagged by the straggler rule: slower than the others' median in "
                "at least 75% of at least 20 steps, not by chance (p < 0.01 / ranks), by at least 5% of the median "
                "compute")))
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
        confidence=Confidence(basis="bound", text="an upper bound: no single rank to blame"))


def _checkpoint_interval(run: _Run) -> Iterable[Recommendation]:
    ledger, f, config = run.ledger, run.f, run.config
    ck = ledger.checkpoints
    delta, every, every_steps = ck.median_blocking_seconds, ck.median_interval_seconds, ck.median_interval_steps
    rework = run.waste(REWORK)
    if delta is None:
        which = "its failure" if ledger.failures == 1 else f"each of its {_count(f, ledger.failures, 'failure')}"
        if ledger.failures and rework > 0:
            yield run.rec(
                "checkpoint_missing", REWORK, title="Write checkpoints",
                wording=(f"The run wrote no checkpoint, so {which} restarted it from the beginning: "
                         f"{f.gpu_time(rework)} were computed again. Save the "
                         "model, optimizer, RNG and data-loader state periodically (torch.distributed.checkpoint) "
                         "and resume from the latest."),
                at_stake=rework,
                evidence=[run.ev("failures", "failures", ledger.failures, "count"),
                          run.ev("rework_gpu_seconds", "recomputed", rework, "gpu_seconds")],
                model=("resume_from_checkpoint", "With checkpoints a failure loses only the work since the last "
                                                 "one: at most all of the rework is saved (less the writes)."),
                saved=rework, bound="at_most", condition="every failure resumed from a recent checkpoint",
                confidence=Confidence(basis="bound", failure_rate_source="run", failures=ledger.failures, runs=1,
                                      observed_seconds=ledger.allocated_wall_seconds,
                                      text=f"this run's {_count(f, ledger.failures, 'failure')}"))
        return
    estimated = every is None or every - delta <= 0
    if not estimated and every is not None:
        now = every - delta  # compute seconds between two checkpoints
    elif ledger.failures and rework > 0 and world_size(ledger):
        now = 2.0 * rework / world_size(ledger) / ledger.failures  # a failure throws away half an interval
    else:
        run.notes.append("Checkpoint interval: no attempt wrote two checkpoints and no failure threw work away, so "
                         "the interval the run uses is not known.")
        return
    rate = failure_rate(ledger, run.inp.peers, config.min_failures)
    if rate is None:
        run.notes.append("Checkpoint interval: neither this run nor its project's runs of similar size failed, so "
                         "no failure rate to weigh it against; only the write cost matters (see checkpoint_async).")
        return
    mtbf = rate.mtbf_seconds
    best = daly_interval(delta, mtbf)
    young = young_interval(delta, mtbf)
    step_s = now / every_steps if every_steps and not estimated else _mean_step_seconds(ledger)

    def at(interval: float) -> str:
        steps = f" (about {f.integer(round(interval / step_s))} steps)" if step_s else ""
        return f"every {f.duration(interval)} of compute{steps}"

    def waste_per_work(interval: float) -> float:  # the first-order model without R, which cancels
        return delta / interval + interval / (2.0 * mtbf)

    saved = ledger.productive_gpu_seconds * (waste_per_work(now) - waste_per_work(best))
    more_often = best < now
    source = _rate_text(f, rate, config.min_failures)
    if ledger.failures == 0 and more_often:
        run.notes.append(f"No checkpoint-interval advice: this run did not fail. Its project's failure rate "
                         f"({source}) would call for checkpointing {at(best)} instead of {at(now)}; that rests on "
                         "other runs' failures, not this run's.")
        return
    if saved < config.min_gain_share * run.allocated:
        run.notes.append(f"Checkpoint interval: {at(now)} now, Daly's {at(best)} at an MTBF of {f.duration(mtbf)} "
                         f"({source}); the model expects less than {f.percent(config.min_gain_share)} of the "
                         "allocation from changing it.")
        return
    lead = (f"This run did not fail; at its project's failure rate ({source}) it checkpoints more often than it "
            "needs to. " if ledger.failures == 0 else "")
    now_text = at(now) + (f" (estimated: a failure threw away {f.duration(now / 2)} of compute on average, half an "
                          "interval)" if estimated else "")
    effect = ("A failure then throws away less work." if more_often
              else "Fewer writes block training; a failure throws away a little more.")
    estimate = (" The interval now is estimated as twice the compute a failure threw away (rework per failure): "
                "no attempt wrote two checkpoints." if estimated else "")
    caveat = (" The first-order model is optimistic when a write or a restart is this long next to the MTBF: check "
              "with `goodput simulate-interval`." if delta > 0.1 * mtbf or (restart_seconds(ledger) or 0.0) > 0.1 * mtbf
              else "")
    yield run.rec(
        "checkpoint_interval", CHECKPOINT,
        title=f"Checkpoint {'more' if more_often else 'less'} often: {at(best)}",
        wording=(f"{lead}Checkpoint {at(best)} instead of {now_text}: each write blocks training for "
                 f"{f.duration(delta)} and the run fails about every {f.duration(mtbf)} ({source}). {effect}"),
        at_stake=run.waste(CHECKPOINT) + rework,
        evidence=[run.ev("median_checkpoint_seconds", "median checkpoint write (delta)", delta, "seconds"),
                  run.ev("checkpoint_interval_seconds", "checkpoint start to next start", every, "seconds"),
                  run.ev("compute_interval_seconds", "compute between checkpoints now" + (
                      " (estimated: 2 x the compute a failure threw away)" if estimated else ""), now, "seconds"),
                  run.ev("mtbf_seconds", "mean time between failures (M)", mtbf, "seconds"),
                  run.ev("failures", "failures counted", rate.failures, "count"),
                  run.ev("young_seconds", "Young's interval", young, "seconds"),
                  run.ev("daly_seconds", "Daly's interval (advised)", best, "seconds"),
                  run.ev("checkpoint_gpu_seconds", "checkpoint waste", run.waste(CHECKPOINT), "gpu_seconds"),
                  run.ev("rework_gpu_seconds", "rework waste", rework, "gpu_seconds")],
        model=("young_daly", "Expected waste per unit of useful work w(T) = delta/T + (T/2 + R)/M (first order; the "
                             "restart cost R is the same for every interval T and cancels). Young: T = sqrt(2 delta "
                             "M); Daly: T = sqrt(2 delta M) (1 + sqrt(delta/2M)/3 + delta/18M) - delta. Saving = "
                             f"productive x (w(now) - w(Daly)).{estimate}{caveat}"),
        saved=saved, bound="expected", condition=f"it checkpoints {at(best)}",
        confidence=Confidence(basis="model", failure_rate_source=rate.source, failures=rate.failures, runs=rate.runs,
                              observed_seconds=rate.observed_seconds, text=source))


def _rate_text(f: Formats, rate: FailureRate, min_failures: int) -> str:
    seen = f"{_count(f, rate.failures, 'failure')} in {f.duration(rate.observed_seconds)}"
    if rate.source == "run":
        rough = (f", fewer than {f.integer(min_failures)}: a rough estimate"
                 if rate.failures < min_failures else "")
        return f"this run's failure rate: {seen}{rough}"
    low, high = rate.world_range or (0, 0)
    return (f"this run and {_count(f, rate.runs - 1, 'other run')} of its project with {f.integer(low)}-"
            f"{f.integer(high)} ranks: {seen}")


def _checkpoint_async(run: _Run) -> Iterable[Recommendation]:
    ledger, f = run.ledger, run.f
    if run.share(CHECKPOINT) < run.config.checkpoint_share:
        return
    wasted = run.waste(CHECKPOINT)
    ck = ledger.checkpoints
    yield run.rec(
        "checkpoint_async", CHECKPOINT, title="Save checkpoints asynchronously",
        wording=(f"Writing checkpoints blocked training for {f.percent(run.share(CHECKPOINT))} of the allocation "
                 f"({f.gpu_time(wasted)}; {_count(f, ck.count, 'checkpoint')}, "
                 f"{f.duration(ck.median_blocking_seconds or 0.0)} each (median)). Save asynchronously "
                 "(torch.distributed.checkpoint.async_save, or copy the state to host memory and write it from a "
                 "background thread): training then blocks only while the state is staged."),
        at_stake=wasted,
        evidence=[run.ev("checkpoint_gpu_seconds", "checkpoint waste", wasted, "gpu_seconds"),
                  run.ev("checkpoint_share", "of the allocation", run.share(CHECKPOINT), "ratio"),
                  run.ev("checkpoints", "checkpoints", ck.count, "count"),
                  run.ev("median_checkpoint_seconds", "median write", ck.median_blocking_seconds, "seconds")],
        model=("async_save", "An asynchronous save blocks only for the copy to host memory: at most all of the "
                             "blocking time is saved."),
        saved=wasted, bound="at_most", condition="no write blocked training",
        confidence=Confidence(basis="bound", text="an upper bound: the staging copy still blocks"))


def _startup(run: _Run) -> Iterable[Recommendation]:
    ledger, f = run.ledger, run.f
    if run.share(STARTUP) < run.config.startup_share:
        return
    wasted = run.waste(STARTUP)
    per = [(a.gpu_seconds.get(STARTUP, 0.0), _gpus_of(a, ledger)) for a in ledger.attempts]
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
                   f"{_count(f, len(restarts), 'restart')} ({f.gpu_time(restart_gpu_s)}). Keep warm spares (nodes "
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
        confidence=Confidence(basis="bound", text=f"measured over {_count(f, len(per), 'attempt')}; the saving is "
                                                  "an upper bound"))


def _unused_gpus(run: _Run) -> Iterable[Recommendation]:
    ledger, f = run.ledger, run.f
    unused_gpu_s, gpus, unused = unused_gpu_seconds(ledger)
    if not unused or unused_gpu_s < run.config.unused_gpu_share * run.allocated:
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
        confidence=Confidence(basis="measured", text="measured: the allocation's GPU count against the world size"))


def _idle_gaps(run: _Run) -> Iterable[Recommendation]:
    f = run.f
    gaps = run.waste(IDLE) - unused_gpu_seconds(run.ledger)[0]
    if run.allocated <= 0 or gaps / run.allocated < run.config.idle_share:
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
        confidence=Confidence(basis="bound", text="an upper bound: part of the gaps may be needed work"))


def _resume_correctness(run: _Run) -> Iterable[Recommendation]:
    check = run.inp.resume_check
    if check is not None and check.verdict == "unverified":
        yield _resume_unverified(run, check)
        return
    f = run.f
    if check is None or not check.flagged or not check.findings:
        return
    findings = check.findings
    kinds = ", ".join(sorted({x.code for x in findings}))
    since = check.gpu_seconds_since_first_finding
    yield run.rec(
        "resume_correctness", "correctness", title="Make resumes restore the whole training state",
        wording=(f"{_count(f, len(findings), 'resume finding')} ({kinds}); the first: {findings[0].message}. A resume "
                 "that restores only part of the state (optimizer buffers, RNG state, data position, step counter) "
                 "trains on without an error, but not on the run that was checkpointed: save and load all of it, "
                 f"and report digests (tracker.digest) to catch it. GET /v1/runs/{check.run_id}/resume-check has "
                 "the evidence."),
        at_stake=since,
        evidence=[run.ev("findings", "resume findings", len(findings), "count"),
                  run.ev("kinds", "kinds", kinds, "text"),
                  run.ev("gpu_seconds_since_first_finding", "trained since the first finding", since, "gpu_seconds")],
        model=("resume_check", "The resume check compares what a restart recomputed with the first computation "
                               "(docs/resume-check.md)."),
        saved=None, bound="none",
        condition=(f"No goodput prediction: this is about correctness, not time. {f.gpu_time(since)} of training "
                   "since the first finding ran on a state that differs from the one the run had."),
        confidence=Confidence(basis="measured", text=f"measured: {_count(f, len(findings), 'finding')}"))


def _resume_unverified(run: _Run, check: ResumeCheck) -> Recommendation:
    f = run.f
    unchecked = [r for r in check.resumes if not r.verified]
    since = check.gpu_seconds_since_first_unverified
    return run.rec(
        "resume_correctness", "correctness", title="Check each resume as it loads",
        wording=(f"{_count(f, len(unchecked), 'restart')} loaded a checkpoint and nothing could be compared: "
                 f"{check.reason}. A resume that restores only part of the state (optimizer buffers, RNG state, data "
                 "position, step counter) trains on without an error; whether these did is unknown. Digest the "
                 "complete state when you checkpoint it (tracker.digest(step, goodput.state_digest(...)) before "
                 "tracker.checkpoint(step)) and pass the digest of the state you loaded to tracker.resumed(step, "
                 "checkpoint_step=..., digest=...): each resume is then checked the moment it loads "
                 "(docs/resume-check.md)."),
        at_stake=since,
        evidence=[run.ev("unverified_restarts", "restarts not checked", len(unchecked), "count"),
                  run.ev("gpu_seconds_since_first_unverified", "trained since the first unchecked restart", since,
                         "gpu_seconds")],
        model=("resume_check", "The resume check compares what a restart recomputed, and the digest of the state "
                               "it loaded, with the first computation (docs/resume-check.md)."),
        saved=None, bound="none",
        condition=(f"No goodput prediction: this is about correctness, not time. {f.gpu_time(since)} of training "
                   "since the first unchecked restart ran on a state nobody compared with the one saved."),
        confidence=Confidence(basis="measured", text="measured: nothing arrived to compare"))


def _queue(run: _Run) -> Iterable[Recommendation]:
    ledger, f, config = run.ledger, run.f, run.config
    queue, wall = ledger.queue_seconds, ledger.allocated_wall_seconds
    if queue < config.queue_min_seconds or queue / (queue + wall) < config.queue_share:
        return
    allocations = sorted(ledger.allocations, key=lambda a: a.start)
    requeue = sum(max(b.start - a.end, 0.0) for a, b in pairwise(allocations))
    n_requeues = max(len(allocations) - 1, 0)
    requeued = (f"; {f.duration(requeue)} of it in {_count(f, n_requeues, 'requeue')}" if requeue > 0 else "")
    fix = ("Restart inside the allocation (torchrun --max-restarts) so a failure does not go back to the queue; "
           if requeue > 0 else "")
    measured = ledger.goodput
    yield run.rec(
        "queue", "queue", title="Wait less in the queue",
        wording=(f"The run waited {f.duration(queue)} for the scheduler, {f.percent(queue / (queue + wall))} of the "
                 f"time from submission to the end of its allocation{requeued}. {fix}ask for a partition or "
                 "reservation with free capacity, or for fewer GPUs if the job scales down."),
        at_stake=0.0,
        evidence=[run.ev("queue_seconds", "waiting in the queue", queue, "seconds"),
                  run.ev("allocated_wall_seconds", "holding GPUs", wall, "seconds"),
                  run.ev("requeue_seconds", "waiting after requeues", requeue, "seconds")],
        model=("queue_time", "Queue time holds no GPUs: it delays the result, it does not waste GPU time."),
        saved=None, bound="none",
        condition=(f"No goodput prediction: queue time holds no GPUs (goodput stays "
                   f"{f.percent(measured) if measured is not None else '—'}); the result would come "
                   f"{f.duration(queue)} sooner."),
        confidence=Confidence(basis="measured", text="measured: submission and allocation times"))


def _clock_offset(run: _Run) -> Iterable[Recommendation]:
    f, limit = run.f, run.config.clock_offset_s
    between = [c for c in run.ledger.clocks if abs(c.offset_seconds) >= limit]
    collector = [c for c in run.inp.collector_clocks if abs(c.offset_seconds) >= limit]
    if not between and not collector:
        return
    reference = sorted(c.host for c in run.ledger.clocks if c.offset_seconds == 0)
    against = (f"the run's reference clock ({', '.join(reference[:3])}{'…' if len(reference) > 3 else ''})"
               if reference else "the run's reference clock")
    said = [f"host {c.host}'s clock is {_offset_text(f, c.offset_seconds)} {against}" for c in between[:5]]
    said += [f"host {c.host}'s clock is {_offset_text(f, c.offset_seconds)} the collector's" for c in collector[:5]]
    worst = max((abs(c.offset_seconds) for c in (*between, *collector)), default=0.0)
    hosts = sorted({c.host for c in (*between, *collector)})
    yield run.rec(
        "clock_offset", "correctness", title="Set the hosts' clocks right: check their NTP",
        wording=(f"{_sentence('; '.join(said))}. Check NTP on "
                 f"{', '.join(hosts[:8])}{'…' if len(hosts) > 8 else ''} (chronyc tracking, timedatectl). The ledger "
                 "measured each host's offset from its ranks' step ends and took it out before painting, and live "
                 "detection measures runs on the collector's clock, so the figures hold; but logs, traces and "
                 "checkpoints stamped by these hosts disagree with the others' by as much."),
        at_stake=0.0,
        evidence=[run.ev("largest_offset_seconds", "largest clock offset", worst, "seconds"),
                  run.ev("hosts", "hosts off", len(hosts), "count")],
        model=("clock_offsets", "A synchronous step ends at the same true instant on every rank: a host whose ranks "
                                "end their steps later by the same amount has a clock ahead by it (docs/ledger.md, "
                                "'Clocks'); the collector compares a request's Goodput-Sent-At with its arrival."),
        saved=None, bound="none",
        condition="No goodput prediction: the ledger already took the offsets out; this is about the hosts' clocks.",
        confidence=Confidence(basis="measured", text="measured: step ends across hosts, request arrival times"))


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def _offset_text(f: Formats, offset: float) -> str:
    return f"{f.duration(abs(offset))} {'ahead of' if offset > 0 else 'behind'}"


RULES: tuple[Callable[[_Run], Iterable[Recommendation]], ...] = (
    _hung_now, _hang_timeout, _stragglers, _checkpoint_interval, _checkpoint_async, _startup, _unused_gpus,
    _idle_gaps, _resume_correctness, _queue, _clock_offset,
)
