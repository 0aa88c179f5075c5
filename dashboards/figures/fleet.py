"""Fleet figures: the worst runs as stacked bars, and GPU-hours by category over time."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from dashboards.figures.common import base_figure, empty_figure, to_datetimes
from services import presentation as fmt
from services.presentation import CATEGORIES, COLORS, LABELS


def fleet_runs_figure(runs: pd.DataFrame, limit: int = 25) -> go.Figure:
    """One horizontal bar per run (worst first, on top): productive and each waste category, in GPU-hours."""
    if runs.empty:
        return empty_figure("No runs match the filters")
    top = runs.head(limit).iloc[::-1]  # plotly draws the first category at the bottom
    fig = base_figure(height=max(300, 110 + 30 * len(top)), barmode="stack", bargap=0.3)
    labels = [_short(r) for r in top["run_id"]]
    for category in ("productive", *CATEGORIES):
        column = "productive_gpu_seconds" if category == "productive" else f"waste_{category}"
        values = top[column].astype(float)
        fig.add_trace(go.Bar(
            y=labels, x=values / 3600.0, orientation="h", name=LABELS[category],
            marker={"color": COLORS[category]},
            customdata=list(zip(top["run_id"], [fmt.gpu_hours(v) for v in values],
                                [fmt.share(v, a) for v, a in zip(values, top["allocated_gpu_seconds"], strict=True)],
                                top["project"], strict=True)),
            hovertemplate="%{customdata[0]}<br>" + LABELS[category] + ": %{customdata[1]} (%{customdata[2]})"
                          "<extra></extra>",
        ))
    fig.update_xaxes(title_text="GPU-hours")
    fig.update_yaxes(title_text=None, automargin=True)
    fig.update_layout(margin={"l": 10, "t": 40}, uirevision="fleet-runs", legend={"traceorder": "normal"})
    return fig


def fleet_over_time_figure(buckets: pd.DataFrame, width_label: str) -> go.Figure:
    """Stacked GPU-hours per time bucket: where the fleet's GPU time went, and when."""
    if buckets.empty:
        return empty_figure("No run has reported any time yet")
    fig = base_figure(height=320, barmode="stack", bargap=0.1)
    for category in ("productive", *CATEGORIES):
        part = buckets[buckets["category"] == category]
        if part["gpu_seconds"].sum() <= 0:
            continue
        fig.add_trace(go.Bar(
            x=to_datetimes(part["bucket_start"].to_numpy()), y=part["gpu_seconds"] / 3600.0, name=LABELS[category],
            marker={"color": COLORS[category]}, xperiod=None,
            hovertemplate="%{x|%Y-%m-%d %H:%M} UTC<br>" + LABELS[category] + ": %{y:,.2f} GPU-h<extra></extra>",
        ))
    fig.update_xaxes(title_text=f"time (UTC), {width_label} buckets")
    fig.update_yaxes(title_text="GPU-hours")
    fig.update_layout(uirevision="fleet-over-time", legend={"traceorder": "normal"})
    return fig


def _short(run_id: str, n: int = 28) -> str:
    return run_id if len(run_id) <= n else run_id[: n - 1] + "…"
