"""The dashboard's look: fonts, ink and the plotly template (category, status and marker colours and labels:
services.presentation, where every surface reads them)."""

from __future__ import annotations

import plotly.graph_objects as go

FONT = "Inter, -apple-system, BlinkMacSystemFont, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif"
INK = "#1F2937"
MUTED = "#6B7280"
GRID = "#E5E7EB"
RANK_BAR = "#64748B"  # a rank that is not a straggler: neutral, neither a category's colour nor a status's


def template() -> go.layout.Template:
    return go.layout.Template(layout=go.Layout(
        font={"family": FONT, "size": 13, "color": INK},
        paper_bgcolor="white",
        plot_bgcolor="white",
        margin={"l": 70, "r": 24, "t": 40, "b": 56},
        xaxis={"gridcolor": GRID, "zerolinecolor": GRID, "linecolor": GRID, "ticks": "outside",
               "tickcolor": GRID, "title": {"standoff": 8}},
        yaxis={"gridcolor": GRID, "zerolinecolor": GRID, "linecolor": GRID, "title": {"standoff": 8}},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "xanchor": "left", "x": 0,
                "bgcolor": "rgba(0,0,0,0)"},
        hoverlabel={"font": {"family": FONT}},
        title={"x": 0, "xanchor": "left", "font": {"size": 15}},
    ))
