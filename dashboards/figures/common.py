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
