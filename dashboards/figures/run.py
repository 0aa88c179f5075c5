"""Run figures: the timeline, the ledger as a waterfall, per-rank compute and its heat map."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dashboards.figures.common import base_figure, empty_figure, label_rows, to_datetimes
from dashboards.theme import GRID, INK, MUTED, RANK_BAR, template
from services import presentation as fmt
from services.presentation import (
    CATEGORIES,
    CATEGORY_ORDER,
    COLORS,
    LABELS,
    MARKER_COLORS,
    STATUS_COLORS,
    STATUS_TEXT_COLORS,
)
from services.schemas.categories import EVAL
from services.schemas.ledger import Ledger
from services.schemas.live import LiveRun
from services.schemas.views import (
    AllocationSpan,
    AttemptSpan,
    CheckpointRow,
    Failure,
    HangSpan,
    NoRankCompute,
    Progress,
    RankCompute,
    Restart,
    RunViews,
    Segment,
)

_OUTCOMES = ("completed", "failed", "preempted", "running", "ended")  # an attempt's, in the statuses' colours
_ALLOCATION_COLOR = "#6B7280"
# The heat map's scale: pale at the median of all ranks, dark where a rank is much slower (ColorBrewer Purples,
# a sequential scale that reads in grey too); no waste category or status uses it.
_HEAT_SCALE = [[0.0, "#F7F7FB"], [0.25, "#DADAEB"], [0.5, "#9E9AC8"], [0.75, "#6A51A3"], [1.0, "#3F007D"]]
_HEAT_SPAN = 0.5  # the darkest colour: this much slower than the median (+50%) or more
_ROW_ALLOC, _ROW_ATTEMPTS, _ROW_BAND = "Allocation", "Attempts", "GPU time"
LABELLED_ATTEMPTS = 6  # attempts whose bars also name their outcome; more are labelled by number only
_MAX_MARKED = 60  # vertical lines and shaded hangs drawn at most (the rest are still in the tables)


def timeline_figure(view: RunViews, live: LiveRun | None = None) -> go.Figure:
    """Where the time went: allocations, attempts and the painted GPU time on top; step progress below.

    The first trace is always the live "no progress" band (empty unless the run is possibly hung), so that
    the page can move its right edge every refresh with a Patch of `data[0]`.
    """
    tl = view.timeline
    if not tl.allocations and not tl.attempts:
        return empty_figure("This run has not reported an allocation or an attempt yet", height=420)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.34, 0.66], vertical_spacing=0.07)
    band_x, band_y, band_text = stall_band(live)
    fig.add_trace(go.Scatter(
        x=band_x, y=band_y, mode="lines", fill="toself", fillcolor=_rgba(MARKER_COLORS["hung"], 0.16),
        line={"color": MARKER_COLORS["hung"], "width": 1, "dash": "dot"}, name="No progress (live)", showlegend=False,
        hoveron="fills", text=band_text, hoverinfo="text",
    ), row=2, col=1)
    fig.update_layout(template=template(), height=520, barmode="overlay", bargap=0.35,
                      hovermode="closest", uirevision=f"timeline-{view.run_id}",
                      legend={"orientation": "h", "x": 0, "xanchor": "left", "y": 0.995, "yanchor": "top",
                              "yref": "container", "traceorder": "normal"}, margin={"t": 48, "l": 90})
    _allocation_bars(fig, tl.allocations)
    _attempt_bars(fig, tl.attempts, view.status)
    _segment_bars(fig, tl.segments)
    _progress_lines(fig, tl.progress)
    _checkpoint_marks(fig, view.checkpoints)
    _failure_marks(fig, tl.failures, tl.hangs)
    _restart_marks(fig, tl.restarts, _span_s(view))
    fig.update_yaxes(row=1, col=1, categoryorder="array", categoryarray=[_ROW_BAND, _ROW_ATTEMPTS, _ROW_ALLOC],
                     showgrid=False, fixedrange=True)
    fig.update_yaxes(row=2, col=1, title_text="step", rangemode="tozero", tickformat=",d")
    fig.update_xaxes(type="date", row=1, col=1, showticklabels=False)
    fig.update_xaxes(type="date", row=2, col=1, title_text="time (UTC)")
    return fig


def stall_band(live: LiveRun | None) -> tuple[list[str], list[float], str]:
    """The polygon (x as UTC ISO strings, y in steps) from the last progress to the server's now, if hung; on the
    run's own clock, as the rest of the timeline (the live times are the collector's)."""
    if live is None or not live.possibly_hung or live.last_progress_time is None:
        return [], [], ""
    shift = live.clock_offset_seconds
    t0, t1 = to_datetimes([live.last_progress_time + shift, live.server_time + shift])
    top = float(live.last_step or 0) * 1.04 + 1
    text = f"No progress for {fmt.duration(live.seconds_since_progress)}: possibly hung"
    return [t0.isoformat(), t1.isoformat(), t1.isoformat(), t0.isoformat(), t0.isoformat()], [0, 0, top, top, 0], text


def _rgba(hex_color: str, alpha: float) -> str:
    r, g, b = (int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def _bar(fig: go.Figure, starts: list[float], ends: list[float], row_label: str, *, color: str | list[str],
         name: str, text: list[str] | None, hover: list[str], legend: bool, group: str,
         text_color: str | list[str] = "white") -> None:
    start = np.asarray(starts, dtype=np.float64)
    width_ms = (np.asarray(ends, dtype=np.float64) - start) * 1000.0
    fig.add_trace(go.Bar(
        base=to_datetimes(start), x=width_ms, y=[row_label] * len(start), orientation="h", name=name,
        marker={"color": color, "line": {"width": 0}}, text=text, textposition="inside", insidetextanchor="start",
        textfont={"color": text_color, "size": 11}, hovertext=hover, hovertemplate="%{hovertext}<extra></extra>",
        showlegend=legend, legendgroup=group,
    ), row=1, col=1)


def _allocation_bars(fig: go.Figure, allocations: Sequence[AllocationSpan]) -> None:
    if not allocations:
        return
    _bar(fig, [a.start for a in allocations], [a.end for a in allocations], _ROW_ALLOC, color=_ALLOCATION_COLOR,
         name="Allocation", legend=False, group="alloc",
         text=[f"{a.gpus:,} GPUs" + (" (open)" if a.open else "") for a in allocations],
         hover=[f"Allocation: {a.gpus:,} GPUs<br>{fmt.timestamp(a.start)} → {fmt.timestamp(a.end)}"
                f"<br>{fmt.duration(a.end - a.start)}" for a in allocations])


def _outcome(attempt: AttemptSpan, is_last: bool, status: str) -> str:
    if attempt.failed:
        return "failed"
    if attempt.reason in ("completed", "preempted"):
        return str(attempt.reason)
    return "running" if is_last and status == "running" else "ended"


def _attempt_bars(fig: go.Figure, attempts: Sequence[AttemptSpan], status: str) -> None:
    if not attempts:
        return
    outcomes = [_outcome(a, i == len(attempts) - 1, status) for i, a in enumerate(attempts)]
    hover = []
    for a, outcome in zip(attempts, outcomes, strict=True):
        steps = (f"steps {fmt.integer(a.first_step)}–{fmt.integer(a.last_step)}"
                 if a.first_step is not None else "no step completed")
        hover.append(f"Attempt {a.attempt}: {outcome}<br>resumed from step {fmt.integer(a.resume_step)}, "
                     f"{steps}<br>{a.world_size:,} ranks, {fmt.duration(a.end - a.start)}")
    # Few attempts: "#1 failed"; many: "#1" (the colour and the hover say the outcome). A label that does not fit its
    # bar whole is hidden (uniformtext), never cut to "#1 fa".
    many = len(attempts) > LABELLED_ATTEMPTS
    _bar(fig, [a.start for a in attempts], [a.end for a in attempts], _ROW_ATTEMPTS,
         color=[STATUS_COLORS[o] for o in outcomes], text_color=[STATUS_TEXT_COLORS[o] for o in outcomes],
         name="Attempts", legend=False, group="attempts",
         text=[f"#{a.attempt}" if many else f"#{a.attempt} {o}" for a, o in zip(attempts, outcomes, strict=True)],
         hover=hover)
    fig.update_layout(uniformtext={"minsize": 9, "mode": "hide"})


def _segment_bars(fig: go.Figure, segments: Sequence[Segment]) -> None:
    for category in CATEGORY_ORDER:
        mine = [s for s in segments if s.category == category]
        if not mine:
            continue
        _bar(fig, [s.start for s in mine], [s.end for s in mine], _ROW_BAND, color=COLORS[category],
             name=LABELS[category], legend=True, group=category, text=None,
             hover=[f"{LABELS[category]}<br>{fmt.timestamp(s.start)} → {fmt.timestamp(s.end)}"
                    f"<br>{fmt.duration(s.end - s.start)}" for s in mine])


def _progress_lines(fig: go.Figure, progress: Sequence[Progress]) -> None:
    for p in progress:
        t = np.asarray(p.time, dtype=np.float64)
        s = np.asarray(p.step, dtype=np.int64)
        cut = p.rework_after_step
        kept = s <= cut if cut is not None else np.ones(len(s), dtype=bool)
        if kept.any():
            k = np.flatnonzero(kept)
            fig.add_trace(go.Scatter(
                x=to_datetimes(t[k]), y=s[k], mode="lines", line={"color": INK, "width": 2},
                name="Steps (kept)", legendgroup="steps", showlegend=False,
                hovertemplate=f"attempt {p.attempt}<br>step %{{y:,}}<br>%{{x|%H:%M:%S}} UTC<extra></extra>",
            ), row=2, col=1)
        if (~kept).any():
            r = np.flatnonzero(~kept)
            if kept.any():  # join the two pieces
                r = np.concatenate([[np.flatnonzero(kept)[-1]], r])
            fig.add_trace(go.Scatter(
                x=to_datetimes(t[r]), y=s[r], mode="lines", line={"color": COLORS["rework"], "width": 2, "dash": "dot"},
                name="Steps later redone (rework)", legendgroup="rework", showlegend=False,  # the Rework entry
                hovertemplate=f"attempt {p.attempt}: thrown away by the restart<br>step %{{y:,}}<br>"
                              "%{x|%H:%M:%S} UTC<extra></extra>",
            ), row=2, col=1)


def _checkpoint_marks(fig: go.Figure, checkpoints: Sequence[CheckpointRow]) -> None:
    if not checkpoints:
        return
    # A written checkpoint is the checkpoint category's mark: it joins that legend entry rather than adding a second
    # "Checkpoint"; a failed or torn write is a failure mark.
    for ok, name, symbol, color, group in (
            (True, LABELS["checkpoint"], "diamond", COLORS["checkpoint"], "checkpoint"),
            (False, "Checkpoint failed / torn", "x-thin-open", MARKER_COLORS["failure"], "checkpoint-failed")):
        mine = [c for c in checkpoints if c.ok is ok]
        if not mine:
            continue
        fig.add_trace(go.Scatter(
            x=to_datetimes([c.end for c in mine]), y=[c.step for c in mine], mode="markers", name=name,
            legendgroup=group, showlegend=not ok,
            marker={"symbol": symbol, "size": 7, "color": color, "line": {"width": 2, "color": color}},
            customdata=[[fmt.duration(c.blocking_seconds), "torn" if c.torn else ("ok" if c.ok else "failed")]
                        for c in mine],
            hovertemplate="checkpoint at step %{y:,} (%{customdata[1]})<br>blocked %{customdata[0]}<extra></extra>",
        ), row=2, col=1)


def _span_s(view: RunViews) -> float:
    """The seconds the timeline's axis spans (its allocations and attempts)."""
    tl = view.timeline
    times = [t for a in tl.allocations for t in (a.start, a.end)] + [t for a in tl.attempts for t in (a.start, a.end)]
    return max(times) - min(times) if times else 0.0


