"""The collector's own counters and request histogram, correct with any number of worker processes.

`goodput serve --workers N` runs N processes behind one port; a scrape reaches whichever one the kernel hands
the connection to. In-memory counters would make every scrape report one worker's share. So, with N > 1, the
counters run in prometheus_client's multiprocess mode: ``PROMETHEUS_MULTIPROC_DIR`` (set by `goodput serve`
before the workers start, see `prepare_multiprocess_dir`) holds one memory-mapped file per process, and each
scrape sums them all (`MultiProcessCollector`), whichever worker answers. A worker that exits keeps its counts
in its file, so totals never go backwards while the server runs; the directory is emptied at each start, as
counters restart from zero with the process, which Prometheus's `rate()` expects.

Why not the database: a write per request (or per batch) for a counter, and a histogram kept as rows, would cost
more than the ingestion it measures. The run metrics *are* read from the database (they are the ledgers), and
client-reported drops come from stored ``client_stats`` events, so every worker and every replica agrees on them.

Without ``PROMETHEUS_MULTIPROC_DIR`` (one process, and tests) the instruments are plain in-memory metrics of
the app, registered in a fresh `CollectorRegistry` per scrape, never in the global one.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from services.metrics.collectors import PREFIX

# prometheus_client reads this variable itself, in every worker, when it creates a metric value: it is not a
# setting of ours (services.settings), and the environment is where prometheus_client looks for it.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
REQUEST_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
EVENT_OUTCOMES = ("accepted", "duplicate")
# Why an ingest request was refused for load (503 + Retry-After), always before its body is parsed: the bytes of bodies
# in flight were at their budget, or the write queue (with the room held for bodies being parsed) was full
OVERLOAD_REASONS = ("body_budget", "write_queue")


def multiprocess_dir() -> str | None:
    return os.environ.get(MULTIPROC_ENV) or None


@dataclass(frozen=True, slots=True)
class CollectorInstruments:
    events: Counter
    rejected_batches: Counter
    overloaded: Counter
    request_seconds: Histogram
    write_queue: Gauge
    analysis_cache: Gauge
    analysis_cpu: Counter
    shared: bool  # multiprocess mode: a scrape reads every worker's files instead of these objects
    _timers: dict[tuple[str, str, int], Histogram] = field(default_factory=dict)

    @classmethod
    def create(cls) -> CollectorInstruments:
        registry = None  # never the global registry; `scrape_registry` builds one per scrape
        events = Counter(f"{PREFIX}_collector_events", "Events stored (accepted) or recognised as already stored "
                         "(duplicate) by this collector", ["outcome"], registry=registry)
        for outcome in EVENT_OUTCOMES:
            events.labels(outcome)  # exported as 0 before the first batch
        rejected = Counter(f"{PREFIX}_collector_rejected_batches", "Batches rejected whole (nothing stored), by "
                           "error code: malformed_json, invalid_event, body_too_large, batch_too_large, ...",
                           ["code"], registry=registry)
        overloaded = Counter(f"{PREFIX}_collector_overloaded_requests", "Ingest requests refused for load (503 + "
                             "Retry-After; the client keeps the batch and sends it again), before their body was "
                             "parsed, by reason: body_budget (bodies in flight at GOODPUT_MAX_INFLIGHT_BODY_BYTES), "
                             "write_queue (GOODPUT_WRITER_MAX_QUEUE_S of writing queued or held)", ["reason"],
                             registry=registry)
        for reason in OVERLOAD_REASONS:
            overloaded.labels(reason)
        seconds = Histogram(f"{PREFIX}_collector_request_duration_seconds", "Seconds from request to response, by "
                            "route template, method and status code", ["handler", "method", "code"],
                            buckets=REQUEST_BUCKETS_S, registry=registry)
        # Set by each worker after each of its requests (RequestTimer); a scrape sums the live workers' values.
        queue = Gauge(f"{PREFIX}_collector_write_queue_rows", "Rows accepted and waiting to be written to the "
                      "database (an event plus its compact step rows), as of each worker's latest request",
                      multiprocess_mode="livesum", registry=registry)
        # Set by each worker whenever its analysis cache changes (services.storage.summary_cache)
        cache = Gauge(f"{PREFIX}_collector_analysis_cache_bytes", "Bytes of decoded step-block summaries and runs' "
                      "control events the collector keeps so that a live run's next analysis reads only what "
                      "changed, summed over its worker processes (each at most GOODPUT_ANALYSIS_CACHE_MB)",
                      multiprocess_mode="livesum",
                      registry=registry)
        # Added to by each build of a run's analyses (its thread's CPU) and each background analyst's round
        analysis_cpu = Counter(f"{PREFIX}_collector_analysis_cpu_seconds", "CPU seconds the collector spent building "
                               "runs' analyses (ledgers, views, ...: for pages and for the background analyst) and "
                               "summarising step blocks, apart from ingestion; summed over its worker processes",
                               registry=registry)
        return cls(events=events, rejected_batches=rejected, overloaded=overloaded, request_seconds=seconds,
                   write_queue=queue, analysis_cache=cache, analysis_cpu=analysis_cpu,
                   shared=multiprocess_dir() is not None)

    def count_ingested(self, accepted: int, duplicates: int) -> None:
        if accepted:
            self.events.labels("accepted").inc(accepted)
        if duplicates:
            self.events.labels("duplicate").inc(duplicates)

    def request_timer(self, handler: str, method: str, status: int) -> Histogram:
        """The histogram's child for one label set, kept: `labels()` takes a lock and builds a key per call, a few
        microseconds on every ingest request (services/collector/routes/ingest.py)."""
        key = (handler, method, status)
        child = self._timers.get(key)
        if child is None:
            child = self._timers[key] = self.request_seconds.labels(handler, method, str(status))
        return child

    def count_rejected(self, code: str) -> None:
        self.rejected_batches.labels(code).inc()

    def count_overloaded(self, reason: str) -> None:
        self.overloaded.labels(reason).inc()

    def scrape_registry(self, *collectors: Collector) -> CollectorRegistry:
        """A fresh registry with these instruments (summed over all worker processes when there are several)
        and `collectors`."""
        registry = CollectorRegistry()
        if self.shared:
            MultiProcessCollector(registry)
        else:
            for metric in (self.events, self.rejected_batches, self.overloaded, self.request_seconds,
                           self.write_queue, self.analysis_cache, self.analysis_cpu):
                registry.register(metric)
        for collector in collectors:
            registry.register(collector)
        return registry


def prepare_multiprocess_dir(workers: int) -> str | None:
    """Called by `goodput serve` before it starts the workers. With several workers, make sure every one
    counts into the same, empty directory: the operator's ``PROMETHEUS_MULTIPROC_DIR`` (emptied), else a
    fresh temporary one. Returns the directory this call created (the caller removes it at exit)."""
    given = multiprocess_dir()
    if given:
        os.makedirs(given, exist_ok=True)
        for name in os.listdir(given):
            if name.endswith(".db"):
                os.remove(os.path.join(given, name))
        return None
    if workers <= 1:
        return None
    created = tempfile.mkdtemp(prefix="goodput-metrics-")
    os.environ[MULTIPROC_ENV] = created
    return created


def remove_multiprocess_dir(path: str | None) -> None:
    if path:
        shutil.rmtree(path, ignore_errors=True)
