"""`goodput advise` and `goodput simulate-interval`: checkpoint-interval advice as tables."""

from __future__ import annotations

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


def print_advice(api: ApiClient, run_id: str, *, project: str | None = None) -> int:
    advice = api.advice(run_id, project=project).checkpoint_interval
    inputs = advice.inputs
    print(f"run {run_id}: checkpoint interval")
    for label, value in (("checkpoint cost (delta)", fmt.duration(inputs.checkpoint_seconds)),
                         ("restart cost (R)", fmt.duration(inputs.restart_seconds)),
                         ("mean time between failures (M)", fmt.duration(inputs.mtbf_seconds)),
                         ("current interval (compute)", fmt.duration(inputs.current_interval_seconds)),
                         ("compute per step", fmt.seconds(inputs.seconds_per_step)),
                         ("failure rate from", inputs.mtbf_source)):
        print(f"  {label:<32} {value}")
    if advice.intervals:
        print(f"\n  {'interval':<10} {'seconds':>10} {'steps':>8} {'waste':>8} {'goodput':>8}")
        for row in advice.intervals:
            print(f"  {row.name:<10} {fmt.number(row.interval_seconds):>10} {fmt.number(row.interval_steps):>8} "
                  f"{fmt.percent(row.expected_waste):>8} {fmt.percent(row.expected_goodput):>8}")
    print(f"\n{advice.summary}")
    return 0


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