def _failure_marks(fig: go.Figure, failures: Sequence[Failure], hangs: Sequence[HangSpan]) -> None:
    marked = [f for f in failures if f.step is not None]
    if marked:
        fig.add_trace(go.Scatter(
            x=to_datetimes([f.time for f in marked]), y=[f.step for f in marked], mode="markers",
            name="Failure", marker={"symbol": "x", "size": 12, "color": MARKER_COLORS["failure"],
                                    "line": {"width": 1, "color": "white"}},
            customdata=[[f.attempt, f.reason, fmt.failure_cause(f.cause) if f.cause is not None else ""]
                        for f in marked],
            hovertemplate="attempt %{customdata[0]} %{customdata[1]} at step %{y:,}<br>%{x|%H:%M:%S} UTC"
                          "<br>%{customdata[2]}<extra></extra>",
        ), row=2, col=1)
    for h in hangs[:_MAX_MARKED]:
        fig.add_vrect(x0=to_datetimes([h.start])[0], x1=to_datetimes([h.end])[0], row=2, col=1,
                      fillcolor=COLORS["hang"], opacity=0.12, line_width=0, layer="below")


def _restart_marks(fig: go.Figure, restarts: Sequence[Restart], span_s: float) -> None:
    """A dotted line per restart (the first `_MAX_MARKED`), a hover mark for each at its resume step, and a label
    where one fits: labels are staggered in rows so that none overlaps another; a restart with no room for its
    label keeps its line and hover."""
    if not restarts:
        return
    fig.add_trace(go.Scatter(
        x=to_datetimes([r.time for r in restarts]), y=[r.resume_step or 0 for r in restarts], mode="markers",
        name="Restart", marker={"symbol": "triangle-right", "size": 9, "color": MARKER_COLORS["restart"]},
        customdata=[[r.attempt, fmt.integer(r.resume_step)] for r in restarts],
        hovertemplate="restart: attempt %{customdata[0]} resumes from step %{customdata[1]}<br>%{x|%H:%M:%S} UTC"
                      "<extra></extra>"), row=2, col=1)
    for r in restarts[:_MAX_MARKED]:
        fig.add_vline(x=to_datetimes([r.time])[0], line={"color": MARKER_COLORS["restart"], "width": 1, "dash": "dot"})
    for r, row in zip(restarts, label_rows([r.time for r in restarts], span_s), strict=True):
        if row is not None:
            fig.add_annotation(x=to_datetimes([r.time])[0], y=1 - 0.09 * row, yref="y2 domain", xanchor="left",
                               yanchor="top", showarrow=False, text=f" restart → step {fmt.integer(r.resume_step)}",
                               font={"size": 10, "color": MUTED}, name="restart-label")


