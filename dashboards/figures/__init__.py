"""Pure figure builders: API answers or DataFrames in, plotly figures out. No I/O, no Dash."""

from dashboards.figures.common import empty_figure
from dashboards.figures.fleet import compare_figure, fleet_over_time_figure, fleet_runs_figure, goodput_trend_figure
from dashboards.figures.run import (
    heatmap_figure,
    ledger_figure,
    rank_compute_figure,
    stall_band,
    timeline_figure,
)

__all__ = [
    "compare_figure",
    "empty_figure",
    "fleet_over_time_figure",
    "fleet_runs_figure",
    "goodput_trend_figure",
    "heatmap_figure",
    "ledger_figure",
    "rank_compute_figure",
    "stall_band",
    "timeline_figure",
]
