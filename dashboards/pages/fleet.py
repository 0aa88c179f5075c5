"""Fleet: every run in a time range, its figures cut to the range; by project, sorted, a page at a time; goodput over
time per project; runs side by side. The filters live in the address (shareable, kept on reload)."""

from __future__ import annotations

from typing import Any

import dash
import flask
from dash import ALL, ClientsideFunction, Input, Output, State, callback, clientside_callback, ctx, dcc, html, no_update
from pydantic import BaseModel, Field

from dashboards import data, figures, ids
from dashboards.components import fleet_parts
from dashboards.components.empty import no_runs_yet
from dashboards.components.kpi import message
from services import presentation as fmt
from services.api_client import ApiError
from services.presentation import CATEGORY_ORDER, COLORS, DESCRIPTIONS, LABELS
from services.schemas.fleet import FleetWindow
from services.schemas.live import LiveRun

dash.register_page(__name__, path="/", name="Fleet", title="goodput: fleet")

_STATUSES = ("running", "finished", "failed", "cancelled")
_RANGES = {"1h": "Last hour", "24h": "Last 24 hours", "7d": "Last 7 days", "30d": "Last 30 days", "all": "All time",
           "custom": "Custom range"}
_GROUPS = {"run": "Run", "project": "Project"}
_DEFAULT_SORT = {"key": "wasted", "descending": True}
_DEFAULT_SIZE = fleet_parts.PAGE_SIZES[0]


