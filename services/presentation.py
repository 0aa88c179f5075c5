"""How every surface shows a figure: category order, labels, colours and descriptions, and the number and time
formats. The dashboard, the reports and the CLI import these; none keeps a copy, so a figure reads the same in all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime

from services.schemas.advice import MeasuredRun, Recommendation
from services.schemas.categories import EVAL, PRODUCTIVE, WASTE_KEYS
from services.schemas.ledger import STARTUP_PART_LABELS, StartupParts
from services.schemas.views import FailureCause

DASH = "—"

# -- categories ------------------------------------------------------------------------------------------------

CATEGORIES: tuple[str, ...] = WASTE_KEYS  # the waste categories, in the order every table and chart lists them
# the partition of allocated time: productive, eval (neither productive nor waste), then the waste categories
CATEGORY_ORDER: tuple[str, ...] = (PRODUCTIVE, EVAL, *WASTE_KEYS)

COLORS: dict[str, str] = {  # Okabe-Ito, colour-blind safe
    "productive": "#009E73",
    "eval": "#88CCEE",  # Tol's muted cyan: no status uses it, nor the project lines
    "startup": "#CC79A7",
    "checkpoint": "#0072B2",
    "rework": "#E69F00",
    "hang": "#D55E00",
    "straggler": "#B8A800",
    "idle": "#A0A4AB",
}

LABELS: dict[str, str] = {category: category.capitalize() for category in CATEGORY_ORDER}

DESCRIPTIONS: dict[str, str] = {
    "productive": "steps whose result was kept, minus straggler time",
    "eval": "validation or evaluation between steps: spent by choice, neither productive nor waste",
    "startup": "process start to the first step, after allocation and after every restart",
    "checkpoint": "training blocked while writing a checkpoint (torn writes included)",
    "rework": "steps computed again because a restart resumed from an earlier checkpoint",
    "hang": "no progress between the last step and the failure being torn down",
    "straggler": "other ranks waiting for the slowest rank in each step",
    "idle": "allocated GPUs doing nothing the run reported",
    "allocated": "everything allocated to the run",
}

# Statuses and markers: a set of their own (Paul Tol's "muted", colour-blind safe), so that no colour means both a
# waste category and a state. A failure marker is the colour of a failed attempt; a hung run's is not the hang
# category's (that one is waste time, this one a state).
STATUS_COLORS: dict[str, str] = {
    "running": "#332288",  # indigo
    "finished": "#117733",  # green
    "completed": "#117733",  # an attempt that completed: the run finished
    "failed": "#882255",  # wine
    "hung": "#AA4499",  # purple: hung, possibly hung, no progress (live)
    "preempted": "#DDCC77",  # sand (dark text on it)
    "cancelled": "#4B5563",  # slate
    "ended": "#4B5563",  # an attempt that ended without saying why
}
STATUS_TEXT_COLORS: dict[str, str] = {status: "#1F2937" if status == "preempted" else "#FFFFFF"
                                      for status in STATUS_COLORS}  # the ink that reads on each badge
MARKER_COLORS: dict[str, str] = {
    "failure": STATUS_COLORS["failed"],  # a failed attempt's end, a failed or torn checkpoint write
    "hung": STATUS_COLORS["hung"],  # the live "no progress" band, the "possibly hung" flag
    "restart": "#6B7280",  # a restart's line
}
WASTED_COLOR = "#4B5563"  # all waste together (a card's stripe): none of the categories'

# -- numbers and times ---------------------------------------------------------------------------------------------


def percent(ratio: float | None, decimals: int = 1) -> str:
    """A ratio as a percentage, with one decimal unless asked for more: `57.7%`; `—` when undefined."""
    if ratio is None or not math.isfinite(ratio):
        return DASH
    return f"{ratio:.{decimals}%}"


def share(part: float, whole: float) -> str:
    """`part` as a percentage of `whole`; `—` when the whole is zero."""
    return percent(part / whole) if whole else DASH


@dataclass(frozen=True, slots=True)
class GpuTimeUnit:
    """A unit of GPU time: its symbol (`GPU-min`), axis title (`GPU-minutes`), size in GPU-seconds and decimals."""

    symbol: str
    title: str
    seconds: float
    decimals: int

    def value(self, gpu_seconds: float) -> float:
        """GPU-seconds in this unit (a chart's coordinate)."""
        return gpu_seconds / self.seconds

    @property
    def d3_format(self) -> str:
        """The plotly hover / tick format of a value in this unit: `,.2f`."""
        return f",.{self.decimals}f"


GPU_SECONDS = GpuTimeUnit(symbol="GPU-s", title="GPU-seconds", seconds=1.0, decimals=1)
GPU_MINUTES = GpuTimeUnit(symbol="GPU-min", title="GPU-minutes", seconds=60.0, decimals=1)
GPU_HOURS = GpuTimeUnit(symbol="GPU-h", title="GPU-hours", seconds=3600.0, decimals=2)


def gpu_time_unit(*gpu_seconds: float | None) -> GpuTimeUnit:
    """The one unit for a set of figures shown together (a card row, a table, a chart's axis), chosen by the
    largest of them: GPU-hours from 1 GPU-hour on, GPU-minutes from 1 GPU-minute, else GPU-seconds. A figure
    alone is a set of one. The same rule on every surface (dashboard, reports, CLI)."""
    largest = max((abs(v) for v in gpu_seconds if v is not None and math.isfinite(v)), default=0.0)
    if largest >= GPU_HOURS.seconds:
        return GPU_HOURS
    if largest >= GPU_MINUTES.seconds:
        return GPU_MINUTES
    return GPU_SECONDS


def gpu_time(gpu_seconds: float | None, unit: GpuTimeUnit | None = None, *, with_unit: bool = True) -> str:
    """GPU time in `unit` (by default the unit its own size calls for, `gpu_time_unit`): `1,234.56 GPU-h`,
    `12.5 GPU-min`, `40.0 GPU-s`; `—` when unknown. Without the unit (`with_unit=False`) where a column header
    carries it (`unit.symbol`).

    Units by size: a figure too small to show two significant digits in the shared unit (under 0.1 GPU-h, under
    1 GPU-min) is written in its own unit, with its symbol (`1.7 GPU-min` in a table of GPU-hours): never `0.01
    GPU-h` nor `<0.01`."""
    if gpu_seconds is None or not math.isfinite(gpu_seconds):
        return DASH
    own = gpu_time_unit(gpu_seconds)
    unit = unit or own
    if gpu_seconds != 0 and own.seconds < unit.seconds and abs(unit.value(gpu_seconds)) < 10.0 ** (1 - unit.decimals):
        unit, with_unit = own, True
    text = f"{unit.value(gpu_seconds):,.{unit.decimals}f}"
    return f"{text} {unit.symbol}" if with_unit else text


def gpu_seconds(value: float | None) -> str:
    """GPU-seconds, whole: `12,345`."""
    return DASH if value is None or not math.isfinite(value) else f"{value:,.0f}"


def duration(value: float | None) -> str:
    """Wall time, the one format of every duration on every surface: `73 ms`, `4.5 ms`, `1.5 s`, `45 s`,
    `12 min 05 s`, `3 h 20 min`, `2 d 4 h`."""
    if value is None or not math.isfinite(value):
        return DASH
    s = max(value, 0.0)
    if s == 0:
        return "0 s"
    if s < 1:
        ms = s * 1000.0
        return f"{ms:.0f} ms" if round(ms, 1) >= 10 else f"{ms:.1f} ms"
    if s < 60:
        return f"{s:.0f} s" if round(s, 1) >= 10 else f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60):02d} s"
    if s < 86400:
        return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"
    return f"{int(s // 86400)} d {int(s % 86400 // 3600)} h"


