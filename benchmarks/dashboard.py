"""How fast the run page of a big run draws: 1,000 ranks x 10,000 steps (10,000,000 step rows).

    python -m benchmarks.dashboard [--ranks 1000] [--steps 10000] [--db postgresql|sqlite|none]

The run is generated with numpy (not the simulator, for speed): one 1,000-GPU allocation, an attempt that
fails at step 5,500 after checkpoints every 500 steps, a restart from step 5,000 that runs to 9,500 (10,000
steps computed per rank in all), collective time on every step and one straggler rank. Printed:

1. one build of the run's analysis in memory: structure, ledger and views (what the collector does once per
   change of the run, in the background while pages poll);
2. the /view document the run page fetches (its live part aside: that is read from the database, in 3.), its
   size, and the time to build the page's figures and tables from it (what the dashboard server does per
   redraw) and their size in the browser;
3. with --db: the run stored through the collector's writer, then the page through the collector's API as the
   dashboard asks for it (live, then /view?stale_ok=true, then the figures): the first open of a run never
   analysed, opens that find the stored analysis, an open right after a new event (served the stored
   analysis, flagged stale, while the rebuild runs), when that rebuild is ready, and an open after a round of
   the collector's background analyst (services/derive/analyst.py; on by default, off here so that the rest
   measures pages building on demand), and a live run: how far the page's figures lag the committed steps and
   how long the rebuilds took (incremental: they read the step blocks and events that changed since the last
   one); ratios against the build measured in the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import itertools
import json
import os
import platform
import statistics
import tempfile
import time
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd

from services.analysis.attempts import build_run_structure
from services.analysis.claims import paint_run
from services.analysis.ledger import build_ledger
from services.analysis.run_data import (
    RunData,
    collectives_frame,
    events_frame,
    steps_frame,
)
from services.analysis.views import build_run_views
from services.schemas.ledger import Ledger
from services.schemas.live import LiveRun
from services.schemas.views import RunViews

T0 = 1_767_225_600.0


@dataclasses.dataclass(frozen=True)
class BigRun:
    events: list[dict[str, Any]]  # control events, wire format without event_id / run_id
    steps: dict[str, np.ndarray]  # attempt, rank, step, start, end, comm: one entry per step row

    def run_data(self) -> RunData:
        c = self.steps
        steps_df = steps_frame(attempt=c["attempt"], rank=c["rank"], step=c["step"], start=c["start"],
                               end=c["end"], loss=None, lr=None, comm=c["comm"])
        return RunData(run_id="big", events=events_frame(self.events), steps=steps_df,
                       collectives=collectives_frame())


def big_run(ranks: int, steps: int, *, straggler: int = 123, seed: int = 0) -> BigRun:
    """`ranks` x `steps` step rows (two attempts), generated with numpy."""
    rng = np.random.default_rng(seed)
    fail_at = int(steps * 0.55)
    every = max(steps // 20, 1)
    resume = (fail_at // every) * every
    second = steps - fail_at  # steps computed by attempt 1: resume+1 .. resume+second
    step_s, comm_s, ckpt_s, startup_s = 1.0, 0.05, 20.0, 90.0
    events: list[dict[str, Any]] = [{"kind": "run_submitted", "time": T0 - 300, "gpus": ranks},
                                    {"kind": "allocation_start", "time": T0, "gpus": ranks}]
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("attempt", "rank", "step", "start", "end", "comm")}
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
        for n, s_end in zip(numbers[numbers % every == 0], ends[numbers % every == 0], strict=True):
            ok = attempt == 1 or n <= resume
            for r in range(ranks):
                events.append({"kind": "checkpoint_start", "time": s_end, "attempt": attempt, "rank": r,
                               "step": int(n)})
                if n < numbers[-1] or attempt == 1:
                    events.append({"kind": "checkpoint_end", "time": s_end + ckpt_s, "attempt": attempt, "rank": r,
                                   "step": int(n), "ok": bool(ok)})
        parts["attempt"].append(np.full(count * ranks, attempt, dtype=np.int64))
        parts["rank"].append(np.tile(np.arange(ranks, dtype=np.int64), count))
        parts["step"].append(np.repeat(numbers, ranks))
        parts["start"].append(np.repeat(starts, ranks))
        parts["end"].append(np.repeat(ends, ranks))
        parts["comm"].append(np.repeat(ends, ranks) - np.repeat(starts, ranks) - compute.reshape(-1))
        t = float(ends[-1])
        if attempt == 0:
            t += 30.0  # a rank dies; the rest hang in all-reduce until the failure is torn down
            events += [{"kind": "attempt_end", "time": t, "attempt": 0, "rank": r, "reason": "failed"}
                       for r in range(ranks)]
            t += 5.0
    events += [{"kind": "attempt_end", "time": t + 1, "attempt": 1, "rank": r, "reason": "completed"}
               for r in range(ranks)]
    events += [{"kind": "run_end", "time": t + 1, "status": "finished"}, {"kind": "allocation_end", "time": t + 20}]
    return BigRun(events=events, steps={k: np.concatenate(v) for k, v in parts.items()})


def timed(fn: Any, repeats: int = 1) -> tuple[float, Any]:
    best, value = float("inf"), None
    for _ in range(repeats):
        # A full collection of this process (which holds the whole generated run) takes ~0.1 s; start every timing
        # with none pending, as timeit does, so that one does not land in whichever page happens to cross the
        # threshold. The figure is then the page's own cost.
        gc.collect()
        t = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - t)
    return best, value


def page_figures(ledger_json: dict[str, Any], view_json: dict[str, Any], live: LiveRun | None = None) -> list[Any]:
    """Everything the run page's draw callback builds from the API JSON (which it reads typed first)."""
    from dashboards import figures
    from dashboards.components import run_parts

    ledger, view = Ledger.model_validate(ledger_json), RunViews.model_validate(view_json)
    return [
        figures.timeline_figure(view, live), figures.ledger_figure(ledger),
        figures.rank_compute_figure(view.ranks), figures.heatmap_figure(view.ranks),
        run_parts.header(ledger), run_parts.kpis(ledger), run_parts.ranks_note(view.ranks, ledger),
        run_parts.restart_table(view.restarts),
        run_parts.checkpoint_table(view.checkpoints, view.checkpoints_total, ledger),
    ]