def layout(status: str | None = None, range: str | None = None, run: str | None = None,
           **query: Any) -> html.Div:
    """The page, its filters set from the address's query (`?range=1h&project=a&project=b&sort=goodput&order=asc`)."""
    projects = _as_list(query.get("project"))
    compare = _as_list(query.get("compare"))
    sort_key = str(query.get("sort")) if query.get("sort") in data.SORT_COLUMNS else str(_DEFAULT_SORT["key"])
    descending = query.get("order") != "asc" if query.get("sort") else True
    size = _int(query.get("size"), _DEFAULT_SIZE)
    range_key = range if range in _RANGES else "all"
    return html.Div(children=[
        dcc.Store(id=ids.FLEET_STORE),
        dcc.Store(id=ids.FLEET_PAGES_STORE, data=1),
        dcc.Store(id=ids.FLEET_SORT_STORE, data={"key": sort_key, "descending": descending}),
        dcc.Store(id=ids.FLEET_PAGE_STORE, data=max(_int(query.get("page"), 1), 1)),
        dcc.Store(id=ids.FLEET_URL_SYNC),
        html.Div(className="page-head", children=[
            html.Div([html.H1("Fleet"), html.Div(id=ids.FLEET_UPDATED, className="muted")]),
            html.Div(className="filters", children=[
                html.Label(["Project", dcc.Dropdown(
                    id=ids.FLEET_PROJECT_FILTER, options=[{"label": p, "value": p} for p in projects], value=projects,
                    multi=True, placeholder="Every project", className="filter-dropdown filter-wide")]),
                html.Label(["Group by", dcc.Dropdown(
                    id=ids.FLEET_GROUP, options=[{"label": v, "value": k} for k, v in _GROUPS.items()],
                    value=query.get("group") if query.get("group") in _GROUPS else "run", clearable=False,
                    className="filter-dropdown filter-narrow")]),
                html.Label(["Status", dcc.Dropdown(
                    id=ids.FLEET_STATUS_FILTER, options=[{"label": s.capitalize(), "value": s} for s in _STATUSES],
                    value=status if status in _STATUSES else None, placeholder="Any status", clearable=True,
                    className="filter-dropdown filter-narrow")]),
                html.Label(["Time range", dcc.Dropdown(
                    id=ids.FLEET_RANGE_FILTER, options=[{"label": v, "value": k} for k, v in _RANGES.items()],
                    value=range_key, clearable=False, className="filter-dropdown")]),
                html.Div(id=ids.FLEET_CUSTOM_RANGE, className="custom-range",
                         style={"display": "flex" if range_key == "custom" else "none"}, children=[
                    html.Label(["From (UTC)", dcc.Input(
                        id=ids.FLEET_RANGE_FROM, type="text", placeholder="2026-01-31 18:00",
                        value=query.get("from") or "", debounce=True, className="filter-input filter-time")]),
                    html.Label(["To (UTC)", dcc.Input(
                        id=ids.FLEET_RANGE_TO, type="text", placeholder="now (or 2026-02-01 06:00)",
                        value=query.get("to") or "", debounce=True, className="filter-input filter-time")]),
                ]),
                html.Label(["Run id", dcc.Input(  # filters as you type (once typing pauses for 0.3 s)
                    id=ids.FLEET_RUN_FILTER, type="search", value=run or "", placeholder="contains…", debounce=0.3,
                    className="filter-input")]),
            ]),
        ]),
        html.Div(id=ids.FLEET_MESSAGE),
        html.Div(id=ids.FLEET_CONTENT, style={"display": "none"}, children=[
            html.Div(id=ids.FLEET_RANGE_NOTE, className="range-note muted"),
            html.Div(id=ids.FLEET_KPIS, className="kpis"),
            html.Div(id=ids.FLEET_PROJECTS_CARD, className="card", style={"display": "none"}, children=[
                html.H3("Projects"),
                html.P("Each project's runs added up, over the time range.", className="muted"),
                html.Div(id=ids.FLEET_PROJECTS, className="table-wrap"),
            ]),
            html.Div(className="card", children=[
                html.H3(id=ids.FLEET_RUNS_TITLE, children="Runs, worst first"),
                html.P("Click a column's name to sort by it. The bar shows where each run's allocated GPU time went "
                       "in the range; hover it for the numbers, click a run to open it.", className="muted"),
                _legend(),
                html.Div(className="table-wrap", children=html.Table(className="runs-table", children=[
                    fleet_parts.runs_head(sort_key, descending), html.Tbody(id=ids.FLEET_TABLE_BODY)])),
                html.Div(className="pager", children=[
                    html.Button("← Previous", id=ids.FLEET_PAGE_PREV, n_clicks=0, disabled=True,
                                className="page-button"),
                    html.Span(id=ids.FLEET_PAGE_INFO, className="muted"),
                    html.Button("Next →", id=ids.FLEET_PAGE_NEXT, n_clicks=0, disabled=True, className="page-button"),
                    html.Label(className="page-size", children=["Rows per page", dcc.Dropdown(
                        id=ids.FLEET_PAGE_SIZE, options=[{"label": str(n), "value": n} for n in fleet_parts.PAGE_SIZES],
                        value=size if size in fleet_parts.PAGE_SIZES else _DEFAULT_SIZE, clearable=False,
                        className="filter-dropdown filter-narrow")]),
                ]),
            ]),
            html.Div(className="card", children=[
                html.H3("Compare runs"),
                html.P("Pick two or more runs to see them side by side, over the same time range.", className="muted"),
                dcc.Dropdown(id=ids.FLEET_COMPARE_FILTER, value=compare, multi=True,
                             options=[{"label": c.split("/", 1)[-1], "value": c} for c in compare],
                             placeholder="Choose runs…", className="compare-dropdown"),
                html.Div(id=ids.FLEET_COMPARE),
            ]),
            html.Div(className="grid-2", children=[
                html.Div(className="card", children=[
                    html.H3("Where the GPU time went, by run"),
                    dcc.Graph(id=ids.FLEET_RUNS_GRAPH, config={"displaylogo": False}),
                ]),
                html.Div(className="card", children=[
                    html.H3("GPU time by category over time"),
                    html.P("Each run's GPU time in the bucket where it was spent.", className="muted"),
                    dcc.Graph(id=ids.FLEET_OVER_TIME_GRAPH, config={"displaylogo": False}),
                ]),
            ]),
            html.Div(className="card", children=[
                html.H3("Goodput over time, per project"),
                html.P("Productive ÷ allocated GPU time of each project's runs in each bucket.", className="muted"),
                dcc.Graph(id=ids.FLEET_TREND_GRAPH, config={"displaylogo": False}),
            ]),
        ]),
    ])


