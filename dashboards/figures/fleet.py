"""Fleet figures: the worst runs (or projects) as stacked bars, GPU time by category over time, goodput over time
per project, and runs compared side by side. GPU figures in one unit per chart (services.presentation)."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from dashboards.figures.common import base_figure, empty_figure, to_datetimes
from services import presentation as fmt
from services.presentation import CATEGORIES, CATEGORY_ORDER, COLORS, LABELS
from services.schemas.categories import EVAL

_KEYS = CATEGORY_ORDER
_COLUMN = {"productive": "productive_gpu_seconds", EVAL: "eval_gpu_seconds", **{c: f"waste_{c}" for c in CATEGORIES}}
# Lines of the goodput trend, one per project (Okabe-Ito's remaining black and sky blue, then Tol's dark colours):
# projects are not categories or statuses, so they are drawn in ink with dashes as well as colours.
_PROJECT_LINES = (("#000000", "solid"), ("#56B4E9", "solid"), ("#000000", "dash"), ("#56B4E9", "dash"),
                  ("#000000", "dot"), ("#56B4E9", "dot"), ("#000000", "dashdot"), ("#56B4E9", "dashdot"))


def fleet_runs_figure(runs: pd.DataFrame, limit: int = 25, *, label_column: str = "run_id") -> go.Figure:
    """One horizontal bar per run (or per project, `label_column="project"`), worst first on top: productive and
    each waste category."""
    if runs.empty:
        return empty_figure("No runs match the filters")
    top = runs.head(limit).iloc[::-1]  # plotly draws the first category at the bottom
    unit = fmt.gpu_time_unit(*top["allocated_gpu_seconds"].tolist())
    fig = base_figure(height=max(300, 110 + 30 * len(top)), barmode="stack", bargap=0.3)
    labels = [_short(str(r)) for r in top[label_column]]
    run_ids = top["run_id"] if "run_id" in top else top[label_column]
    for category in _KEYS:
        values = top[_COLUMN[category]].astype(float)
        fig.add_trace(go.Bar(
            y=labels, x=[unit.value(v) for v in values], orientation="h", name=LABELS[category],
            marker={"color": COLORS[category]}, legendgroup=category,
            customdata=list(zip(run_ids, [fmt.gpu_time(v, unit) for v in values],
                                [fmt.share(v, a) for v, a in zip(values, top["allocated_gpu_seconds"], strict=True)],
                                top["project"], strict=True)),
            hovertemplate="%{customdata[0]}<br>" + LABELS[category] + ": %{customdata[1]} (%{customdata[2]})"
                          "<extra></extra>",
        ))
    fig.update_xaxes(title_text=unit.title, tickformat=",")
    fig.update_yaxes(title_text=None, automargin=True)
    fig.update_layout(margin={"l": 10, "t": 40}, uirevision="fleet-runs", legend={"traceorder": "normal"})
    return fig


def fleet_over_time_figure(buckets: pd.DataFrame, width_label: str) -> go.Figure:
    """Stacked GPU time per time bucket: where the fleet's GPU time went, and when (each run's time where it was
    spent)."""
    if buckets.empty or buckets["gpu_seconds"].sum() <= 0:
        return empty_figure("No GPU time in this range")
    per = buckets.groupby(["category", "bucket_start"], sort=True)["gpu_seconds"].sum()
    unit = fmt.gpu_time_unit(float(per.groupby(level="bucket_start").sum().max()))
    fig = base_figure(height=320, barmode="stack", bargap=0.1)
    for category in _KEYS:
        if category not in per.index.get_level_values(0):
            continue
        part = per.loc[category]
        if part.sum() <= 0:
            continue
        fig.add_trace(go.Bar(
            x=to_datetimes(part.index.to_numpy()), y=[unit.value(v) for v in part.to_numpy()], name=LABELS[category],
            marker={"color": COLORS[category]}, xperiod=None, legendgroup=category,
            hovertemplate="%{x|%Y-%m-%d %H:%M} UTC<br>" + LABELS[category] + ": %{y:" + unit.d3_format + "} "
                          + unit.symbol + "<extra></extra>",
        ))
    fig.update_xaxes(title_text=f"time (UTC), {width_label} buckets")
    fig.update_yaxes(title_text=unit.title)
    fig.update_layout(uirevision="fleet-over-time", legend={"traceorder": "normal"})
    return fig


def goodput_trend_figure(buckets: pd.DataFrame, width_label: str) -> go.Figure:
    """Goodput per time bucket, one line per project (productive ÷ allocated GPU time of the bucket)."""
    if buckets.empty or buckets["gpu_seconds"].sum() <= 0:
        return empty_figure("No GPU time in this range")
    allocated = buckets.groupby(["project", "bucket_start"], sort=True)["gpu_seconds"].sum()
    productive = buckets[buckets["category"] == "productive"].groupby(
        ["project", "bucket_start"], sort=True)["gpu_seconds"].sum().reindex(allocated.index, fill_value=0.0)
    fig = base_figure(height=320, hovermode="x unified")
    for i, project in enumerate(allocated.index.get_level_values(0).unique()):
        alloc, prod = allocated.loc[project], productive.loc[project]
        ratio = [p / a if a > 0 else None for p, a in zip(prod.to_numpy(), alloc.to_numpy(), strict=True)]
        color, dash = _PROJECT_LINES[i % len(_PROJECT_LINES)]
        unit = fmt.gpu_time_unit(float(alloc.max()))
        fig.add_trace(go.Scatter(
            x=to_datetimes(alloc.index.to_numpy()), y=ratio, mode="lines+markers", name=str(project),
            line={"color": color, "dash": dash, "width": 2}, marker={"size": 5}, connectgaps=False,
            customdata=[fmt.gpu_time(a, unit) for a in alloc.to_numpy()],
            hovertemplate=f"{project}: " + "%{y:.1%} of %{customdata}<extra></extra>",
        ))
    fig.update_xaxes(title_text=f"time (UTC), {width_label} buckets")
    fig.update_yaxes(title_text="goodput", tickformat=".0%", range=[0, 1.05])
    fig.update_layout(uirevision="fleet-trend", legend={"title": {"text": "project "}})
    return fig


def compare_figure(runs: pd.DataFrame) -> go.Figure:
    """The chosen runs side by side: each one's allocated GPU time as 100%, split by category."""
    if runs.empty:
        return empty_figure("Choose two or more runs to compare")
    shown = runs.iloc[::-1]
    labels = [_short(r) for r in shown["run_id"]]
    fig = base_figure(height=max(200, 100 + 36 * len(shown)), barmode="stack", bargap=0.35)
    allocated = shown["allocated_gpu_seconds"].astype(float).to_numpy()
    for category in _KEYS:
        values = shown[_COLUMN[category]].astype(float).to_numpy()
        fig.add_trace(go.Bar(
            y=labels, x=[v / a if a > 0 else 0.0 for v, a in zip(values, allocated, strict=True)], orientation="h",
            name=LABELS[category], marker={"color": COLORS[category]}, legendgroup=category,
            customdata=[fmt.gpu_time(float(v)) for v in values],
            hovertemplate="%{y}<br>" + LABELS[category] + ": %{x:.1%} (%{customdata})<extra></extra>",
        ))
    fig.update_xaxes(title_text="share of the run's allocated GPU time", tickformat=".0%", range=[0, 1])
    fig.update_yaxes(title_text=None, automargin=True)
    fig.update_layout(margin={"l": 10, "t": 40}, uirevision="fleet-compare", legend={"traceorder": "normal"})
    return fig


def _short(run_id: str, n: int = 28) -> str:
    return run_id if len(run_id) <= n else run_id[: n - 1] + "…"