def serialized_size(parts: list[Any]) -> int:
    import plotly.io as pio
    from plotly.graph_objects import Figure

    total = 0
    for p in parts:
        if isinstance(p, Figure):
            total += len(pio.to_json(p, validate=False))
        else:
            total += len(json.dumps(p, default=lambda o: o.to_plotly_json() if hasattr(o, "to_plotly_json")
                                    else str(o)))
    return total


def main() -> int:
    warnings.filterwarnings("ignore", message="Discarding nonzero nanoseconds")  # plotly, sub-µs timestamps
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--db", choices=("postgresql", "sqlite", "none"), default="postgresql",
                    help="also store the run there and time the page through the collector's API (default: a throwaway "
                         "database on the local PostgreSQL, $GOODPUT_TEST_POSTGRES or "
                         "postgresql://postgres@127.0.0.1:5432/postgres)")
    ns = ap.parse_args()

    print(f"# dashboard run page, {ns.ranks:,} ranks x {ns.steps:,} steps")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"numpy {np.__version__}, pandas {pd.__version__}")
    t_gen, big = timed(lambda: big_run(ns.ranks, ns.steps))
    data = big.run_data()
    print(f"generated {len(data.steps):,} step rows, {len(data.events):,} control events in {t_gen:.1f} s")

    t_structure, structure = timed(lambda: build_run_structure(data))
    t_painting, painting = timed(lambda: paint_run(structure))
    t_ledger, ledger = timed(lambda: build_ledger(data, painting))
    t_views, views = timed(lambda: build_run_views(data, ledger, version=1, painting=painting))
    build = t_structure + t_painting + t_ledger + t_views
    print("\n## one build of the run's analysis, in memory (paid once per change of the run, in the background)")
    print(f"structure {t_structure:.2f} s + painting {t_painting:.2f} s + ledger {t_ledger:.2f} s + views "
          f"{t_views:.2f} s = {build:.2f} s")

    heat = views.ranks.heatmap
    # its live part is read from the database (services.storage.live): the document through the API, with --db
    view_json = json.dumps({**views.model_dump(mode="json"), "ledger": ledger.model_dump(mode="json")})
    print(f"/view document without its live part: {len(view_json) / 1024:,.0f} KiB "
          f"(progress points {sum(len(p.step) for p in views.timeline.progress):,}, "
          f"timeline pieces {len(views.timeline.segments):,}, rank rows {len(views.ranks.rows):,}, "
          f"heat map {len(heat.z) if heat else 0} x {len(heat.z[0]) if heat else 0})")
    view_in = json.loads(view_json)
    figures_s, size = _figures(view_in.pop("ledger"), view_in, ns.repeats)
    print(f"run page figures + tables from that document: {figures_s:.3f} s; {size / 1024:,.0f} KiB of figure "
          "and table JSON sent to the browser")
    if ns.db != "none":
        _through_the_api(big, ns.db, ns.repeats, build)
    return 0