def _legend() -> html.Div:
    return html.Div(className="legend", children=[
        html.Span(className="legend-item", title=DESCRIPTIONS[c], children=[
            html.Span(className="swatch", style={"backgroundColor": COLORS[c]}), LABELS[c]])
        for c in CATEGORY_ORDER
    ])


def _as_list(value: Any) -> list[str]:
    if value is None or value == "":
        return []
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


class FleetData(BaseModel):
    """The fleet page's store: the runs in the range and the live status of the running ones, as the API served
    them."""

    window: FleetWindow
    live: list[LiveRun]
    filtered: bool = Field(description="a filter is set: an empty list means no match, not no runs")


# The filters the API applies (a new fetch), and the ones the page applies to what it fetched.
_API_FILTERS = [Input(ids.FLEET_STATUS_FILTER, "value"), Input(ids.FLEET_RANGE_FILTER, "value"),
                Input(ids.FLEET_RANGE_FROM, "value"), Input(ids.FLEET_RANGE_TO, "value"),
                Input(ids.FLEET_RUN_FILTER, "value")]
_PAGE_FILTERS = [Input(ids.FLEET_PROJECT_FILTER, "value"), Input(ids.FLEET_GROUP, "value"),
                 Input(ids.FLEET_SORT_STORE, "data"), Input(ids.FLEET_PAGE_SIZE, "value")]


@callback(
    Output(ids.FLEET_STORE, "data"),
    Input(ids.APP_INTERVAL, "n_intervals"),
    *_API_FILTERS,
)
def _fetch(_n: int | None, status: str | None, range_key: str | None, start: str | None, end: str | None,
           run_filter: str | None) -> dict[str, Any]:
    """The runs in the range (their figures cut to it) and the live status of the running ones; fetched again on
    every refresh, since a range that ends now moves with the clock."""
    api = data.api()
    try:
        live = api.live_runs()
        since, until = data.time_range(range_key, start, end, live.server_time)
        if since is not None and until is not None and until <= since:
            store: dict[str, Any] = {"error": "The custom range ends before it starts: pick a later “To”."}
        else:
            run_id = (run_filter or "").strip() or None
            window = api.fleet_window(status=status, since=since, until=until, run_id=run_id)
            store = FleetData(window=window, live=live.runs, filtered=bool(status or since or until or run_id)
                              ).model_dump(mode="json")
    except ApiError as exc:
        store = {"error": data.explain(exc)}
    store["public_url"] = _public_url()
    return store


def _public_url() -> str:
    cfg = data.config()
    return (cfg.api_url or flask.request.host_url).rstrip("/")


@callback(
    Output(ids.FLEET_CUSTOM_RANGE, "style"),
    Input(ids.FLEET_RANGE_FILTER, "value"),
)
def _show_custom_range(range_key: str | None) -> dict[str, str]:
    return {"display": "flex" if range_key == "custom" else "none"}


@callback(
    Output(ids.FLEET_SORT_STORE, "data"),
    Input({"type": ids.FLEET_SORT_BUTTON, "column": ALL}, "n_clicks"),
    State(ids.FLEET_SORT_STORE, "data"),
    prevent_initial_call=True,
)
def _sort(_clicks: list[int | None], current: dict[str, Any] | None) -> Any:
    clicked = ctx.triggered_id
    if not isinstance(clicked, dict) or not ctx.triggered[0]["value"]:
        return no_update  # a page drawn anew, not a click
    key = str(clicked["column"])
    current = current or _DEFAULT_SORT
    if current.get("key") == key:
        return {"key": key, "descending": not current.get("descending", True)}
    return {"key": key, "descending": key not in ("run", "project", "status")}  # names A→Z, figures biggest first


