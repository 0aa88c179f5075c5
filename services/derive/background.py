"""A collector's background work, started and stopped together: the analyst's rounds (services.derive.analyst) and
retention (services.derive.retention). Each worker runs it in threads (GOODPUT_ANALYST=thread), or one process of
its own does, beside the workers (services.cli.analyst)."""

from __future__ import annotations

from services.derive.analyst import WarmAnalyses
from services.derive.cache import AnalysisCache
from services.derive.retention import PruneJob
from services.settings import ServerSettings


class BackgroundJobs:
    def __init__(self, analyses: AnalysisCache, server: ServerSettings) -> None:
        self._warm = WarmAnalyses(analyses, interval_s=server.warm_analyses_s)
        self._retention = PruneJob(analyses, retention_days=server.raw_retention_days,
                                   interval_s=server.prune_interval_s)

    def start(self) -> None:
        self._warm.start()
        self._retention.start()

    def stop(self) -> None:
        self._retention.stop()
        self._warm.stop()
