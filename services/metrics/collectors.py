"""The prometheus `Collector` that turns the latest run snapshot into metric families at scrape time.

Label sets are fixed: ``run_id`` and ``project`` (a run is identified by both: two projects' runs of the same id
are two series; only for the runs a snapshot labels: running or recently active, capped),
``category`` (the six waste categories), ``status``, ``reason`` and ``outcome`` with small, known value sets.
No rank, host or event ever becomes a label value; that detail is in the API and the reports.

``goodput_run_info`` (value 1) carries what a query joins on, one series per labelled run: ``status``,
``world_size`` (ranks of the run's latest attempt) and ``gpus`` (GPUs of its latest allocation; the world size
when none was reported). It covers exactly the runs the other ``goodput_run_*`` series cover, so its cardinality
is theirs: at most GOODPUT_METRICS_MAX_RUNS (200) runs, running first, and a finished run drops out
GOODPUT_METRICS_RUN_WINDOW_H (24) hours after its last event. A run makes a new info series only when its
status, world size or GPU count changes (a restart at another size, the run ending). For example, the goodput
of one project's running runs, with their GPU counts:

    goodput_run_goodput_ratio * on (run_id, project) group_left (gpus, world_size)
        goodput_run_info{project="nlp", status="running"}

The fleet series (``goodput_fleet_*``) are gauges, sums over the runs in the window: a sum falls when a run
leaves the window, so none of them is a counter, and none ends in ``_total``; rate per-run counters instead
(``sum by (reason) (rate(goodput_run_client_dropped_events_total[5m]))``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from services.metrics.snapshot import CLIENT_COUNTERS, RunSample, Snapshot
from services.schemas.categories import WASTE_KEYS, RunStatus
from services.schemas.ledger import Ledger, goodput_ratio

PREFIX = "goodput"


class RunMetricsCollector(Collector):
    """Reads `snapshot()` (cached by the caller) once per scrape; never starts an analysis of its own."""

    def __init__(self, snapshot: Callable[[], Snapshot], now: Callable[[], float] = time.time) -> None:
        self._snapshot = snapshot
        self._now = now  # the scrape's own clock reading: "seconds since progress" keeps counting between snapshots

    def describe(self) -> Iterable[Metric]:
        return []  # registering must not read the database

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        now = self._now()
        yield from _run_families(snap.labelled_runs, now)
        yield from _fleet_families(snap, now)


def _gauge(name: str, doc: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=labels)


def _counter(name: str, doc: str, labels: list[str] | None = None) -> CounterMetricFamily:
    return CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=labels)


def world_size_of(ledger: Ledger) -> int:
    """Ranks of the run's latest attempt (0 before its first attempt started)."""
    return ledger.attempts[-1].world_size if ledger.attempts else 0


def gpus_of(ledger: Ledger) -> int:
    """GPUs of the run's latest allocation (by end, then start); the world size when it has none."""
    if not ledger.allocations:
        return world_size_of(ledger)
    return max(ledger.allocations, key=lambda a: (a.end, a.start)).gpus