@callback(
    Output({"type": ids.FLEET_SORT_BUTTON, "column": ALL}, "children"),
    Output({"type": ids.FLEET_SORT_BUTTON, "column": ALL}, "className"),
    Output({"type": ids.FLEET_SORT_BUTTON, "column": ALL}, "title"),
    Input(ids.FLEET_SORT_STORE, "data"),
)
def _label_sort_buttons(sort: dict[str, Any] | None) -> tuple[list[str], list[str], list[str]]:
    """The header buttons say which way the table is sorted; only their labels change, never the buttons (a click on
    a button being replaced would be lost)."""
    sort = sort or _DEFAULT_SORT
    labels = [fleet_parts.sort_label(str(out["id"]["column"]), str(sort.get("key")), bool(sort.get("descending", True)))
              for out in ctx.outputs_list[0]]
    return [t for t, _, _ in labels], [c for _, c, _ in labels], [h for _, _, h in labels]


@callback(
    Output(ids.FLEET_PAGE_STORE, "data"),
    Input(ids.FLEET_PAGE_PREV, "n_clicks"),
    Input(ids.FLEET_PAGE_NEXT, "n_clicks"),
    *_API_FILTERS,
    *_PAGE_FILTERS,
    State(ids.FLEET_PAGE_STORE, "data"),
    State(ids.FLEET_PAGES_STORE, "data"),
    prevent_initial_call=True,
)
def _page(_prev: int, _next: int, *args: Any) -> Any:
    page, pages = int(args[-2] or 1), int(args[-1] or 1)
    if ctx.triggered_id == ids.FLEET_PAGE_PREV:
        return max(1, min(page, pages) - 1)
    if ctx.triggered_id == ids.FLEET_PAGE_NEXT:
        return min(pages, page + 1)
    return 1  # another filter or order: back to the first page


