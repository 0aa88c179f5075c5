"""The one range rule of every surface: "the last DURATION" is [now - DURATION, now) on the collector's clock, and a
run's figures in a range are those of its GPU time inside it (`GET /v1/fleet/window`). The dashboard's presets
(1h, 24h, 7d, 30d) and `goodput runs --last 90m` both go through `last`, with the collector's `server_time`."""

from __future__ import annotations

UNITS_S: dict[str, float] = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}


def duration_seconds(text: str) -> float:
    """`90m`, `24h`, `7d` -> seconds; a ValueError naming what is accepted otherwise."""
    number, unit = text.strip()[:-1], text.strip()[-1:].lower()
    try:
        amount = float(number)
    except ValueError:
        amount = -1.0
    if unit not in UNITS_S or not 0 < amount < float("inf"):
        raise ValueError(f"a duration is a positive number and a unit (s, m, h, d, w), such as 24h or 7d, got {text!r}")
    return amount * UNITS_S[unit]


def last(text: str, now: float) -> tuple[float, None]:
    """(since, until) of "the last `text`" at `now`: it ends now (None: the collector's now)."""
    return now - duration_seconds(text), None
