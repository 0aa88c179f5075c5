"""Settings of `/metrics`: constructor arguments, then GOODPUT_METRICS_* environment variables, then defaults.

``GOODPUT_METRICS_CACHE_TTL_S``
    Seconds a process keeps the run metrics it read from the database before reading them again (default 10).
    A scrape every 15 s therefore costs one snapshot per scrape at most, and nothing between scrapes.
``GOODPUT_METRICS_RUN_WINDOW_H``
    A run gets its own ``run_id`` series while it is running or had an event in the last this-many hours
    (default 24).
``GOODPUT_METRICS_MAX_RUNS``
    At most this many runs get a ``run_id`` label (default 200): running runs first, then the most recently
    active. The rest still count in the ``goodput_fleet_*`` series.
``GOODPUT_METRICS_REFRESH_BUDGET_S``
    Seconds a snapshot may spend recomputing ledgers whose run received events since they were stored
    (default 3). Past the budget it serves the previous stored ledger of the run, so a scrape never runs the
    analysis of every busy run at once; the next snapshot continues where this one stopped.
``PROMETHEUS_MULTIPROC_DIR``
    prometheus_client's own: set by ``goodput serve --workers N`` (N > 1) to a fresh directory, so every
    worker counts into shared files and any worker answers a scrape with the totals of all of them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricsConfig:
    cache_ttl_s: float = 10.0
    run_window_h: float = 24.0
    max_runs: int = 200
    refresh_budget_s: float = 3.0
    max_runs_scanned: int = 5000  # runs in the window read per snapshot (fleet series cover these)

    def __post_init__(self) -> None:
        if not 0 <= self.cache_ttl_s <= 3600:
            raise ValueError(f"cache_ttl_s must be between 0 and 3600 s, got {self.cache_ttl_s} "
                             "(set by GOODPUT_METRICS_CACHE_TTL_S)")
        if self.run_window_h <= 0:
            raise ValueError(f"run_window_h must be positive, got {self.run_window_h} "
                             "(set by GOODPUT_METRICS_RUN_WINDOW_H)")
        if not 0 <= self.max_runs <= 10_000:
            raise ValueError(f"max_runs must be between 0 and 10000, got {self.max_runs} "
                             "(set by GOODPUT_METRICS_MAX_RUNS)")
        if self.refresh_budget_s < 0:
            raise ValueError(f"refresh_budget_s must be >= 0, got {self.refresh_budget_s} "
                             "(set by GOODPUT_METRICS_REFRESH_BUDGET_S)")

    @classmethod
    def from_env(cls, **overrides: float) -> MetricsConfig:
        values: dict[str, float | int] = {}
        for field, variable, cast in (
            ("cache_ttl_s", "GOODPUT_METRICS_CACHE_TTL_S", float),
            ("run_window_h", "GOODPUT_METRICS_RUN_WINDOW_H", float),
            ("max_runs", "GOODPUT_METRICS_MAX_RUNS", int),
            ("refresh_budget_s", "GOODPUT_METRICS_REFRESH_BUDGET_S", float),
        ):
            raw = os.environ.get(variable)
            if raw is not None and raw.strip():
                try:
                    values[field] = cast(raw)
                except ValueError:
                    raise ValueError(f"{variable} must be a number, got {raw!r}") from None
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]