def ledger_figure(ledger: Ledger) -> go.Figure:
    """The ledger as a waterfall: allocated GPU time, minus each waste category, leaves the productive part (in the
    one unit the allocated total calls for)."""
    allocated = ledger.allocated_gpu_seconds
    if allocated <= 0:
        return empty_figure("Nothing allocated yet: no GPU time to account for")
    waste = ledger.waste_gpu_seconds
    names = ["Allocated", *(LABELS[c] for c in CATEGORIES), LABELS[EVAL], "Productive"]
    values = [allocated, *(waste[c] for c in CATEGORIES), ledger.eval_gpu_seconds, ledger.productive_gpu_seconds]
    bases, level = [], allocated
    for value in values[1:-1]:
        level -= value
        bases.append(level)
    bases = [0.0, *bases, 0.0]
    colors = [_ALLOCATION_COLOR, *(COLORS[c] for c in CATEGORIES), COLORS[EVAL], COLORS["productive"]]
    unit = fmt.gpu_time_unit(allocated)
    fig = base_figure(height=340, showlegend=False, bargap=0.3, uirevision="ledger")
    fig.add_trace(go.Bar(
        x=names, y=[unit.value(v) for v in values], base=[unit.value(b) for b in bases], marker={"color": colors},
        text=[f"{fmt.gpu_time(v, unit)}<br>{fmt.share(v, allocated)}" if v > 0 else "" for v in values],  # none: no
        # bar and no label (the hover says 0)
        textposition="outside",
        textfont={"size": 11},
        cliponaxis=False, customdata=[fmt.gpu_time(v, unit) for v in values],
        hovertemplate="%{x}: %{customdata}<extra></extra>",
    ))
    fig.update_yaxes(title_text=unit.title, rangemode="tozero", range=[0, unit.value(allocated) * 1.18])
    fig.update_xaxes(title_text=None)
    return fig