def _run_families(runs: Iterable[RunSample], now: float) -> Iterator[Metric]:
    run = ["run_id", "project"]
    info = InfoMetricFamily(f"{PREFIX}_run", "One series per labelled run (value 1) to join on: its status, the "
                            "world size of its latest attempt and the GPUs of its latest allocation", labels=run)
    ratio = _gauge("run_goodput_ratio", "Productive GPU-seconds / allocated GPU-seconds of the run (0..1)", run)
    allocated = _gauge("run_allocated_gpu_seconds", "GPU-seconds allocated to the run so far", run)
    productive = _gauge("run_productive_gpu_seconds", "GPU-seconds of kept optimizer steps, net of stragglers", run)
    evaluation = _gauge("run_eval_gpu_seconds", "GPU-seconds of validation / evaluation between steps (the eval "
                        "phase): neither productive nor waste", run)
    waste = _gauge("run_waste_gpu_seconds", "GPU-seconds of the run lost, by waste category (the ledger; a "
                   "category can shrink when a later restart reclassifies work; while the run is hung, hang "
                   "includes its time since the last progress, provisionally)", ["run_id", "project", "category"])
    provisional = _gauge("run_provisional_hang_gpu_seconds", "Hang GPU-seconds booked provisionally while the "
                         "running run is flagged hung (included in run_waste_gpu_seconds{category=\"hang\"}); "
                         "0 otherwise; running runs only", run)
    at_risk = _gauge("run_at_risk_gpu_seconds",
                     "GPU-seconds of work since the run's last good checkpoint (lost if it fails now)", run)
    restarts = _counter("run_restarts", "Restarts of the run (attempts - 1)", run)
    checkpoints = _counter("run_checkpoints", "Checkpoints the run wrote, by outcome", ["run_id", "project", "outcome"])
    blocking = _gauge("run_checkpoint_blocking_seconds",
                      "Median seconds one checkpoint blocked the training loop", run)
    since = _gauge("run_seconds_since_progress",
                   "Server clock minus the end of the run's latest step (its first event before any step); "
                   "running runs only", run)
    running = _gauge("run_running", "1 while the run is running, 0 once it ended", run)
    hung = _gauge("run_hung", "1 while the running run has made no progress for longer than its hang threshold "
                  "(max(floor, k x recent median step)), else 0; running runs only", run)
    suspects = _gauge("run_hang_suspects", "Ranks named as suspects of the run's hang (behind the others, silent, "
                      "ended); 0 unless hung", run)
    latest = _gauge("run_last_event_timestamp_seconds", "Time of the run's latest event (epoch seconds)", run)
    dropped = _counter("run_client_dropped_events", "Events the run's clients report lost: buffer = dropped "
                       "from a full in-memory buffer, spool = dropped from a full spool, rejected = refused by "
                       "the collector", ["run_id", "project", "reason"])
    for sample in runs:
        ledger = sample.ledger_at(now)  # a hung run's hang so far, provisionally
        rid = [sample.run_id, sample.project]
        info.add_metric(rid, {"status": ledger.status, "world_size": str(world_size_of(ledger)),
                              "gpus": str(gpus_of(ledger))})
        if ledger.goodput is not None:
            ratio.add_metric(rid, ledger.goodput)
        allocated.add_metric(rid, ledger.allocated_gpu_seconds)
        productive.add_metric(rid, ledger.productive_gpu_seconds)
        evaluation.add_metric(rid, ledger.eval_gpu_seconds)
        for category, gpu_s in ledger.waste_gpu_seconds.items():
            waste.add_metric([*rid, category], gpu_s)
        at_risk.add_metric(rid, ledger.at_risk_gpu_seconds)
        restarts.add_metric(rid, float(ledger.restarts))
        ck = ledger.checkpoints
        checkpoints.add_metric([*rid, "ok"], float(ck.ok))
        checkpoints.add_metric([*rid, "failed"], float(ck.failed))
        if ck.median_blocking_seconds is not None:
            blocking.add_metric(rid, ck.median_blocking_seconds)
        running.add_metric(rid, 1.0 if sample.running else 0.0)
        if sample.running and sample.last_progress_time is not None:
            since.add_metric(rid, max(0.0, now - sample.last_progress_time))
        if sample.running and sample.hung is not None:
            hung.add_metric(rid, 1.0 if sample.hung else 0.0)
            provisional.add_metric(rid, ledger.provisional.hang_gpu_seconds if ledger.provisional else 0.0)
            suspects.add_metric(rid, float(sample.hang_suspects))
        if ledger.latest_time is not None:
            latest.add_metric(rid, ledger.latest_time)
        for reason, value in sample.client_dropped.items():
            dropped.add_metric([*rid, reason], float(value))
    yield from (info, ratio, allocated, productive, evaluation, waste, at_risk, restarts, checkpoints, blocking, since,
                running, hung, suspects, provisional, latest, dropped)


