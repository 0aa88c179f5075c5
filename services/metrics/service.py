"""`MetricsService`: what one collector app needs for `/metrics`: its instruments and the cached run snapshot."""

from __future__ import annotations

import time

from prometheus_client import CONTENT_TYPE_LATEST, disable_created_metrics, generate_latest

from services.analysis.live import LiveConfig
from services.derive.cache import AnalysisCache
from services.metrics.collectors import RunMetricsCollector
from services.metrics.instruments import CollectorInstruments
from services.metrics.snapshot import SnapshotCache, build_snapshot
from services.settings import MetricsSettings

CONTENT_TYPE = CONTENT_TYPE_LATEST


class MetricsService:
    def __init__(self, analyses: AnalysisCache, config: MetricsSettings, live: LiveConfig | None = None) -> None:
        # No `*_created` series: multiprocess mode never has them, so one worker and N workers expose the same names.
        disable_created_metrics()
        self.config = config
        self.instruments = CollectorInstruments.create()
        self.snapshots = SnapshotCache(lambda: build_snapshot(analyses, self.config, time.time(), live=live),
                                       self.config.cache_ttl_s)
        self.runs = RunMetricsCollector(self.snapshots.get)

    def render(self) -> bytes:
        """The Prometheus text exposition of everything; reads the database at most once per TTL."""
        return generate_latest(self.instruments.scrape_registry(self.runs))