@callback(
    Output(ids.FLEET_MESSAGE, "children"),
    Output(ids.FLEET_CONTENT, "style"),
    Output(ids.FLEET_RANGE_NOTE, "children"),
    Output(ids.FLEET_KPIS, "children"),
    Output(ids.FLEET_TABLE_BODY, "children"),
    Output(ids.FLEET_PAGE_PREV, "disabled"),
    Output(ids.FLEET_PAGE_NEXT, "disabled"),
    Output(ids.FLEET_PAGE_INFO, "children"),
    Output(ids.FLEET_PAGES_STORE, "data"),
    Output(ids.FLEET_RUNS_TITLE, "children"),
    Output(ids.FLEET_PROJECTS_CARD, "style"),
    Output(ids.FLEET_PROJECTS, "children"),
    Output(ids.FLEET_PROJECT_FILTER, "options"),
    Output(ids.FLEET_COMPARE_FILTER, "options"),
    Output(ids.FLEET_COMPARE, "children"),
    Output(ids.FLEET_RUNS_GRAPH, "figure"),
    Output(ids.FLEET_OVER_TIME_GRAPH, "figure"),
    Output(ids.FLEET_TREND_GRAPH, "figure"),
    Output(ids.FLEET_UPDATED, "children"),
    Input(ids.FLEET_STORE, "data"),
    Input(ids.FLEET_PROJECT_FILTER, "value"),
    Input(ids.FLEET_GROUP, "value"),
    Input(ids.FLEET_SORT_STORE, "data"),
    Input(ids.FLEET_PAGE_STORE, "data"),
    Input(ids.FLEET_PAGE_SIZE, "value"),
    Input(ids.FLEET_COMPARE_FILTER, "value"),
)
def _draw(store: dict[str, Any] | None, projects: list[str] | None, group: str | None, sort: dict[str, Any] | None,
          page: int | None, size: int | None, compare: list[str] | None) -> tuple[Any, ...]:
    hidden, shown = {"display": "none"}, {"display": "block"}
    blank = figures.empty_figure("")

    def nothing(note: Any, updated: str = "") -> tuple[Any, ...]:
        return (note, hidden, None, [], [], True, True, "", 1, no_update, hidden, [], no_update, no_update, [],
                blank, blank, blank, updated)

    if not store:
        return nothing(message("Loading…"))
    if "error" in store:
        return nothing(message(store["error"], kind="error"))
    fleet = FleetData.model_validate(store)
    window = fleet.window
    updated = f"Updated {fmt.timestamp(window.server_time)}"
    every = data.window_frame(window, fleet.live)
    project_options = [{"label": p, "value": p} for p in sorted({*every["project"], *(projects or [])})]
    frame = every[every["project"].isin(projects)] if projects else every
    if frame.empty:
        if fleet.filtered or projects:
            note = message("No runs match these filters. Clear a filter or widen the time range.")
        else:
            note = no_runs_yet(store["public_url"])
        out = list(nothing(note, updated))
        out[12] = project_options
        return tuple(out)

    grouped = group == "project"
    sort = sort or _DEFAULT_SORT
    ordered = data.sort_runs(frame, str(sort.get("key")), descending=bool(sort.get("descending", True)),
                             group_by_project=grouped)
    size = size or _DEFAULT_SIZE
    rows, page, pages = data.page_of(ordered, int(page or 1), size)
    table = fleet_parts.runs_rows(rows, unit=fmt.gpu_time_unit(*ordered["allocated_gpu_seconds"].tolist()))
    first, last = (page - 1) * size + 1, min(page * size, len(ordered))
    info = f"Runs {first:,}–{last:,} of {len(ordered):,} · page {page:,} of {pages:,}"
    title = "Runs by project" if grouped else "Runs"
    by_project = data.projects_frame(frame)
    keep = set(zip(frame["project"], frame["run_id"], strict=True))
    buckets = data.over_time(window, keep)
    width = data.width_label(window.bucket_s)
    runs_graph = (figures.fleet_runs_figure(by_project, label_column="project") if grouped
                  else figures.fleet_runs_figure(frame))
    several = len(set(every["project"])) > 1
    compare_options = [{"label": f"{run_id} ({project})" if several else run_id,
                        "value": fleet_parts.compare_key(project, run_id)}
                       for project, run_id in zip(ordered["project"].astype(str), ordered["run_id"].astype(str),
                                                  strict=True)]
    kpis = fleet_parts.kpis(data.fleet_totals(frame), frame)
    return (None, shown, fleet_parts.range_note(window, frame), kpis, table,
            page <= 1, page >= pages, info, pages, title, shown if grouped else hidden,
            fleet_parts.projects_table(by_project) if grouped else [], project_options, compare_options,
            fleet_parts.comparison(frame, compare or []), runs_graph, figures.fleet_over_time_figure(buckets, width),
            figures.goodput_trend_figure(buckets, width), updated)


# The filters go into the address with history.replaceState (the page is not drawn again): shareable, and a reload
# opens the page with them (layout() reads them back).
clientside_callback(
    ClientsideFunction(namespace="goodput", function_name="fleetFiltersToUrl"),
    Output(ids.FLEET_URL_SYNC, "data"),
    *_API_FILTERS,
    *_PAGE_FILTERS,
    Input(ids.FLEET_PAGE_STORE, "data"),
    Input(ids.FLEET_COMPARE_FILTER, "value"),
)


@callback(
    Output(ids.APP_LOCATION, "href"),  # the run page's path and ?project=
    Input(ids.FLEET_RUNS_GRAPH, "clickData"),
    State(ids.FLEET_GROUP, "value"),
    prevent_initial_call=True,
)
def _open_clicked_run(click: dict[str, Any] | None, group: str | None) -> Any:
    if not click or not click.get("points") or group == "project":
        return no_update
    point = click["points"][0]["customdata"]
    return fleet_parts.run_href(point[0], point[3] if len(point) > 3 else None)
