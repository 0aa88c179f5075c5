"""How reports write numbers and colour categories: the same conventions as the dashboard (dashboards/format.py,
dashboards/theme.py), repeated here because services never import the dashboard package."""

from __future__ import annotations

import math
from datetime import UTC, datetime

DASH = "—"
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


def percent(ratio: float | None) -> str:
    if ratio is None or not math.isfinite(ratio):
        return DASH
    return f"{ratio:.1%}"


def duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return DASH
    s = max(seconds, 0.0)
    if s < 60:
        return f"{s:.0f} s" if s >= 10 else f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60):02d} s"
    if s < 86400:
        return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"
    return f"{int(s // 86400)} d {int(s % 86400 // 3600)} h"


def timestamp(epoch_s: float | None) -> str:
    if epoch_s is None:
        return DASH
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def iso(epoch_s: float | None) -> str:
    return "" if epoch_s is None else datetime.fromtimestamp(epoch_s, UTC).isoformat()
