"""Number and time formats shared by the dashboard and the reports, so a figure reads the same in both."""

from __future__ import annotations

import math

DASH = "—"


def percent(ratio: float | None) -> str:
    """A ratio as a percentage with one decimal: `57.7%`; `—` when undefined."""
    if ratio is None or not math.isfinite(ratio):
        return DASH
    return f"{ratio:.1%}"


def duration(seconds: float | None) -> str:
    """Human wall time: `45 s`, `12 min 05 s`, `3 h 20 min`, `2 d 4 h`."""
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
