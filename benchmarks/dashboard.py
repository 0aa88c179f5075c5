"""Time to build the run page of a big run: 1,000 ranks x 10,000 steps (10,000,000 step rows).

    python benchmarks/dashboard.py [--ranks 1000] [--steps 10000] [--db-steps 0]

The run is generated with numpy (not the simulator, for speed): one 1,000-GPU allocation, an attempt that
fails at step 5,500 after checkpoints every 500 steps, a restart from step 5,000 that runs to 9,500 (10,000
steps computed per rank in all), collective time on every step and one straggler rank. Printed:

1. analysis: the ledger (`build_ledger`) and the dashboard views (`build_run_views`) from memory; the API
   caches both per run version, so this is paid once per change of the run, not per page view;
2. the JSON the run page fetches (/waste and /view) and its size;
3. the run page's figures and tables built from that JSON (what each page refresh costs the dashboard
   server after a change), and the size of the figure JSON sent to the browser.

`--db-steps N` also stores a run of N step rows in SQLite through the collector's writer and times the
first (uncached) and a cached `/view` computation from the database.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import tempfile
import time
from typing import Any

import numpy as np
import pandas as pd

from services.analysis.ledger import build_ledger
from services.analysis.run_data import (
    RunData,
    collectives_frame,
    events_frame,
    steps_frame,
)
from services.analysis.views import build_run_views, live_status

T0 = 1_767_225_600.0


def big_run(ranks: int, steps: int, *, straggler: int = 123, seed: int = 0) -> RunData:
    """A RunData of `ranks` x `steps` step rows (two attempts), generated with numpy."""
    rng = np.random.default_rng(seed)
    fail_at = int(steps * 0.55)
    every = max(steps // 20, 1)
    resume = (fail_at // every) * every
    second = steps - fail_at  # steps computed by attempt 1: resume+1 .. resume+second
    step_s, comm_s, ckpt_s, startup_s = 1.0, 0.05, 20.0, 90.0
    events: list[dict[str, Any]] = [{"kind": "run_submitted", "time": T0 - 300, "gpus": ranks},
                                    {"kind": "allocation_start", "time": T0, "gpus": ranks}]
    step_parts: dict[str, list[np.ndarray]] = {k: [] for k in ("attempt", "rank", "step", "start", "end", "comm")}
    t = T0
    for attempt, (first, count) in enumerate(((1, fail_at), (resume + 1, second))):
        for r in range(ranks):
            events.append({"kind": "attempt_start", "time": t, "attempt": attempt, "rank": r, "world_size": ranks,
                           "host": f"node{r // 8:04d}"})
            events.append({"kind": "resume", "time": t, "attempt": attempt, "rank": r, "step": first - 1})
        t += startup_s
        numbers = np.arange(first, first + count, dtype=np.int64)
        # per step: every rank computes ~1 s (the straggler 1.3x), then all-reduces until the slowest arrives
        compute = step_s * (1 + rng.uniform(-0.03, 0.03, size=(count, ranks)))
        compute[:, straggler % ranks] *= 1.3
        duration = compute.max(axis=1) + comm_s
        pauses = np.where(numbers % every == 0, ckpt_s, 0.0)  # a checkpoint after every `every`-th step
        starts = t + np.concatenate([[0.0], np.cumsum(duration + pauses)[:-1]])
        ends = starts + duration
        for n, s_end in zip(numbers[numbers % every == 0], ends[numbers % every == 0]):
            ok = attempt == 1 or n <= resume
            for r in range(ranks):
                events.append({"kind": "checkpoint_start", "time": s_end, "attempt": attempt, "rank": r, "step": int(n)})
                if n < numbers[-1] or attempt == 1:
                    events.append({"kind": "checkpoint_end", "time": s_end + ckpt_s, "attempt": attempt, "rank": r,
                                   "step": int(n), "ok": ok})
        step_parts["attempt"].append(np.full(count * ranks, attempt, dtype=np.int64))
        step_parts["rank"].append(np.tile(np.arange(ranks, dtype=np.int64), count))
        step_parts["step"].append(np.repeat(numbers, ranks))
        step_parts["start"].append(np.repeat(starts, ranks))
        step_parts["end"].append(np.repeat(ends, ranks))
        step_parts["comm"].append(np.repeat(ends, ranks) - np.repeat(starts, ranks) - compute.reshape(-1))
        t = float(ends[-1])
        if attempt == 0:
            t += 30.0  # a rank dies; the rest hang in all-reduce until the failure is torn down
            events += [{"kind": "attempt_end", "time": t, "attempt": 0, "rank": r, "reason": "failed"}
                       for r in range(ranks)]
            t += 5.0
    events += [{"kind": "attempt_end", "time": t + 1, "attempt": 1, "rank": r, "reason": "completed"}
               for r in range(ranks)]
    events += [{"kind": "run_end", "time": t + 1, "status": "finished"}, {"kind": "allocation_end", "time": t + 20}]
    cols = {k: np.concatenate(v) for k, v in step_parts.items()}
    n = len(cols["step"])
    steps_df = steps_frame(attempt=cols["attempt"], rank=cols["rank"], step=cols["step"], start=cols["start"],
                           end=cols["end"], loss=None, lr=None, comm=None)
    fields = {f.name for f in dataclasses.fields(RunData)}
    comm = pd.DataFrame({"attempt": cols["attempt"], "rank": cols["rank"], "step": cols["step"],
                         "seconds": cols["comm"]})
    if "comm" in fields:  # storage hands the ledger collective seconds already summed per step
        return RunData(run_id="big", events=events_frame(events), steps=steps_df, collectives=collectives_frame(),
                       comm=comm)  # type: ignore[call-arg]
    steps_df["comm"] = cols["comm"]  # older RunData: the per-step `comm` field carries the same numbers
    del n
    return RunData(run_id="big", events=events_frame(events), steps=steps_df, collectives=collectives_frame())


def timed(fn: Any, repeats: int = 1) -> tuple[float, Any]:
    best, value = float("inf"), None
    for _ in range(repeats):
        t = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - t)
    return best, value


def page_figures(ledger: dict[str, Any], view: dict[str, Any]) -> list[Any]:
    """Everything the run page's draw callback builds from the API JSON."""
    from dashboards import figures
    from dashboards.components import run_parts

    return [
        figures.timeline_figure(view, view.get("live")), figures.ledger_figure(ledger),
        figures.rank_compute_figure(view["ranks"]), figures.heatmap_figure(view["ranks"]),
        run_parts.header(ledger), run_parts.kpis(ledger), run_parts.ranks_note(view["ranks"], ledger),
        run_parts.restart_table(view["restarts"]),
        run_parts.checkpoint_table(view["checkpoints"], view["checkpoints_total"], ledger),
    ]