def rank_compute_figure(ranks: RankCompute | NoRankCompute) -> go.Figure:
    """Median compute seconds per step for each rank (whisker to p90); stragglers in the straggler colour."""
    if not isinstance(ranks, RankCompute) or not ranks.rows:
        return empty_figure("No step timings reported yet")
    rows = ranks.rows
    x = [r.rank for r in rows]
    median = np.array([r.median_compute_s for r in rows])
    p90 = np.array([r.p90_compute_s for r in rows])
    slow = [r.is_straggler for r in rows]
    colors = [COLORS["straggler"] if s else RANK_BAR for s in slow]
    fig = base_figure(height=340, showlegend=False, uirevision="ranks", bargap=0.15)
    hover = [f"rank {r.rank}" + (f" on {r.host}" if r.host else "") +
             f"<br>median {fmt.duration(r.median_compute_s)}, p90 {fmt.duration(r.p90_compute_s)}, "
             f"mean {fmt.duration(r.mean_compute_s)}<br>{r.steps:,} steps; straggler cost "
             f"{fmt.gpu_time(r.straggler_gpu_seconds)}" for r in rows]
    trace_cls = go.Bar if len(rows) <= 256 else go.Scattergl
    kwargs: dict[str, Any] = {"marker": {"color": colors}} if trace_cls is go.Bar else {
        "mode": "markers", "marker": {"color": colors, "size": [9 if s else 4 for s in slow]}}
    fig.add_trace(trace_cls(x=x, y=median, hovertext=hover, hovertemplate="%{hovertext}<extra></extra>",
                            error_y={"type": "data", "array": np.maximum(p90 - median, 0), "arrayminus": [0] * len(x),
                                     "color": "#9CA3AF", "thickness": 1, "width": 0}, **kwargs))
    overall = ranks.median_compute_s
    if overall:
        fig.add_hline(y=overall, line={"color": MUTED, "dash": "dash", "width": 1},
                      annotation_text=f"median of ranks {fmt.duration(overall)}", annotation_position="top left",
                      annotation_font={"size": 11, "color": MUTED})
    for r in [r for r in rows if r.is_straggler][:5]:
        excess = (r.median_compute_s / overall - 1) if overall else 0.0
        fig.add_annotation(x=r.rank, y=max(r.p90_compute_s, r.median_compute_s), yanchor="bottom",
                           text=f"rank {r.rank}: {excess:+.0%}", showarrow=True, arrowhead=0, ay=-24,
                           arrowcolor=COLORS["straggler"], font={"color": INK, "size": 12})
    fig.update_xaxes(title_text="rank", tickformat=",d")
    top = float(np.nanmax(np.maximum(p90, median))) if len(rows) else 1.0
    fig.update_yaxes(title_text="compute per step (s)", rangemode="tozero", range=[0, top * 1.25])
    return fig


