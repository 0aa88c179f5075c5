"""One look everywhere: category colours (colour-blind safe, Okabe-Ito), fonts and the plotly template."""

from __future__ import annotations

import plotly.graph_objects as go

CATEGORIES: tuple[str, ...] = ("startup", "checkpoint", "rework", "hang", "straggler", "idle")

COLORS: dict[str, str] = {
    "productive": "#009E73",
    "startup": "#CC79A7",
    "checkpoint": "#0072B2",
    "rework": "#E69F00",
    "hang": "#D55E00",
    "straggler": "#B8A800",
    "idle": "#A0A4AB",
}

LABELS: dict[str, str] = {
    "productive": "Productive",
    "startup": "Startup",
    "checkpoint": "Checkpoint",
    "rework": "Rework",
    "hang": "Hang",
    "straggler": "Straggler",
    "idle": "Idle",
}

DESCRIPTIONS: dict[str, str] = {
    "productive": "steps whose result was kept, minus straggler time",
    "startup": "process start to the first step, after allocation and after every restart",
    "checkpoint": "training blocked while writing a checkpoint (torn writes included)",
    "rework": "steps computed again because a restart resumed from an earlier checkpoint",
    "hang": "no progress between the last step and the failure being torn down",
    "straggler": "other ranks waiting for the slowest rank in each step",
    "idle": "allocated GPUs doing nothing the run reported",
}

STATUS_COLORS: dict[str, str] = {
    "running": "#0072B2",
    "finished": "#009E73",
    "failed": "#D55E00",
    "cancelled": "#6B7280",
}

FONT = "Inter, -apple-system, BlinkMacSystemFont, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif"
INK = "#1F2937"
MUTED = "#6B7280"
GRID = "#E5E7EB"


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
