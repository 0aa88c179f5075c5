"""One rank's figures for the run page's drill-down (GET /v1/runs/{run_id}/ranks/{rank}): its own timeline (the
attempts it was part of, the step it reached, the failures) and its steps' compute and collective time."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dashboards.figures.common import base_figure, broken_at_changes, empty_figure, to_datetimes
from dashboards.figures.run import LABELLED_ATTEMPTS
from dashboards.theme import INK, MUTED, RANK_BAR, template
from services import presentation as fmt
from services.presentation import MARKER_COLORS, STATUS_COLORS, STATUS_TEXT_COLORS
from services.schemas.ranks import RankDetail

_ROW = "Attempts"
_COLLECTIVE_COLOR = "#CBD5E1"  # a lighter neutral above the compute's: no waste category's or status's colour


def rank_timeline_figure(detail: RankDetail) -> go.Figure:
    """Top: the attempts the rank was part of (its own start and end); bottom: the step it reached over time, with
    the failures of its attempts (✕)."""
    if not detail.attempts:
        return empty_figure(f"Rank {detail.rank} sent no attempt event and no step", height=300)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.25, 0.75], vertical_spacing=0.08)
    fig.update_layout(template=template(), height=360, barmode="overlay", bargap=0.35, hovermode="closest",
                      showlegend=False, uirevision=f"rank-timeline-{detail.run_id}-{detail.rank}",
                      margin={"t": 16, "l": 90})
    spans = [a for a in detail.attempts if a.start is not None and a.end is not None]
    outcomes = ["failed" if a.failed else ("completed" if a.reason == "completed" else "ended") for a in spans]
    if spans:
        start = np.array([a.start for a in spans], dtype=np.float64)
        width_ms = (np.array([a.end for a in spans], dtype=np.float64) - start) * 1000.0
        fig.add_trace(go.Bar(
            base=to_datetimes(start), x=width_ms, y=[_ROW] * len(spans), orientation="h",
            marker={"color": [STATUS_COLORS[o] for o in outcomes], "line": {"width": 0}},
            text=[f"#{a.attempt}" if len(spans) > LABELLED_ATTEMPTS else f"#{a.attempt} {o}"
                  for a, o in zip(spans, outcomes, strict=True)], textposition="inside", insidetextanchor="start",
            textfont={"color": [STATUS_TEXT_COLORS[o] for o in outcomes], "size": 11},
            hovertext=[f"Attempt {a.attempt} ({o}) on {a.host or 'unknown host'}<br>"
                       f"{fmt.timestamp(a.start)} → {fmt.timestamp(a.end)}<br>{fmt.integer(a.steps)} steps"
                       for a, o in zip(spans, outcomes, strict=True)],
            hovertemplate="%{hovertext}<extra></extra>", name="Attempts"), row=1, col=1)
    fig.update_layout(uniformtext={"minsize": 9, "mode": "hide"})
    s = detail.steps
    if s.step:  # one line per attempt: a restart's steps start again from its resume step
        ends, steps, attempts = broken_at_changes(s.attempt, list(to_datetimes(s.end)), s.step, s.attempt)
        fig.add_trace(go.Scatter(
            x=ends, y=steps, mode="lines", line={"color": INK, "width": 2}, name="Step reached", connectgaps=False,
            customdata=attempts, hovertemplate="attempt %{customdata}<br>step %{y:,}<br>%{x|%H:%M:%S} UTC"
                                                "<extra></extra>"), row=2, col=1)
    marked = [f for f in detail.failures if f.step is not None]
    if marked:
        fig.add_trace(go.Scatter(
            x=to_datetimes([f.time for f in marked]), y=[f.step for f in marked], mode="markers", name="Failure",
            marker={"symbol": "x", "size": 12, "color": MARKER_COLORS["failure"],
                    "line": {"width": 1, "color": "white"}},
            customdata=[[f.attempt, f.reason] for f in marked],
            hovertemplate="attempt %{customdata[0]} %{customdata[1]} at step %{y:,}<extra></extra>"), row=2, col=1)
    fig.update_yaxes(row=1, col=1, showgrid=False, fixedrange=True)
    fig.update_yaxes(row=2, col=1, title_text="step", rangemode="tozero", tickformat=",d")
    fig.update_xaxes(type="date", row=1, col=1, showticklabels=False)
    fig.update_xaxes(type="date", row=2, col=1, title_text="time (UTC)")
    return fig


def rank_steps_figure(detail: RankDetail) -> go.Figure:
    """Each step's compute and collective seconds (stacked: together the step's duration), against the median of all
    ranks' compute."""
    s = detail.steps
    if not s.step:
        return empty_figure(f"Rank {detail.rank} reported no step", height=300)
    fig = base_figure(height=320, uirevision=f"rank-steps-{detail.run_id}-{detail.rank}", hovermode="x unified",
                      legend={"orientation": "h", "x": 0, "y": 1.12, "traceorder": "normal"})
    per = s.steps_per_point
    what = "mean over " + fmt.integer(per) + " steps" if per > 1 else "per step"
    x = np.arange(len(s.step))
    labels = [f"step {n:,} (attempt {a})" for n, a in zip(s.step, s.attempt, strict=True)]
    fig.add_trace(go.Scatter(
        x=x, y=s.compute_s, mode="lines", stackgroup="step", line={"color": RANK_BAR, "width": 1},
        name=f"compute ({what})", customdata=labels, hovertemplate="%{customdata}: compute %{y:.3f} s<extra></extra>"))
    if any(v is not None for v in s.collective_s):
        fig.add_trace(go.Scatter(
            x=x, y=[0.0 if v is None else v for v in s.collective_s], mode="lines", stackgroup="step",
            line={"color": _COLLECTIVE_COLOR, "width": 1}, name=f"collectives ({what})",
            hovertemplate="collectives %{y:.3f} s<extra></extra>"))
    if detail.run_median_compute_s:
        fig.add_hline(y=detail.run_median_compute_s, line={"color": MUTED, "dash": "dash", "width": 1},
                      annotation_text=f"median of all ranks' compute {fmt.duration(detail.run_median_compute_s)}",
                      annotation_position="top left")
    ticks = np.unique(np.linspace(0, len(x) - 1, num=min(len(x), 8)).round().astype(int))
    fig.update_xaxes(title_text="step", tickvals=ticks.tolist(), ticktext=[f"{s.step[i]:,}" for i in ticks])
    fig.update_yaxes(title_text="seconds", rangemode="tozero")
    return fig
