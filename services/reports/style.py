"""How reports write numbers and colour categories: the dashboard's conventions (numbers from
services/formatting.py, which both use; colours as in dashboards/theme.py, since services never import the
dashboard package)."""

from __future__ import annotations

import math
from datetime import UTC, datetime

from services.formatting import DASH, duration, percent  # noqa: F401 - re-exported

CATEGORY_ORDER: tuple[str, ...] = ("productive", "startup", "checkpoint", "rework", "hang", "straggler", "idle")
COLORS: dict[str, str] = {  # Okabe-Ito, colour-blind safe
    "productive": "#009E73",
    "startup": "#CC79A7",
    "checkpoint": "#0072B2",
    "rework": "#E69F00",
    "hang": "#D55E00",
    "straggler": "#B8A800",
    "idle": "#A0A4AB",
}
DESCRIPTIONS: dict[str, str] = {
    "productive": "steps whose result was kept, minus straggler time",
    "startup": "allocation or restart to the first step",
    "checkpoint": "training blocked writing a checkpoint",
    "rework": "steps computed again after a restart resumed from an earlier checkpoint",
    "hang": "last progress of a failed attempt to its teardown",
    "straggler": "ranks waiting for the slowest rank in each step",
    "idle": "allocated GPUs doing nothing the run reported",
    "allocated": "everything allocated to the run",
}


def gpu_hours(gpu_seconds: float | None) -> str:
    if gpu_seconds is None or not math.isfinite(gpu_seconds):
        return DASH
    hours = gpu_seconds / 3600.0
    if 0 < abs(hours) < 0.005:
        return "<0.01"
    return f"{hours:,.2f}"


def gpu_seconds(value: float | None) -> str:
    return DASH if value is None or not math.isfinite(value) else f"{value:,.0f}"


def timestamp(epoch_s: float | None) -> str:
    if epoch_s is None:
        return DASH
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def iso(epoch_s: float | None) -> str:
    return "" if epoch_s is None else datetime.fromtimestamp(epoch_s, UTC).isoformat()