def _fleet_families(snap: Snapshot, now: float) -> Iterator[Metric]:
    runs = snap.runs
    ledgers = [s.ledger_at(now) for s in runs]
    alloc = sum(ledger.allocated_gpu_seconds for ledger in ledgers)
    prod = sum(ledger.productive_gpu_seconds for ledger in ledgers)
    scope = " of the runs running or active within the window"
    ratio = _gauge("fleet_goodput_ratio", "Productive / allocated GPU-seconds" + scope)
    if (fleet_goodput := goodput_ratio(prod, alloc)) is not None:
        ratio.add_metric([], fleet_goodput)
    yield ratio
    yield GaugeMetricFamily(f"{PREFIX}_fleet_allocated_gpu_seconds", "Allocated GPU-seconds" + scope, value=alloc)
    yield GaugeMetricFamily(f"{PREFIX}_fleet_productive_gpu_seconds", "Productive GPU-seconds" + scope, value=prod)
    yield GaugeMetricFamily(f"{PREFIX}_fleet_eval_gpu_seconds", "Eval (validation between steps) GPU-seconds" + scope,
                            value=sum(ledger.eval_gpu_seconds for ledger in ledgers))
    waste = _gauge("fleet_waste_gpu_seconds", "Waste GPU-seconds by category" + scope, ["category"])
    for category in WASTE_KEYS:
        waste.add_metric([category], sum(ledger.waste_gpu_seconds[category] for ledger in ledgers))
    yield waste
    yield GaugeMetricFamily(f"{PREFIX}_fleet_hung_runs", "Running runs flagged hung (of those with a run_id label)",
                            value=float(sum(1 for s in runs if s.hung)))
    yield GaugeMetricFamily(f"{PREFIX}_fleet_at_risk_gpu_seconds", "At-risk GPU-seconds of the running runs",
                            value=sum(s.ledger.at_risk_gpu_seconds for s in runs if s.running))
    by_status = _gauge("fleet_runs", "Runs running or active within the window, by status", ["status"])
    for status in RunStatus:
        by_status.add_metric([status.value], float(sum(1 for s in runs if s.ledger.status == status.value)))
    yield by_status
    dropped = _gauge("fleet_client_dropped_events", "Events the clients report lost" + scope + " (a gauge: it "
                     "falls when a run leaves the window; rate goodput_run_client_dropped_events_total instead)",
                     ["reason"])
    for reason in CLIENT_COUNTERS:
        dropped.add_metric([reason], float(sum(s.client_dropped.get(reason, 0) for s in runs)))
    yield dropped
    yield GaugeMetricFamily(f"{PREFIX}_fleet_client_send_failures", "Failed sends the clients report" + scope,
                            value=float(sum(s.client_send_failures for s in runs)))
    yield GaugeMetricFamily(f"{PREFIX}_metrics_unlabelled_runs",
                            "Runs in the window without their own run_id series (over GOODPUT_METRICS_MAX_RUNS)",
                            value=float(len(runs) - snap.labelled))
    yield GaugeMetricFamily(f"{PREFIX}_metrics_stale_ledgers",
                            ("Runs whose previous stored ledger was served: the refresh budget spent (recomputed next "
                             "time), or none (GOODPUT_METRICS_REFRESH_BUDGET_S=0: the analyst process keeps them)"),
                            value=float(snap.stale_ledgers + snap.window_runs_without_ledger))
    yield GaugeMetricFamily(f"{PREFIX}_metrics_snapshot_duration_seconds",
                            "Seconds the latest run snapshot took to read from the database", value=snap.duration_s)
    yield GaugeMetricFamily(f"{PREFIX}_metrics_snapshot_timestamp_seconds",
                            "When the latest run snapshot was taken (epoch seconds)", value=snap.taken_at)
