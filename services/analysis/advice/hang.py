"""Hangs: a run hung now (stop it), and failed attempts' hangs cut by a shorter collective timeout."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable

from services.analysis.advice.causes import hung_ranks
from services.analysis.advice.context import RunContext, count
from services.analysis.advice.figures import HANG, gpus_of, mean_step_seconds, world_size
from services.schemas.advice import Confidence, Recommendation


def hung_now(run: RunContext) -> Iterable[Recommendation]:
    provisional = run.ledger.provisional
    if not provisional:
        return
    f, ledger = run.f, run.ledger
    tail = ledger.running_tail
    gpus = tail.gpus if tail is not None else world_size(ledger)
    silent = provisional.as_of - provisional.since
    yield run.rec_without_gain(
        "hung_now", HANG, title="The run is hung now: stop it",
        wording=(f"No progress for {f.duration(silent)} ({f.gpu_time(provisional.hang_gpu_seconds)} so far, booked "
                 f"as provisional hang on {count(f, gpus, 'GPU')}). Look at the suspect ranks "
                 f"(GET /v1/runs/{ledger.run_id}/live, or py-spy dump on their processes), then stop the job or "
                 "let the collective timeout end it."),
        at_stake=provisional.hang_gpu_seconds,
        evidence=[run.ev("seconds_since_progress", "no progress for", silent, "seconds"),
                  run.ev("provisional_hang_gpu_seconds", "hang so far", provisional.hang_gpu_seconds, "gpu_seconds"),
                  run.ev("gpus", "GPUs held", gpus, "gpus")],
        model=("provisional_hang", "Live detection calls the run hung (no progress for longer than its threshold); "
                                   "the time since the last progress is booked as hang until the attempt ends "
                                   "(docs/ledger.md, 'Running runs')."),
        condition=(f"No prediction: the hang grows by {f.gpu_time(gpus * 60.0)} every minute until the job is "
                   "stopped."),
        measured="no step, checkpoint or attempt event since then")


def hang_timeout(run: RunContext) -> Iterable[Recommendation]:
    ledger, f, config = run.ledger, run.f, run.config
    episodes = [(a, gpus_of(a, ledger)) for a in ledger.attempts if a.failed and a.gpu_seconds.get(HANG, 0.0) > 0]
    if not episodes:
        return
    lengths = [a.gpu_seconds[HANG] / gpus for a, gpus in episodes]
    step = mean_step_seconds(ledger)
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
    if saved <= 0:
        run.notes.append(f"Hangs: {count(f, n, 'hang')} of at most {f.duration(max(lengths))} each; a collective "
                         f"timeout of {f.duration(timeout)} would save nothing, so no timeout advice.")
        return
    small = run.small_share(HANG, config.hang_share) or run.small_gain(saved, config.min_gain_share)
    median = statistics.median(lengths)
    lasted = (f"1 hang lasted {f.duration(median)}" if n == 1 else
              f"{count(f, n, 'hang')} lasted {f.duration(median)} (median; longest {f.duration(max(lengths))})")
    who = hung_ranks(run, [a.attempt for a, _ in episodes])
    yield run.rec(
        "hang_timeout", HANG, title=f"Lower the collective timeout to {f.duration(timeout)}",
        wording=(f"{lasted} from the last step to the failure being torn down, {f.gpu_time(hang)} in all: the stuck "
                 f"job held its GPUs until the collective timeout fired. Set it to {f.duration(timeout)}: "
                 f"init_process_group(..., timeout=timedelta(minutes={f.integer(minutes)})) (PyTorch's default is "
                 f"10 min for NCCL, 30 min for other backends); {f.duration(timeout)} is {why}. Alert on "
                 "goodput_run_seconds_since_progress to hear of a hang before the timeout."
                 + (f" {who[0]}" if who is not None else "")),
        at_stake=hang,
        evidence=[run.ev("hangs", "hangs (failed attempts)", n, "count"),
                  run.ev("median_hang_seconds", "median hang", median, "seconds"),
                  run.ev("longest_hang_seconds", "longest hang", max(lengths), "seconds"),
                  run.ev("hang_gpu_seconds", "hang", hang, "gpu_seconds"),
                  run.ev("mean_step_seconds", "mean step", step, "seconds"),
                  run.ev("median_checkpoint_seconds", "median checkpoint write", delta, "seconds"),
                  run.ev("timeout_seconds", "proposed collective timeout", timeout, "seconds"),
                  run.ev("hung_ranks", "ranks the others waited for", who[1] if who is not None else None, "text")],
        model=("timeout_cut", "A hang lasts from the last progress until the collective timeout fires and the job is "
                              "torn down; with a timeout T every hang longer than T ends at T: saving = sum over "
                              "hangs of GPUs x max(hang - T, 0). T must outlast the longest legitimate wait: "
                              f"the largest of {f.duration(config.timeout_floor_seconds)}, "
                              f"{config.timeout_step_factor:g} mean steps and "
                              f"{config.timeout_checkpoint_factor:g} checkpoint writes."),
        saved=saved, bound="expected", condition=f"every hang ended {f.duration(timeout)} after the last step",
        confidence=Confidence(basis="model", failures=n, runs=1,
                              text=f"measured over this run's {count(f, n, 'hang')}"), small=small)