def serialized_size(parts: list[Any]) -> int:
    import plotly.io as pio
    from plotly.graph_objects import Figure

    total = 0
    for p in parts:
        if isinstance(p, Figure):
            total += len(pio.to_json(p, validate=False))
        else:
            total += len(json.dumps(p, default=lambda o: o.to_plotly_json() if hasattr(o, "to_plotly_json") else str(o)))
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--db-steps", type=int, default=0, help="also time the first /view from SQLite (step rows)")
    ns = ap.parse_args()

    print(f"# dashboard run page, {ns.ranks:,} ranks x {ns.steps:,} steps")
    print(f"machine: {platform.machine()}, Python {platform.python_version()}, numpy {np.__version__}, "
          f"pandas {pd.__version__}")
    t_gen, data = timed(lambda: big_run(ns.ranks, ns.steps))
    print(f"generated {len(data.steps):,} step rows, {len(data.events):,} control events in {t_gen:.1f} s")

    t_ledger, ledger_obj = timed(lambda: build_ledger(data))
    ledger = ledger_obj.to_dict()
    t_views, views = timed(lambda: build_run_views(data, ledger))
    views["version"] = 1
    view = {**views, "live": live_status(views, ledger, float(ledger["latest_time"] or 0) + 5)}
    ledger_json, view_json = json.dumps(ledger), json.dumps(view)
    print(f"analysis (once per run version, cached by the API): ledger {t_ledger:.2f} s, views {t_views:.2f} s")
    print(f"API JSON for the page: /waste {len(ledger_json) / 1024:,.0f} KiB, /view {len(view_json) / 1024:,.0f} KiB "
          f"(progress points {sum(len(p['step']) for p in view['timeline']['progress']):,}, "
          f"timeline pieces {len(view['timeline']['segments']):,}, rank rows {len(view['ranks']['rows']):,}, "
          f"heat map {len(view['ranks']['heatmap']['z'])} x {len(view['ranks']['heatmap']['z'][0])})")

    ledger_in, view_in = json.loads(ledger_json), json.loads(view_json)
    page_figures(ledger_in, view_in)  # warm imports
    samples = []
    for _ in range(ns.repeats):
        t = time.perf_counter()
        parts = page_figures(ledger_in, view_in)
        samples.append(time.perf_counter() - t)
    t_ser, size = timed(lambda: serialized_size(parts))
    build = min(samples)
    print(f"run page figures + tables from the API JSON: {build:.3f} s (best of {ns.repeats}; median "
          f"{statistics.median(samples):.3f} s), serialised in {t_ser:.3f} s")
    print(f"sent to the browser: {size / 1024:,.0f} KiB of figure and table JSON")
    verdict = "under" if build + t_ser < 2.0 else "OVER"
    print(f"goal: page figures under 2 s -> {build + t_ser:.2f} s ({verdict})")
    if ns.db_steps:
        _from_database(ns.db_steps)
    return 0


def _from_database(n_rows: int) -> None:
    from services.collector.batch import parse_batch
    from services.simulate import SimConfig, simulate
    from services.storage.db import make_engine
    from services.storage.migrate import upgrade
    from services.storage.writer import BatchWriter
    from services.views_pipeline import ViewsCache, views_for_run

    ranks = 100
    hours = n_rows / ranks / 3600.0
    sim = simulate(SimConfig(run_id="db-big", ranks=ranks, hours=hours, mtbf_s=hours * 3600 / 2, straggler_rank=7,
                             checkpoint_every=500, seed=1))
    with tempfile.TemporaryDirectory() as tmp:
        engine = make_engine(f"sqlite:///{tmp}/bench.db")
        upgrade(engine)
        writer = BatchWriter(engine)
        writer.start()
        t = time.perf_counter()
        try:
            for i in range(0, len(sim.events), 200):
                records = parse_batch(json.dumps({"events": sim.events[i:i + 200]}).encode(), max_events=10**6,
                                      max_rows=10**8)
                writer.submit(records).result(timeout=600)
        finally:
            writer.stop()
        print(f"\nSQLite: stored a {ranks}-rank simulated run in {time.perf_counter() - t:.1f} s")
        cache = ViewsCache()
        first, (views, _) = timed(lambda: views_for_run(engine, "db-big", cache=cache))
        steps = sum(p["steps_total"] for p in views["timeline"]["progress"]) * ranks
        cached, _ = timed(lambda: views_for_run(engine, "db-big", cache=cache), repeats=3)
        print(f"SQLite, ~{steps:,} step rows: first /view (load + ledger + views) {first:.2f} s, "
              f"cached {cached * 1000:.1f} ms")
        engine.dispose()


if __name__ == "__main__":
    raise SystemExit(main())
