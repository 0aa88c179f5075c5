"""The engine: every rule's recommendations for the run, ranked by the GPU-seconds at stake.

Every run shows its largest actions: each material one (at or above its rule's threshold) and, up to
`AdviceConfig.top_actions`, the largest small ones, each saying plainly that it is small. The small ones not shown
become notes, so nothing weighed goes unsaid.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from services.analysis.advice import checkpoints, correctness, hang, idle, queue, startup, stragglers
from services.analysis.advice.config import DEFAULT_CONFIG, AdviceConfig, AdviceInput, Formats
from services.analysis.advice.context import RunContext, count
from services.schemas.advice import MeasuredRun, Recommendation, RunAdvice

Rule = Callable[[RunContext], Iterable[Recommendation]]

RULES: tuple[Rule, ...] = (
    hang.hung_now, hang.hang_timeout, stragglers.stragglers, checkpoints.checkpoint_interval,
    checkpoints.checkpoint_async, startup.startup, idle.unused_gpus, idle.idle_gaps, correctness.resume_correctness,
    queue.queue, correctness.clock_offset,
)


def build_advice(inp: AdviceInput, formats: Formats, config: AdviceConfig = DEFAULT_CONFIG) -> RunAdvice:
    """The run's recommendations: the urgent one (hung now) first, then the largest GPU-seconds at stake first;
    `notes` say what was weighed and not advised."""
    run = RunContext(inp, formats, config)
    recs: list[Recommendation] = []
    if run.allocated > 0:
        for rule in RULES:
            recs.extend(rule(run))
    shown, left = top_actions(recs, config.top_actions)
    notes = [*run.notes, *(f"{r.title}: at stake {r.at_stake_text} ({r.category}). {r.small}" for r in left)]
    return RunAdvice(run_id=inp.ledger.run_id, measured=_measured(run), recommendations=shown, notes=notes)


def rank(recs: Iterable[Recommendation]) -> list[Recommendation]:
    """Hung now first, then the most GPU-seconds at stake, then the largest expected saving."""
    return sorted(recs, key=lambda r: (r.code != "hung_now", -r.at_stake_gpu_seconds, -(r.gain.gpu_seconds or 0.0),
                                       r.code))


def top_actions(recs: Iterable[Recommendation], top: int) -> tuple[list[Recommendation], list[Recommendation]]:
    """(shown, left out): every material recommendation, and the small ones among the `top` largest."""
    ranked = rank(recs)
    shown = [r for i, r in enumerate(ranked) if r.small is None or i < top]
    return shown, [r for r in ranked if r not in shown]


def _measured(run: RunContext) -> MeasuredRun:
    ledger, f = run.ledger, run.f
    waste = ledger.waste_total_gpu_seconds
    if ledger.goodput is None:
        text = "Nothing allocated yet: no goodput to measure."
    else:
        evaluating = (f", {f.gpu_time(ledger.eval_gpu_seconds)} in evaluation (not waste)"
                      if ledger.eval_gpu_seconds > 0 else "")
        text = (f"Measured goodput {f.percent(ledger.goodput)}: {f.gpu_time(ledger.productive_gpu_seconds)} "
                f"productive of {f.gpu_time(run.allocated)} allocated, {f.gpu_time(waste)} wasted{evaluating}; "
                f"{count(f, ledger.failures, 'failure')}.")
    return MeasuredRun(status=ledger.status, allocated_gpu_seconds=run.allocated,
                       productive_gpu_seconds=ledger.productive_gpu_seconds, waste_gpu_seconds=waste,
                       goodput=ledger.goodput, failures=ledger.failures, text=text)
