"""`goodput advise` and `goodput simulate-interval`: checkpoint-interval advice as tables."""

from __future__ import annotations

from urllib.parse import quote

import httpx

from services.cli.tokens import read_headers

from services.analysis.interval import (
    daly_interval,
    first_order_goodput,
    simulate_interval,
    young_interval,
)


def print_advice(base: str, run_id: str, *, project: str | None = None) -> int:
    try:
        response = httpx.get(f"{base}/v1/runs/{quote(run_id, safe='')}/advice", timeout=120, headers=read_headers(),
                             params={"project": project} if project else None)
    except httpx.HTTPError as exc:
        raise SystemExit(f"goodput: cannot reach the collector at {base}: {exc}. Is `goodput serve` running?") from exc
    if response.status_code != 200:
        print(response.json().get("error", {}).get("message", response.text))
        return 1
    advice = response.json()["checkpoint_interval"]
    inputs = advice["inputs"]
    print(f"run {run_id}: checkpoint interval")
    for label, key, unit in (("checkpoint cost (delta)", "checkpoint_seconds", "s"),
                             ("restart cost (R)", "restart_seconds", "s"),
                             ("mean time between failures (M)", "mtbf_seconds", "s"),
                             ("current interval (compute)", "current_interval_seconds", "s"),
                             ("compute per step", "seconds_per_step", "s")):
        value = inputs.get(key)
        print(f"  {label:<32} {'-' if value is None else f'{value:,.1f} {unit}'}")
    print(f"  {'failure rate from':<32} {inputs['mtbf_source']}")
    if advice["intervals"]:
        print(f"\n  {'interval':<10} {'seconds':>10} {'steps':>8} {'waste':>8} {'goodput':>8}")
        for row in advice["intervals"]:
            steps = "-" if row["interval_steps"] is None else f"{row['interval_steps']:.0f}"
            print(f"  {row['name']:<10} {row['interval_seconds']:>10,.0f} {steps:>8} "
                  f"{row['expected_waste']:>8.1%} {row['expected_goodput']:>8.1%}")
    print(f"\n{advice['summary']}")
    return 0


def print_interval_table(*, delta: float, mtbf: float, restart: float, work_hours: float,
                         intervals: list[float], replicates: int, seed: int) -> int:
    named = [("young", young_interval(delta, mtbf)), ("daly", daly_interval(delta, mtbf))]
    named += [("given", t) for t in intervals]
    print(f"delta {delta:g} s, restart {restart:g} s, MTBF {mtbf:g} s, work {work_hours:g} h; "
          f"Monte Carlo: {replicates} jobs each")
    print(f"{'':<7}{'interval s':>11}{'model goodput':>15}{'simulated':>11}{'+-':>7}"
          f"{'checkpoint':>12}{'rework':>9}{'restart':>9}{'failures':>10}")
    for name, interval in named:
        sim = simulate_interval(interval=interval, delta=delta, restart=restart, mtbf=mtbf,
                                work=work_hours * 3600, replicates=replicates, seed=seed)
        print(f"{name:<7}{interval:>11,.0f}{first_order_goodput(interval, delta, restart, mtbf):>15.2%}"
              f"{sim.goodput:>11.2%}{sim.goodput_stderr:>7.2%}{sim.checkpoint_fraction:>12.2%}"
              f"{sim.rework_fraction:>9.2%}{sim.restart_fraction:>9.2%}{sim.failures_per_run:>10.1f}")
    print("fractions are of wall time holding the GPUs; the model is first order: "
          "waste(T) = delta/T + (T/2 + R)/M, goodput = 1/(1 + waste)")
    return 0
