"""How numbers are written on every page (and in the browser tests that compare them with the API)."""

from __future__ import annotations

import math
from datetime import UTC, datetime

from services.formatting import DASH, duration, percent  # noqa: F401 - re-exported


def gpu_hours(gpu_seconds: float | None) -> str:
    """GPU-seconds as GPU-hours with two decimals: `1,234.56 GPU-h`, `<0.01 GPU-h` for a sliver, `0.00 GPU-h`."""
    if gpu_seconds is None or not math.isfinite(gpu_seconds):
        return DASH
    hours = gpu_seconds / 3600.0
    if 0 < abs(hours) < 0.005:
        return "<0.01 GPU-h"
    return f"{hours:,.2f} GPU-h"


def share(part: float, whole: float) -> str:
    return percent(part / whole) if whole else DASH


def seconds(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return DASH
    return f"{value:,.1f} s" if value >= 1 else f"{value * 1000:,.0f} ms"


def timestamp(epoch_s: float | None) -> str:
    """UTC wall clock: `2026-01-01 12:34:56`."""
    if epoch_s is None:
        return DASH
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%d %H:%M:%S")


def integer(value: int | None) -> str:
    return DASH if value is None else f"{value:,}"
