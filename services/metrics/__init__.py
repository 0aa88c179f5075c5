"""Prometheus metrics of the collector: run ledgers (from the database, cached) and the collector's own counters.

Public surface: `MetricsService` (one per app; its settings: services.settings.MetricsSettings),
`prepare_multiprocess_dir` for `goodput serve`.
"""

from __future__ import annotations

from services.metrics.instruments import CollectorInstruments, prepare_multiprocess_dir, remove_multiprocess_dir
from services.metrics.service import CONTENT_TYPE, MetricsService

__all__ = ["CONTENT_TYPE", "CollectorInstruments", "MetricsService", "prepare_multiprocess_dir",
           "remove_multiprocess_dir"]
