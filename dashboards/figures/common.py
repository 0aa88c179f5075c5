"""Helpers shared by the figure builders."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from dashboards.theme import MUTED, template


def base_figure(height: int, **layout: object) -> go.Figure:
    fig = go.Figure(layout=go.Layout(template=template(), height=height))
    fig.update_layout(**layout)
    return fig


def empty_figure(message: str, height: int = 260) -> go.Figure:
    """A blank chart that says why it is blank (instead of empty axes)."""
    fig = base_figure(height)
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                       font={"size": 14, "color": MUTED})
    return fig


def to_datetimes(epoch_s: Sequence[float] | np.ndarray) -> pd.DatetimeIndex:
    """UTC epoch seconds -> naive UTC datetimes (the axes say "UTC")."""
    return pd.to_datetime(np.asarray(epoch_s, dtype=np.float64), unit="s")


def broken_at_changes(keys: Sequence[int], *columns: Sequence[object]) -> tuple[list[object], ...]:
    """`columns` with a None between two points whose `keys` differ (a line breaks there: a restart's attempt does
    not continue the previous one's line, which would seem to run backwards)."""
    out: tuple[list[object], ...] = tuple([] for _ in columns)
    for i, key in enumerate(keys):
        if i and key != keys[i - 1]:
            for column in out:
                column.append(None)
        for column, values in zip(out, columns, strict=True):
            column.append(values[i])
    return out


def label_rows(times: Sequence[float], span_s: float, *, width_share: float = 0.16, rows: int = 3) -> list[int | None]:
    """A row for each label at `times` (ascending) so that labels in one row stand at least `width_share` of the
    axis apart and never overlap: 0 is the top row; None: no room left (the mark's hover says it)."""
    gap = span_s * width_share
    last: list[float] = []
    out: list[int | None] = []
    for t in times:
        row = next((i for i, prev in enumerate(last) if t - prev >= gap), None)
        if row is None and len(last) < rows:
            row = len(last)
            last.append(t)
        elif row is not None:
            last[row] = t
        out.append(row)
    return out