def _figures(ledger: dict[str, Any], view: dict[str, Any], repeats: int) -> tuple[float, int]:
    """Best time to build and serialise the run page's figures and tables from the API's JSON, and the size."""
    page_figures(ledger, view)  # warm imports
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        parts = page_figures(ledger, view)
        size = serialized_size(parts)
        best = min(best, time.perf_counter() - t)
    return best, size


def _through_the_api(big: BigRun, db: str, repeats: int, build_in_memory: float) -> None:
    from fastapi.testclient import TestClient

    from services.collector.app import create_app
    from services.derive.analyst import WarmAnalyses
    from services.derive.cache import AnalysisCache
    from services.settings import ServerSettings, ServiceSettings
    from services.storage.db import make_engine
    from services.storage.migrate import upgrade

    with _database(db) as url:
        engine = make_engine(url)
        upgrade(engine)
        folds: list[float] = []

        def fold() -> None:
            from services.storage.runs import get_run
            from services.storage.step_blocks import fold_step_blocks

            started = time.perf_counter()
            with engine.connect() as conn:
                run_pk = get_run(conn, "big").pk
            fold_step_blocks(engine, run_pk)
            folds.append(time.perf_counter() - started)

        t_store = _store(engine, big, fold)
        print(f"\n## through the collector's API on {db} ({len(big.steps['step']):,} step rows stored in "
              f"{t_store:.0f} s, in time order; of that, {sum(folds):.0f} s summarising the changed step blocks "
              f"after every 200 steps ({len(folds)} rounds, at most {max(folds):.1f} s each), as the analyst does)")
        t_load, loaded = _load(engine)
        assert loaded == len(big.steps["step"]), f"stored {loaded:,} of {len(big.steps['step']):,} step rows"
        print(f"loading the run for analysis (what each build starts with): {t_load:.2f} s")
        # no background analyses: the rounds are run by hand below
        settings = ServiceSettings(server=ServerSettings(database_url=url, serve_dashboard=False, warm_analyses_s=0))
        with TestClient(create_app(settings, engine=engine)) as client:
            first, view = timed(lambda: _get(client, "/v1/runs/big/view", stale_ok="true"))
            assert view["stale"] is False
            print(f"first open of the run page, never analysed: {first:.2f} s (load + ledger + views; "
                  f"the collector logged {view['analysis_seconds']:.2f} s of it)")

            def page() -> dict[str, Any]:
                """What the dashboard does for a refresh that finds a new version: live, view, then figures."""
                live = LiveRun.model_validate(_get(client, "/v1/runs/big/live"))
                doc = _get(client, "/v1/runs/big/view", stale_ok="true")
                ledger = doc.pop("ledger")
                page_figures(ledger, doc, live)
                serialized_size(page_figures(ledger, doc, live))
                return {**doc, "ledger": ledger}

            stored = [timed(page)[0] for _ in range(repeats)]
            print(f"page from the stored analysis: best {min(stored):.2f} s, median {statistics.median(stored):.2f} s")
            beat: dict[str, list[dict[str, Any]]] = {"events": [{"event_id": "bench-beat", "run_id": "big",
                                                                "kind": "heartbeat",
                                "time": float(big.events[-1]["time"]) + 1, "attempt": 1, "rank": 0}]}
            assert client.post("/v1/events", json=beat).status_code == 200
            while_stale, doc = timed(page)
            print(f"page right after a new event (stale: {doc['stale']}, version {doc['version']} of "
                  f"{doc['run_version']}): {while_stale:.2f} s")
            started = time.perf_counter()
            while doc["stale"]:
                time.sleep(0.5)
                doc = _get(client, "/v1/runs/big/view", stale_ok="true")
            print(f"background rebuild ready {time.perf_counter() - started:.1f} s later "
                  f"(it took {doc['analysis_seconds']:.2f} s)")
            beat["events"][0].update(event_id="bench-beat-2", time=beat["events"][0]["time"] + 1)
            assert client.post("/v1/events", json=beat).status_code == 200
            # an analyst with a cache of its own, like another collector process's: no pace holds its round back
            analyst = WarmAnalyses(AnalysisCache(engine), interval_s=3600.0, share=1.0)
            t_round, rebuilt = timed(analyst.run_once)
            after_round, doc = timed(page)
            print(f"with the background analyst (on by default): a new event, its round ({rebuilt} run rebuilt in "
                  f"{t_round:.1f} s), then the page: {after_round:.2f} s, stale: {doc['stale']}")
            lags, builds = _live_lag(client, engine, big, page)
            print(f"live: new steps of every rank committed every 0.5 s for 40 s while the page polls every 0.25 s: "
                  f"figures behind their events by median {statistics.median(lags):.1f} s, at most {max(lags):.1f} s "
                  f"(goal <= 5 s: {'met' if max(lags) <= 5.0 else 'NOT met'}); {len(builds)} rebuilds, "
                  f"{statistics.median(builds) if builds else float('nan'):.2f} s median, "
                  f"{max(builds) if builds else float('nan'):.2f} s at most")
        engine.dispose()
    worst = max(max(stored), while_stale, after_round)
    print(f"\nratios (same run): page / first analysis = {worst / first:.3f}; page / in-memory build = "
          f"{worst / build_in_memory:.3f}")
    print(f"goal: the run page renders in under 2 s -> {worst:.2f} s ({'met' if worst < 2.0 else 'NOT met'}); "
          f"the first open of a never-analysed run takes {first:.1f} s")


