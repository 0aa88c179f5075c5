"""Checkpoint interval: first-order models (Young, Daly) and a Monte Carlo job simulator to check them.

Symbols: delta = seconds the loop is blocked writing one checkpoint, R = seconds from a failure to useful work
again (teardown + restart + reload), M = mean time between failures (seconds of wall time holding the GPUs),
T = compute seconds between two checkpoints.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


def young_interval(delta: float, mtbf: float) -> float:
    """Young (1974): T = sqrt(2 delta M)."""
    return math.sqrt(2.0 * delta * mtbf)


def daly_interval(delta: float, mtbf: float) -> float:
    """Daly (2006), higher-order estimate of the optimum compute interval; M itself once delta >= 2M."""
    if delta >= 2.0 * mtbf:
        return mtbf
    x = delta / (2.0 * mtbf)
    return math.sqrt(2.0 * delta * mtbf) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - delta


def first_order_waste(interval: float, delta: float, restart: float, mtbf: float) -> float:
    """Expected waste per unit of useful work: delta/T + (T/2 + R)/M."""
    return delta / interval + (interval / 2.0 + restart) / mtbf


def first_order_goodput(interval: float, delta: float, restart: float, mtbf: float) -> float:
    return 1.0 / (1.0 + first_order_waste(interval, delta, restart, mtbf))


@dataclass(frozen=True, slots=True, kw_only=True)
class IntervalSimulation:
    interval: float
    replicates: int
    goodput: float  # useful seconds / wall seconds holding the GPUs (mean of replicates)
    goodput_stderr: float
    useful_fraction: float  # of wall time, over all replicates (the fractions below add up to 1 with it)
    checkpoint_fraction: float
    rework_fraction: float
    restart_fraction: float
    failures_per_run: float


def simulate_interval(*, interval: float, delta: float, restart: float, mtbf: float, work: float,
                      replicates: int = 200, seed: int = 0) -> IntervalSimulation:
    """Monte Carlo: a job needing `work` useful seconds, checkpointing every `interval` compute seconds.

    Failures arrive at exponential gaps (mean `mtbf`) at any moment: during compute (the compute since the last
    completed checkpoint is lost), during a checkpoint write (the chunk being written is lost as well), or during
    a restart (the restart begins again). The final chunk needs no checkpoint.
    """
    if min(interval, work, mtbf) <= 0 or delta < 0 or restart < 0:
        raise ValueError("interval, work and mtbf must be positive; delta and restart non-negative")
    rng = random.Random(seed)
    goodputs: list[float] = []
    totals = {"checkpoint": 0.0, "rework": 0.0, "restart": 0.0, "wall": 0.0, "failures": 0.0, "useful": 0.0}
    for _ in range(replicates):
        done = wall = ck_time = rework = restart_time = 0.0
        failures = 0
        next_failure = rng.expovariate(1.0 / mtbf)
        while done < work - 1e-9:
            chunk = min(interval, work - done)
            needs_checkpoint = done + chunk < work - 1e-9
            segment = chunk + (delta if needs_checkpoint else 0.0)
            if wall + segment <= next_failure:
                wall += segment
                done += chunk
                ck_time += segment - chunk
                continue
            # failure inside this chunk or its checkpoint write
            lost = next_failure - wall
            rework += min(lost, chunk)
            ck_time += max(lost - chunk, 0.0)
            wall = next_failure
            failures += 1
            next_failure = wall + rng.expovariate(1.0 / mtbf)
            while wall + restart > next_failure:  # a failure during the restart: it begins again
                restart_time += next_failure - wall
                wall = next_failure
                failures += 1
                next_failure = wall + rng.expovariate(1.0 / mtbf)
            wall += restart
            restart_time += restart
        goodputs.append(work / wall)
        totals["checkpoint"] += ck_time
        totals["rework"] += rework
        totals["restart"] += restart_time
        totals["wall"] += wall
        totals["useful"] += work
        totals["failures"] += failures
    mean = sum(goodputs) / len(goodputs)
    var = sum((g - mean) ** 2 for g in goodputs) / max(len(goodputs) - 1, 1)
    return IntervalSimulation(
        interval=interval, replicates=replicates, goodput=mean, goodput_stderr=math.sqrt(var / len(goodputs)),
        useful_fraction=totals["useful"] / totals["wall"],
        checkpoint_fraction=totals["checkpoint"] / totals["wall"], rework_fraction=totals["rework"] / totals["wall"],
        restart_fraction=totals["restart"] / totals["wall"], failures_per_run=totals["failures"] / replicates,
    )