def clock_offset(value: float | None) -> str:
    """A clock's offset from another: `5.0 s ahead`, `2 h 00 min behind`, `in step` (0)."""
    if value is None or not math.isfinite(value):
        return DASH
    if value == 0:
        return "in step"
    return f"{duration(abs(value))} {'ahead' if value > 0 else 'behind'}"


def integer(value: int | None) -> str:
    return DASH if value is None else f"{value:,}"


def number(value: float | None, decimals: int = 0) -> str:
    """A quantity without a unit of its own (an interval in a column of seconds, a mean count): `1,234.5`."""
    return DASH if value is None or not math.isfinite(value) else f"{value:,.{decimals}f}"


def timestamp(epoch_s: float | None) -> str:
    """UTC wall clock: `2026-01-01 12:34:56 UTC`."""
    if epoch_s is None:
        return DASH
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def iso(epoch_s: float | None) -> str:
    """ISO 8601 in UTC for machine-read files (CSV); empty when unknown."""
    return "" if epoch_s is None else datetime.fromtimestamp(epoch_s, UTC).isoformat()


# -- ranges: one rule for every surface ---------------------------------------------------------------------------
# "The last DURATION" is [now - DURATION, now) on the collector's clock, and a run's figures in a range are those of
# its GPU time inside it (GET /v1/fleet/window). The dashboard's presets (1h, 24h, 7d, 30d) and `goodput runs --last
# 90m` both go through `last_range`, with the collector's `server_time`.

