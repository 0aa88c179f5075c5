"""The run page's training curves (GET /v1/runs/{run_id}/curves): loss, learning rate and step time over time, one
line per attempt (a restart starts a new one), restarts dotted across the three, completed checkpoints marked."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dashboards.figures.common import broken_at_changes, empty_figure, to_datetimes
from dashboards.theme import INK, template
from services.presentation import COLORS, MARKER_COLORS
from services.schemas.views import CurveMark, CurveSeries, TrainingCurves

_ROWS = (("loss", "Loss", "loss"), ("lr", "Learning rate", "lr"), ("step_seconds", "Step time", "step time (s)"))


def training_curves_figure(curves: TrainingCurves) -> go.Figure:
    if not any(getattr(curves, name) for name, _, _ in _ROWS):
        return empty_figure("No step reported a loss, a learning rate or a duration yet", height=300)
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.06, row_heights=[0.4, 0.25, 0.35])
    fig.update_layout(template=template(), height=560, hovermode="closest", uirevision=f"curves-{curves.run_id}",
                      legend={"orientation": "h", "x": 0, "y": 1.06}, margin={"t": 40, "l": 90})
    for row, (name, label, axis) in enumerate(_ROWS, start=1):
        series: Sequence[CurveSeries] = getattr(curves, name)
        if series:
            attempts = [s.attempt for s in series for _ in s.time]
            x, y, steps, attempt = broken_at_changes(
                attempts, list(to_datetimes([t for s in series for t in s.time])),
                [v for s in series for v in s.value], [n for s in series for n in s.step], attempts)
            fig.add_trace(go.Scatter(
                x=x, y=y, mode="lines", name=label, connectgaps=False, line={"color": INK, "width": 1.5},
                customdata=list(zip(attempt, steps, strict=True)), showlegend=False,
                hovertemplate=f"{label} %{{y:.4g}}<br>step %{{customdata[1]:,}} (attempt %{{customdata[0]}})"
                              "<br>%{x|%H:%M:%S} UTC<extra></extra>"), row=row, col=1)
        else:
            fig.add_annotation(text=f"no {label.lower()} reported", showarrow=False, x=0.5, y=0.5,
                               xref="x domain", yref=f"y{row if row > 1 else ''} domain")
        fig.update_yaxes(title_text=axis, row=row, col=1, rangemode="normal" if name == "loss" else "tozero")
    if curves.checkpoints:
        _add_marks(fig, curves.checkpoints, "Checkpoint",
                   {"symbol": "diamond", "size": 7, "color": COLORS["checkpoint"]})
    if curves.restarts:
        _add_marks(fig, curves.restarts, "Restart",
                   {"symbol": "triangle-right", "size": 10, "color": MARKER_COLORS["restart"]})
        for r in curves.restarts[:60]:
            fig.add_vline(x=to_datetimes([r.time])[0], line={"color": MARKER_COLORS["restart"], "width": 1,
                                                            "dash": "dot"})
    fig.update_xaxes(type="date", row=3, col=1, title_text="time (UTC)")
    return fig


def _add_marks(fig: go.Figure, marks: Sequence[CurveMark], name: str, marker: dict[str, object]) -> None:
    """`marks` as one trace of markers at the foot of the step time plot (row 3), each labelled on hover."""
    fig.add_trace(go.Scatter(
        x=to_datetimes([m.time for m in marks]), y=[0.0] * len(marks), mode="markers", name=name, marker=marker,
        text=[m.label for m in marks], hovertemplate="%{text}<br>%{x|%H:%M:%S} UTC<extra></extra>"), row=3, col=1)