def _live_lag(client: Any, engine: Any, big: BigRun, page: Any, *,
              seconds: float = 40.0) -> tuple[list[float], list[float]]:
    """Steps keep arriving (one more step of every rank every 0.5 s, through the writer) while the page polls;
    per poll after the first 5 s: how long the oldest committed step its figures do not show has been committed
    (0 when they show every one); and the seconds each rebuild the page saw took (as the collector logged them)."""
    import threading

    from services.storage.records import IngestRecord, StepRows
    from services.storage.writer import BatchWriter

    ranks = int(big.steps["rank"].max()) + 1
    last = int(big.steps["step"][big.steps["attempt"] == 1].max())
    t_last = float(big.steps["end"].max()) + 100.0
    committed: list[tuple[int, float]] = []  # (step, when committed)
    stop = threading.Event()
    writer = BatchWriter(engine)
    writer.start()

    def send() -> None:
        step = last
        while not stop.is_set():
            step += 1
            t = t_last + (step - last) * 1.0
            nan = np.full(1, np.nan)
            records = [IngestRecord(run_id="big", event_id=f"live-{step}-{r}", kind="steps", time=t + 1.0,
                                    attempt=1, rank=r, step=step, data={"n": 1},
                                    step_rows=StepRows(step=np.array([step]), start=np.array([t]),
                                                       end=np.array([t + 1.0]), loss=nan, lr=nan,
                                                       comm=np.array([0.05])))
                       for r in range(ranks)]
            writer.submit(records).result(timeout=60)
            committed.append((step, time.perf_counter()))
            stop.wait(0.5)

    thread = threading.Thread(target=send, daemon=True)
    started = time.perf_counter()
    thread.start()
    lags: list[float] = []
    builds: dict[int, float] = {}
    try:
        while time.perf_counter() - started < seconds:
            doc = page()
            builds.setdefault(int(doc["version"]), float(doc["analysis_seconds"]))
            now = time.perf_counter()
            furthest = int(doc["ledger"]["steps"]["furthest"]) if "ledger" in doc else 0
            behind = [at for step, at in list(committed) if step > furthest]
            if now - started > 5.0:
                lags.append(now - min(behind) if behind else 0.0)
            time.sleep(0.25)
    finally:
        stop.set()
        thread.join()
        writer.stop()
    first = min(builds) if builds else 0
    return lags, [b for version, b in builds.items() if version != first]  # the first was built before