RANGE_UNITS_S: dict[str, float] = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}


def duration_seconds(text: str) -> float:
    """`90m`, `24h`, `7d` -> seconds; a ValueError naming what is accepted otherwise."""
    number, unit = text.strip()[:-1], text.strip()[-1:].lower()
    try:
        amount = float(number)
    except ValueError:
        amount = -1.0
    if unit not in RANGE_UNITS_S or not 0 < amount < float("inf"):
        raise ValueError(f"a duration is a positive number and a unit (s, m, h, d, w), such as 24h or 7d, got {text!r}")
    return amount * RANGE_UNITS_S[unit]


def last_range(text: str, now: float) -> tuple[float, None]:
    """(since, until) of "the last `text`" at `now`: it ends now (None: the collector's now)."""
    return now - duration_seconds(text), None


# -- advice ------------------------------------------------------------------------------------------------------


def advice_stake(rec: Recommendation) -> str:
    """What a recommendation acts on, as every surface prints it under its title: `at stake 6.84 GPU-h (startup)`,
    then the engine's sentence when the saving is small."""
    return f"at stake {rec.at_stake_text} ({rec.category})" + (f". {rec.small}" if rec.small else "")


def no_advice(measured: MeasuredRun) -> str:
    """What every surface says of a run with no recommendation (the engine lists the largest actions of any run
    that wasted GPU time, so this is a run that wasted none, or whose waste no rule acts on: the notes say)."""
    if measured.waste_gpu_seconds <= 0:
        return "Nothing to act on: the run wasted no GPU time."
    return "No action to advise on this run's waste; the notes below say what was weighed."


def pruned_note(detail_pruned_at: float, *, unanalysed_events: bool = False) -> str:
    """What the run page and the report say about a run whose raw rows retention deleted."""
    when = timestamp(detail_pruned_at)
    if unanalysed_events:  # pruned by a goodput before revision 0009, which kept no step summaries
        return (f"Raw detail pruned {when} (steps and collectives are kept GOODPUT_RAW_RETENTION_DAYS after a run's "
                "last event): these figures are the analysis stored then, and are final. Events received after "
                "that are stored but not analysed.")
    return (f"Raw detail pruned {when} (steps and collectives are kept GOODPUT_RAW_RETENTION_DAYS after a run's last "
            "event): the ledger and these figures are built from the run's stored step summaries, events received "
            f"since included; its straggler report, resume check and per-rank step detail are those of {when}.")


def failure_cause(cause: FailureCause | None) -> str:
    """Why an attempt failed in one line, the same on the run page, in the report and the CLI: `rank 3 on node1
    killed by SIGKILL (exit code -9); error (rank 0): RuntimeError: ...; hung: rank 5`."""
    if cause is None:
        return DASH
    parts = []
    who = f"rank {cause.rank}" + (f" on {cause.host}" if cause.host else "") if cause.rank is not None else None
    if who is not None and cause.exit_code is not None:
        how = f"killed by {cause.signal}" if cause.signal else "exited"
        parts.append(f"{who} {how} (exit code {cause.exit_code})")
    elif who is not None:
        parts.append(f"{who} {'went silent' if cause.basis == 'silent' else 'failed'} first")
    if cause.error:
        by = f" (rank {cause.error_rank})" if cause.error_rank is not None and cause.error_rank != cause.rank else ""
        parts.append(f"error{by}: {cause.error}")
    if cause.hung_ranks:
        listed = ", ".join(str(r) for r in cause.hung_ranks[:8]) + (", ..." if len(cause.hung_ranks) > 8 else "")
        parts.append(f"hung: rank{'s' if len(cause.hung_ranks) > 1 else ''} {listed}")
    return "; ".join(parts) if parts else "not in the events"


def startup_split(parts: StartupParts | None) -> list[tuple[str, float]]:
    """The startup's parts with time in them, largest first, as (label, GPU-seconds): the same on the run page, in the
    report and the CLI."""
    if parts is None:
        return []
    named = [(STARTUP_PART_LABELS[name], float(value)) for name, value in parts.model_dump().items() if value > 0]
    return sorted(named, key=lambda item: -item[1])