def heatmap_figure(ranks: RankCompute | NoRankCompute) -> go.Figure:
    """Mean compute per rank (group) and step bucket, against the median of all ranks: a healthy run is evenly pale,
    a straggler a dark row (the scale's dark end is +50% or more; faster than the median stays pale)."""
    heat = ranks.heatmap
    if heat is None or not heat.z:
        return empty_figure("No step timings reported yet")
    n_rows = len(heat.rank_labels)
    fig = base_figure(height=min(560, max(300, 120 + 16 * n_rows)), uirevision="heatmap")  # a label per row up to ~27
    per = heat.ranks_per_row
    z = np.array([[np.nan if v is None else v for v in row] for row in heat.z], dtype=np.float64)
    reference = ranks.median_compute_s if isinstance(ranks, RankCompute) and ranks.median_compute_s else None
    if reference is None or reference <= 0:
        finite = z[np.isfinite(z)]
        reference = float(np.median(finite)) if finite.size else 1.0
    excess = np.where(np.isfinite(z), z / reference - 1.0, np.nan)
    labels, row_hosts = _heat_rows(ranks, heat.rank_labels)
    customdata = [[[v, host or "host not reported"] for v in row] for row, host in zip(heat.z, row_hosts, strict=True)]
    fig.add_trace(go.Heatmap(
        z=[[None if not np.isfinite(v) else float(v) for v in row] for row in excess], x=heat.step_centers,
        y=labels, customdata=customdata, colorscale=_HEAT_SCALE, zmin=0.0, zmax=_HEAT_SPAN, hoverongaps=False,
        colorbar={"title": {"text": "vs median", "side": "right"}, "thickness": 12, "outlinewidth": 0,
                  "tickformat": "+.0%"},
        hovertemplate=("ranks %{y}" if per > 1 else "rank %{y}") + " (%{customdata[1]})<br>steps around %{x:,}<br>"
                      "mean compute %{customdata[0]:.3f} s (%{z:+.0%} vs the median)<extra></extra>",
    ))
    fig.update_xaxes(title_text="step", tickformat=",d", showgrid=False)
    fig.update_yaxes(title_text="rank · host" if per == 1 else f"ranks · hosts ({per} per row, slowest shown)",
                     type="category", autorange="reversed", showgrid=False, gridcolor=GRID, automargin=True,
                     title_standoff=8)
    # the labels name hosts: leave them room (about 8 px a character) besides the axis title
    fig.update_layout(margin={"l": 40 + 8 * max((len(label) for label in labels), default=4)})
    return fig


def rank_of_heat_label(label: object) -> int | None:
    """The rank a heat map row stands for, from its label ("5 · node000" -> 5); None for a group ("0-7 · ...")."""
    first = str(label).split(" · ", 1)[0] if label is not None else ""
    return int(first) if first.isdigit() else None


def _heat_rows(ranks: RankCompute | NoRankCompute, labels: Sequence[str]) -> tuple[list[str], list[str | None]]:
    """Each heat map row's axis label with its host(s) ("5 · node000", "0-7 · node000"; `rank_of_heat_label` reads
    the rank back) and its host(s)."""
    host_of = {r.rank: r.host for r in ranks.rows}
    out_labels: list[str] = []
    out_hosts: list[str | None] = []
    for label in labels:
        first, _, last = label.partition("-")
        lo = int(first)
        hi = int(last) if last else lo
        hosts = sorted({h for r in range(lo, hi + 1) if (h := host_of.get(r))})
        host = None if not hosts else hosts[0] if len(hosts) == 1 else f"{hosts[0]}…{hosts[-1]}"
        out_labels.append(f"{label} · {host}" if host else label)
        out_hosts.append(host)
    return out_labels, out_hosts