def _load(engine: Any) -> tuple[float, int]:
    from services.storage.load import load_run_data
    from services.storage.runs import get_run

    with engine.connect() as conn:
        run = get_run(conn, "big")
        started = time.perf_counter()
        data = load_run_data(conn, run)
        return time.perf_counter() - started, len(data.steps)


def _get(client: Any, path: str, **params: str) -> dict[str, Any]:
    response = client.get(path, params=params)
    assert response.status_code == 200, response.text[:500]
    return response.json()


def _store(engine: Any, big: BigRun, fold: Any = None) -> float:
    """Control events through the collector's parser, step rows as compact records (200 steps of one rank), in
    time order; after every 200 steps `fold()`, as the background analyst summarises the changed step blocks."""
    from services.collector.batch import parse_batch
    from services.storage.records import IngestRecord, StepRows
    from services.storage.writer import BatchWriter

    started = time.perf_counter()
    writer = BatchWriter(engine)
    writer.start()
    try:
        events = [{**e, "event_id": f"c{i}", "run_id": "big"} for i, e in enumerate(big.events)]
        for i in range(0, len(events), 5000):
            records = parse_batch(json.dumps({"events": events[i:i + 5000]}).encode(), max_events=10**6,
                                  max_rows=10**8)
            writer.submit(records).result(timeout=600)
        c = big.steps
        order = np.lexsort((c["rank"], c["step"], c["attempt"]))  # in time order: every rank steps along
        cols = {k: v[order] for k, v in c.items()}
        bounds = np.flatnonzero(np.diff(cols["attempt"] * (1 << 40) + cols["step"] // 200, prepend=-1) != 0)
        for chunk, (lo, hi) in enumerate(itertools.pairwise(np.append(bounds, len(order)))):
            # 200 steps of every rank: one compact record per rank, as clients send them
            sub = {k: v[lo:hi] for k, v in cols.items()}
            by_rank = np.argsort(sub["rank"], kind="stable")
            sub = {k: v[by_rank] for k, v in sub.items()}
            cuts = np.flatnonzero(np.diff(sub["rank"], prepend=-1) != 0)
            batch: list[IngestRecord] = []
            for a, b in itertools.pairwise(np.append(cuts, len(by_rank))):
                step = sub["step"][a:b]
                nan = np.full(len(step), np.nan)
                rows = StepRows(step=step, start=sub["start"][a:b], end=sub["end"][a:b], loss=nan, lr=nan,
                                comm=sub["comm"][a:b])
                batch.append(IngestRecord(run_id="big", event_id=f"s{chunk}-{a}", kind="steps",
                                          time=float(rows.end[-1]), attempt=int(sub["attempt"][a]),
                                          rank=int(sub["rank"][a]), step=int(step.max()), data={"n": len(step)},
                                          step_rows=rows))
                if len(batch) == 100:
                    writer.submit(batch).result(timeout=600)
                    batch = []
            if batch:
                writer.submit(batch).result(timeout=600)
            if fold is not None:
                fold()
    finally:
        writer.stop()
    return time.perf_counter() - started


@contextlib.contextmanager
def _database(db: str) -> Iterator[str]:
    if db == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            yield f"sqlite:///{tmp}/bench.db"
        return
    from benchmarks._common import postgres_database

    with postgres_database() as url:
        yield url


if __name__ == "__main__":
    raise SystemExit(main())
