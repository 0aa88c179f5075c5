"""Fleet: every run, worst first, with where its GPU time went; fleet totals and waste over time."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import dash
import flask
from dash import Input, Output, State, callback, dcc, html, no_update
from pydantic import BaseModel, Field

from dashboards import data, figures, ids
from dashboards.components import fleet_parts
from dashboards.components.empty import no_runs_yet
from dashboards.components.kpi import message
from services import presentation as fmt
from services.api_client import ApiError, LiveRun, RunListItem
from services.presentation import CATEGORIES, COLORS, DESCRIPTIONS, LABELS

dash.register_page(__name__, path="/", name="Fleet", title="goodput: fleet")

_STATUSES = ("running", "finished", "failed", "cancelled")
_RANGES = {"1h": "Last hour", "24h": "Last 24 hours", "7d": "Last 7 days", "30d": "Last 30 days", "all": "All time"}


def layout(status: str | None = None, range: str | None = None, run: str | None = None,
           **_query: Any) -> html.Div:
    return html.Div(children=[
        dcc.Store(id=ids.FLEET_STORE),
        dcc.Store(id=ids.FLEET_HASH),
        html.Div(className="page-head", children=[
            html.Div([html.H1("Fleet"), html.Div(id=ids.FLEET_UPDATED, className="muted")]),
            html.Div(className="filters", children=[
                html.Label(["Status", dcc.Dropdown(
                    id=ids.FLEET_STATUS_FILTER, options=[{"label": s.capitalize(), "value": s} for s in _STATUSES],
                    value=status if status in _STATUSES else None, placeholder="Any status", clearable=True,
                    className="filter-dropdown")]),
                html.Label(["Time range", dcc.Dropdown(
                    id=ids.FLEET_RANGE_FILTER, options=[{"label": v, "value": k} for k, v in _RANGES.items()],
                    value=range if range in _RANGES else "all", clearable=False, className="filter-dropdown")]),
                html.Label(["Run id", dcc.Input(
                    id=ids.FLEET_RUN_FILTER, type="search", value=run or "", placeholder="contains…", debounce=True,
                    className="filter-input")]),
            ]),
        ]),
        html.Div(id=ids.FLEET_MESSAGE),
        html.Div(id=ids.FLEET_CONTENT, style={"display": "none"}, children=[
            html.Div(id=ids.FLEET_KPIS, className="kpis"),
            html.Div(className="card", children=[
                html.H3("Runs, worst first"),
                html.P("Sorted by wasted GPU-hours. The bar shows where each run's allocated GPU time went; "
                       "hover it for the numbers, click a run to open it.", className="muted"),
                _legend(),
                html.Div(id=ids.FLEET_TABLE, className="table-wrap"),
            ]),
            html.Div(className="grid-2", children=[
                html.Div(className="card", children=[
                    html.H3("GPU-hours by run"),
                    dcc.Graph(id=ids.FLEET_RUNS_GRAPH, config={"displaylogo": False}),
                ]),
                html.Div(className="card", children=[
                    html.H3("GPU-hours by category over time"),
                    html.P("Each run's hours are spread evenly over the time it was active.", className="muted"),
                    dcc.Graph(id=ids.FLEET_OVER_TIME_GRAPH, config={"displaylogo": False}),
                ]),
            ]),
        ]),
    ])


def _legend() -> html.Div:
    return html.Div(className="legend", children=[
        html.Span(className="legend-item", title=DESCRIPTIONS[c], children=[
            html.Span(className="swatch", style={"backgroundColor": COLORS[c]}), LABELS[c]])
        for c in ("productive", *CATEGORIES)
    ])


class FleetData(BaseModel):
    """The fleet page's store: the runs and the live status of the running ones, as the API served them."""

    runs: list[RunListItem]
    live: list[LiveRun]
    server_time: float
    filtered: bool = Field(description="a filter is set: an empty list means no match, not no runs")


@callback(
    Output(ids.FLEET_STORE, "data"),
    Output(ids.FLEET_HASH, "data"),
    Input(ids.APP_INTERVAL, "n_intervals"),
    Input(ids.FLEET_STATUS_FILTER, "value"),
    Input(ids.FLEET_RANGE_FILTER, "value"),
    Input(ids.FLEET_RUN_FILTER, "value"),
    State(ids.FLEET_HASH, "data"),
)
def _fetch(_n: int | None, status: str | None, range_key: str | None, run_filter: str | None,
           previous: str | None) -> tuple[Any, Any]:
    api = data.api()
    running = False
    try:
        live = api.live_runs()
        window = data.RANGES_S.get(range_key or "all")
        run_id = (run_filter or "").strip() or None
        runs = api.runs(status=status, since=live.server_time - window if window else None, run_id=run_id).runs
        store: dict[str, Any] = FleetData(runs=runs, live=live.runs, server_time=live.server_time,
                                          filtered=bool(status or window or run_id)).model_dump(mode="json")
        running = any(run.status == "running" for run in runs)
    except ApiError as exc:
        store = {"error": data.explain(exc)}
    digest = hashlib.sha1(json.dumps({k: v for k, v in store.items() if k != "server_time"}, sort_keys=True,
                                     default=str).encode()).hexdigest()
    if digest == previous and "error" not in store and not running:
        return no_update, no_update  # nothing changed: keep the page (and the user's zoom) as it is
    store["public_url"] = _public_url()
    return store, digest


def _public_url() -> str:
    cfg = data.config()
    return (cfg.api_url or flask.request.host_url).rstrip("/")


@callback(
    Output(ids.FLEET_MESSAGE, "children"),
    Output(ids.FLEET_CONTENT, "style"),
    Output(ids.FLEET_KPIS, "children"),
    Output(ids.FLEET_TABLE, "children"),
    Output(ids.FLEET_RUNS_GRAPH, "figure"),
    Output(ids.FLEET_OVER_TIME_GRAPH, "figure"),
    Output(ids.FLEET_UPDATED, "children"),
    Input(ids.FLEET_STORE, "data"),
)
def _draw(store: dict[str, Any] | None) -> tuple[Any, ...]:
    hidden, shown = {"display": "none"}, {"display": "block"}
    blank = figures.empty_figure("")
    if not store:
        return message("Loading…"), hidden, [], [], blank, blank, ""
    if "error" in store:
        return message(store["error"], kind="error"), hidden, [], [], blank, blank, ""
    fleet = FleetData.model_validate(store)
    frame = data.runs_frame(fleet.runs, fleet.live)
    updated = f"Updated {fmt.timestamp(fleet.server_time)} UTC"
    if frame.empty:
        if fleet.filtered:
            return message("No runs match these filters. Clear a filter or widen the time range."), hidden, [], [], \
                blank, blank, updated
        return no_runs_yet(store["public_url"]), hidden, [], [], blank, blank, updated
    totals = data.fleet_totals(frame)
    buckets, width = data.fleet_over_time(frame)
    return (None, shown, fleet_parts.kpis(totals, frame), fleet_parts.runs_table(frame),
            figures.fleet_runs_figure(frame), figures.fleet_over_time_figure(buckets, width), updated)


@callback(
    Output(ids.APP_LOCATION, "href"),  # the run page's path and ?project=
    Input(ids.FLEET_RUNS_GRAPH, "clickData"),
    prevent_initial_call=True,
)
def _open_clicked_run(click: dict[str, Any] | None) -> Any:
    if not click or not click.get("points"):
        return no_update
    point = click["points"][0]["customdata"]
    return fleet_parts.run_href(point[0], point[3] if len(point) > 3 else None)
