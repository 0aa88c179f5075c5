"""Checkpoints: the interval (Young/Daly at the run's failure rate, or its project's), none written at all, and
blocking writes (save asynchronously)."""

from __future__ import annotations

from collections.abc import Iterable

from services.analysis.advice.config import Formats
from services.analysis.advice.context import RunContext, count
from services.analysis.advice.figures import FailureRate, failure_rate, mean_step_seconds, restart_seconds, world_size
from services.analysis.interval import daly_interval, young_interval
from services.schemas.advice import Confidence, Recommendation
from services.schemas.categories import WasteCategory

CHECKPOINT = WasteCategory.CHECKPOINT.value
REWORK = WasteCategory.REWORK.value


def checkpoint_interval(run: RunContext) -> Iterable[Recommendation]:
    ledger, f, config = run.ledger, run.f, run.config
    ck = ledger.checkpoints
    delta, every, every_steps = ck.median_blocking_seconds, ck.median_interval_seconds, ck.median_interval_steps
    rework = run.waste(REWORK)
    if delta is None:
        which = "its failure" if ledger.failures == 1 else f"each of its {count(f, ledger.failures, 'failure')}"
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
                                      text=f"this run's {count(f, ledger.failures, 'failure')}"))
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
    step_s = now / every_steps if every_steps and not estimated else mean_step_seconds(ledger)

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
    small = run.small_gain(saved, config.min_gain_share)
    if saved <= 0 or (small and rate.source == "project"):  # other runs' failures: said only when material
        expects = "nothing" if saved <= 0 else f"less than {f.percent(config.min_gain_share)} of the allocation"
        run.notes.append(f"Checkpoint interval: {at(now)} now, Daly's {at(best)} at an MTBF of {f.duration(mtbf)} "
                         f"({source}); the model expects {expects} from changing it.")
        return
    # checkpointing more often acts on the rework a failure throws away, less often on the writes
    category = REWORK if more_often else CHECKPOINT
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
        "checkpoint_interval", category,
        title=f"Checkpoint {'more' if more_often else 'less'} often: {at(best)}",
        wording=(f"{lead}Checkpoint {at(best)} instead of {now_text}: each write blocks training for "
                 f"{f.duration(delta)} and the run fails about every {f.duration(mtbf)} ({source}). {effect}"),
        at_stake=run.waste(category),
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
                              observed_seconds=rate.observed_seconds, text=source),
        small=small)


def _rate_text(f: Formats, rate: FailureRate, min_failures: int) -> str:
    seen = f"{count(f, rate.failures, 'failure')} in {f.duration(rate.observed_seconds)}"
    if rate.source == "run":
        rough = (f", fewer than {f.integer(min_failures)}: a rough estimate"
                 if rate.failures < min_failures else "")
        return f"this run's failure rate: {seen}{rough}"
    low, high = rate.world_range or (0, 0)
    return (f"this run and {count(f, rate.runs - 1, 'other run')} of its project with {f.integer(low)}-"
            f"{f.integer(high)} ranks: {seen}")


def checkpoint_async(run: RunContext) -> Iterable[Recommendation]:
    ledger, f = run.ledger, run.f
    if run.waste(CHECKPOINT) <= 0:
        return
    wasted = run.waste(CHECKPOINT)
    ck = ledger.checkpoints
    yield run.rec(
        "checkpoint_async", CHECKPOINT, title="Save checkpoints asynchronously",
        wording=(f"Writing checkpoints blocked training for {f.percent(run.share(CHECKPOINT))} of the allocation "
                 f"({f.gpu_time(wasted)}; {count(f, ck.count, 'checkpoint')}, "
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
        confidence=Confidence(basis="bound", text="an upper bound: the staging copy still blocks"),
        small=run.small_share(CHECKPOINT, run.config.checkpoint_share))
