"""`goodput advise` and `goodput simulate-interval`: the run's advice as the API serves it, and the checkpoint-interval
model against a Monte Carlo job.

`goodput advise` prints the engine's text (services.analysis.advice) unchanged: the measured sentence, then each
recommendation's title, wording, prediction, evidence, model and confidence, and the notes. Lines are wrapped to the
terminal at spaces only, so joining them gives back the API's sentences word for word; `--json` prints the API's
document itself."""

from __future__ import annotations

import json
import shutil
import textwrap
from typing import TYPE_CHECKING

from services import presentation as fmt
from services.analysis.interval import (
    daly_interval,
    first_order_goodput,
    simulate_interval,
    young_interval,
)

if TYPE_CHECKING:  # simulate-interval calls no collector: the client is imported by `advise` only
    from services.api_client import ApiClient
    from services.schemas.advice import Recommendation, RunAdvice

MAX_WIDTH = 100


def print_advice(api: ApiClient, run_id: str, *, as_json: bool = False, project: str | None = None) -> int:
    advice = api.advice(run_id, project=project)
    if as_json:
        print(json.dumps(advice.model_dump(mode="json"), indent=2))
        return 0
    print("\n".join(advice_lines(advice, width=min(shutil.get_terminal_size().columns, MAX_WIDTH))))
    return 0


def _wrap(text: str, width: int, indent: str, first: str | None = None) -> list[str]:
    return textwrap.wrap(text, width=width, initial_indent=indent if first is None else first,
                         subsequent_indent=indent, break_long_words=False, break_on_hyphens=False) or [indent]


def recommendation_lines(n: int, rec: Recommendation, width: int) -> list[str]:
    pad = "   "
    lines = _wrap(rec.title, width, pad, first=f"{n}. ")
    lines += _wrap(fmt.advice_stake(rec), width, pad)
    lines += _wrap(rec.wording, width, pad)
    lines += _wrap(rec.prediction, width, pad)
    lines += _wrap("evidence: " + "; ".join(f"{e.label} {e.text}" for e in rec.evidence), width, pad)
    lines += _wrap(f"model ({rec.model.name}): {rec.model.statement}", width, pad)
    lines += _wrap(f"confidence: {rec.confidence.text}", width, pad)
    return lines


def advice_lines(advice: RunAdvice, *, width: int = MAX_WIDTH) -> list[str]:
    lines = [f"run {advice.run_id} ({advice.measured.status})", *_wrap(advice.measured.text, width, "")]
    if not advice.recommendations:
        lines += ["", fmt.no_advice(advice.measured)]
    for n, rec in enumerate(advice.recommendations, 1):
        lines += ["", *recommendation_lines(n, rec, width)]
    if advice.notes:
        lines += ["", "Weighed and not advised:"]
        for note in advice.notes:
            lines += _wrap(note, width, "   ", first=" - ")
    return lines


def print_interval_table(*, delta: float, mtbf: float, restart: float, work_hours: float,
                         intervals: list[float], replicates: int, seed: int) -> int:
    named = [("young", young_interval(delta, mtbf)), ("daly", daly_interval(delta, mtbf))]
    named += [("given", t) for t in intervals]
    print(f"delta {fmt.duration(delta)}, restart {fmt.duration(restart)}, MTBF {fmt.duration(mtbf)}, "
          f"work {fmt.duration(work_hours * 3600)}; Monte Carlo: {fmt.integer(replicates)} jobs each")
    print(f"{'':<7}{'interval s':>11}{'model goodput':>15}{'simulated':>11}{'+-':>7}"
          f"{'checkpoint':>12}{'rework':>9}{'restart':>9}{'failures':>10}")
    for name, interval in named:
        sim = simulate_interval(interval=interval, delta=delta, restart=restart, mtbf=mtbf,
                                work=work_hours * 3600, replicates=replicates, seed=seed)
        model = first_order_goodput(interval, delta, restart, mtbf)
        print(f"{name:<7}{fmt.number(interval):>11}{fmt.percent(model, 2):>15}{fmt.percent(sim.goodput, 2):>11}"
              f"{fmt.percent(sim.goodput_stderr, 2):>7}{fmt.percent(sim.checkpoint_fraction, 2):>12}"
              f"{fmt.percent(sim.rework_fraction, 2):>9}{fmt.percent(sim.restart_fraction, 2):>9}"
              f"{fmt.number(sim.failures_per_run, 1):>10}")
    print("fractions are of wall time holding the GPUs; the model is first order: "
          "waste(T) = delta/T + (T/2 + R)/M, goodput = 1/(1 + waste)")
    return 0
