"""One run, what to do first: the advice engine's recommendations (as GET /v1/runs/{id}/advice serves them), the
headline numbers with the total waste, links to the report and the advice; then where its time went and when,
per-rank compute with hosts, checkpoints and restarts. `?rank=N` opens rank N's drill-down at the top."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

import dash
from dash import (
    ClientsideFunction,
    Input,
    Output,
    Patch,
    State,
    callback,
    clientside_callback,
    ctx,
    dcc,
    html,
    no_update,
)

from dashboards import data, figures, ids
from dashboards.components import run_parts
from dashboards.components.advice_panel import advice_panel
from dashboards.components.kpi import message
from dashboards.components.rank_panel import rank_panel
from dashboards.components.resume_banner import resume_banner
from dashboards.figures.curves import training_curves_figure
from dashboards.figures.run import rank_of_heat_label
from services import presentation as fmt
from services.api_client import ApiError, NotFound
from services.schemas.ledger import Ledger
from services.schemas.live import LiveRun
from services.schemas.resume import ResumeCheck
from services.schemas.views import RunViews

dash.register_page(__name__, path_template="/runs/<run_id>", name="Run",
                   title=lambda run_id=None: f"goodput: {unquote(run_id or '')}")

_GRAPH_CONFIG: dcc.Graph.Config = {"displaylogo": False}


def layout(run_id: str | None = None, project: str | None = None, rank: str | None = None,
           **_query: Any) -> html.Div:
    """`project` (`/runs/<run_id>?project=P`, as the fleet links it): which project's run of that id; without it
    the collector resolves the id (the token's project, or the only project that has it). `rank`
    (`?rank=N`): open that rank's drill-down at the top."""
    run_id = unquote(run_id or "")
    opened = int(rank) if rank is not None and rank.strip().isdigit() else None
    return html.Div(children=[
        dcc.Store(id=ids.RUN_ID_STORE, data={"run_id": run_id, "project": project or None, "rank": opened}),
        dcc.Store(id=ids.RUN_STORE),
        dcc.Store(id=ids.RUN_VERSION_STORE),
        dcc.Store(id=ids.RUN_LIVE_STORE),
        dcc.Store(id=ids.RUN_DRAWN_STORE),
        dcc.Store(id=ids.RUN_STEP_ZOOM),
        html.Div(className="crumbs", children=[dcc.Link("← Fleet", href=dash.get_relative_path("/"))]),
        html.Div(id=ids.RUN_HEADER, className="page-head", children=[html.H1(run_id)]),
        html.Div(id=ids.RUN_LIVE),
        html.Div(id=ids.RUN_FRESHNESS),
        html.Div(id=ids.RUN_RESUME),
        html.Div(id=ids.RUN_MESSAGE, children=message("Loading…")),
        html.Div(id=ids.RUN_CONTENT, style={"display": "none"}, children=[
            html.Div(id=ids.RUN_UNUSED_GPUS),
            html.Div(id=ids.RUN_RANK_PANEL, className="card rank-panel",
                     style={"display": "block" if opened is not None else "none"},
                     children=message(f"Loading rank {opened}…") if opened is not None else None),
            html.Div(id=ids.RUN_ADVICE, className="card advice-card", children=advice_panel(None)),
            html.Div(id=ids.RUN_KPIS, className="kpis"),
            html.Div(className="card", children=[
                html.H3("Timeline"),
                html.P("Top: the allocation, each attempt, and what the allocated GPUs were doing. Bottom: the "
                       "step reached over time, with checkpoints, failures (✕), hangs (shaded) and restarts "
                       "(dotted). Drag to zoom (the step axis follows), double-click to reset.", className="muted"),
                dcc.Graph(id=ids.RUN_TIMELINE_GRAPH, config=_GRAPH_CONFIG),
            ]),
            html.Div(className="card", children=[
                html.H3("Training curves"),
                html.P(id=ids.RUN_CURVES_NOTE, className="muted", children=(
                    "Loss, learning rate and step time as the steps reported them, one line per attempt; restarts "
                    "dotted, completed checkpoints as diamonds.")),
                dcc.Graph(id=ids.RUN_CURVES_GRAPH, config=_GRAPH_CONFIG, figure=figures.empty_figure("Loading…")),
            ]),
            html.Div(className="grid-2", children=[
                html.Div(className="card", children=[
                    html.H3("Where the GPU time went"),
                    html.P("Allocated GPU time, minus each kind of waste, leaves the productive time.",
                           className="muted"),
                    dcc.Graph(id=ids.RUN_LEDGER_GRAPH, config=_GRAPH_CONFIG),
                ]),
                html.Div(className="card", children=[
                    html.H3("Compute time per rank"),
                    html.P(id=ids.RUN_RANKS_NOTE, className="muted"),
                    dcc.Graph(id=ids.RUN_RANKS_GRAPH, config=_GRAPH_CONFIG),
                ]),
            ]),
            html.Div(className="card", children=[
                html.H3("Compute time by rank and step"),
                html.P("Mean compute per step against the median of all ranks: a healthy run is evenly pale; a "
                       "rank that is always slower shows as a dark row. Click a row to open its rank.",
                       className="muted"),
                dcc.Graph(id=ids.RUN_HEATMAP_GRAPH, config=_GRAPH_CONFIG),
            ]),
            html.Div(className="card", children=[
                html.H3("Ranks and hosts"),
                html.Div(className="rank-pick", children=[
                    html.Span("Open a rank:", className="muted"),
                    dcc.Dropdown(id=ids.RUN_RANK_PICK, options=[], value=opened, placeholder="rank or host…",
                                 clearable=False, style={"minWidth": "260px"}),
                ]),
                html.Div(id=ids.RUN_STRAGGLER_TABLE),
            ]),
            html.Div(className="card", children=[
                html.H3("Restarts"),
                html.P("What each failure cost: the steps computed again (rework), the time stuck before the "
                       "failure was torn down (hang) and the restart's startup, in GPU time from the ledger.",
                       className="muted"),
                html.Div(id=ids.RUN_RESTART_TABLE),
            ]),
            html.Div(className="card", children=[html.H3("Checkpoints"), html.Div(id=ids.RUN_CHECKPOINT_TABLE)]),
        ]),
    ])


@callback(
    Output(ids.RUN_LIVE_STORE, "data"),
    Output(ids.RUN_STORE, "data"),
    Output(ids.RUN_VERSION_STORE, "data"),
    Output(ids.RUN_FRESHNESS, "children"),
    Input(ids.APP_INTERVAL, "n_intervals"),
    Input(ids.RUN_ID_STORE, "data"),
    State(ids.RUN_VERSION_STORE, "data"),
)
def _fetch(_n: int | None, run: dict[str, Any] | str | None, fetched: dict[str, Any] | None) -> tuple[Any, ...]:
    """Every tick: the small live document. The views only when the run changed, and then the newest build
    the collector has ready within about a second: a big run's rebuild goes on in the background and is
    drawn on a later tick, so the page never waits for it."""
    run_id, project = _run_of(run)
    if not run_id:
        return no_update, {"error": "No run id in the address."}, None, None
    fetched = fetched or {}
    api = data.api()
    try:
        live = api.live(run_id, project=project)
        live_store = live.model_dump(mode="json")
        if live.version == fetched.get("version") and not fetched.get("resume_pending"):
            return live_store, no_update, no_update, no_update
        view = api.view(run_id, project=project)
        note = run_parts.freshness_note(view)
        if view.version == fetched.get("version") and not fetched.get("resume_pending"):
            return live_store, no_update, no_update, note  # the rebuild is not ready yet: keep what is drawn
    except NotFound:
        return None, {"error": f"No run {run_id!r}: the collector has no events for it.", "not_found": True}, None, None
    except ApiError as exc:
        return None, {"error": data.explain(exc)}, None, None
    try:
        resume = api.resume_check(run_id, project=project)
        pending = resume is None
    except ApiError:  # the banner is optional: the page still shows the ledger
        resume, pending = None, False
    page = {"ledger": view.ledger.model_dump(mode="json"), "view": view.model_dump(mode="json", exclude={"ledger"}),
            "resume": resume.model_dump(mode="json") if resume else None}
    return live_store, page, {"version": view.version, "resume_pending": pending}, note


def _rank_of(store: dict[str, Any] | str | None) -> int | None:
    """The rank whose drill-down is open (`?rank=N`), if any."""
    rank = store.get("rank") if isinstance(store, dict) else None
    return rank if isinstance(rank, int) else None


def _run_of(store: dict[str, Any] | str | None) -> tuple[str | None, str | None]:
    """(run id, project) from the page's run store; a bare string is a run id (a page laid out before the store
    carried the project, still open in a browser)."""
    if isinstance(store, str):
        return store or None, None
    return (store or {}).get("run_id"), (store or {}).get("project")


def _draw_from_api(fetched: dict[str, Any] | None, run: dict[str, Any] | str | None,
                   draw: Callable[[str, str | None], Any], failed: Callable[[str], Any]) -> Any:
    """`draw(run id, project)` (which asks the API) once a version of the page's run is fetched, no update before;
    `failed(why)` when the API refuses."""
    run_id, project = _run_of(run)
    if not fetched or not run_id:
        return no_update
    try:
        return draw(run_id, project)
    except ApiError as exc:
        return failed(data.explain(exc))


def _live_of(store: dict[str, Any] | None) -> LiveRun | None:
    """The live store's document (GET /v1/runs/{run_id}/live); None before the first answer, or after an error."""
    return LiveRun.model_validate(store) if store else None


@callback(Output(ids.RUN_RESUME, "children"), Input(ids.RUN_STORE, "data"))
def _draw_resume(store: dict[str, Any] | None) -> Any:
    check = (store or {}).get("resume")
    return resume_banner(ResumeCheck.model_validate(check) if check else None)


@callback(
    Output(ids.RUN_MESSAGE, "children"),
    Output(ids.RUN_CONTENT, "style"),
    Output(ids.RUN_HEADER, "children"),
    Output(ids.RUN_KPIS, "children"),
    Output(ids.RUN_TIMELINE_GRAPH, "figure"),
    Output(ids.RUN_LEDGER_GRAPH, "figure"),
    Output(ids.RUN_RANKS_GRAPH, "figure"),
    Output(ids.RUN_RANKS_NOTE, "children"),
    Output(ids.RUN_HEATMAP_GRAPH, "figure"),
    Output(ids.RUN_RESTART_TABLE, "children"),
    Output(ids.RUN_CHECKPOINT_TABLE, "children"),
    Output(ids.RUN_DRAWN_STORE, "data"),
    Output(ids.RUN_UNUSED_GPUS, "children"),
    Output(ids.RUN_STRAGGLER_TABLE, "children"),
    Output(ids.RUN_RANK_PICK, "options"),
    Input(ids.RUN_STORE, "data"),
    State(ids.RUN_ID_STORE, "data"),
    State(ids.RUN_LIVE_STORE, "data"),
)
def _draw(store: dict[str, Any] | None, run: dict[str, Any] | str | None,
          live: dict[str, Any] | None) -> tuple[Any, ...]:
    blank = figures.empty_figure("")
    run_id, _ = _run_of(run)
    if not store or "error" in store:
        text = store["error"] if store else "Loading…"
        extra = [dcc.Link("Back to the fleet", href=dash.get_relative_path("/"))] if store else []
        return (message(text, kind="error" if store else "info", children=extra), {"display": "none"},
                [html.H1(run_id or "")], [], blank, blank, blank, "", blank, [], [], None, None, [], [])
    ledger, view = Ledger.model_validate(store["ledger"]), RunViews.model_validate(store["view"])
    ranks = view.ranks
    project = _run_of(run)[1]
    timeline = figures.timeline_figure(view, _live_of(live))
    drawn = view.version if timeline.data and timeline.data[0].name == "No progress (live)" else None
    header = [*run_parts.header(ledger), run_parts.links(data.config().api_url or "", ledger.run_id, project)]
    return (
        None, {"display": "block"}, header, run_parts.kpis(ledger),
        timeline, figures.ledger_figure(ledger), figures.rank_compute_figure(ranks),
        run_parts.ranks_note(ranks, ledger), figures.heatmap_figure(ranks),
        [run_parts.final_failure_note(view), run_parts.restart_table(view.restarts)],
        run_parts.checkpoint_table(view.checkpoints, view.checkpoints_total, ledger), drawn,
        run_parts.unused_gpus_note(view), run_parts.straggler_table(ranks, ledger.run_id, project),
        run_parts.rank_options(ranks),
    )


@callback(Output(ids.RUN_ADVICE, "children"), Input(ids.RUN_VERSION_STORE, "data"), State(ids.RUN_ID_STORE, "data"))
def _draw_advice(fetched: dict[str, Any] | None, run: dict[str, Any] | str | None) -> Any:
    """The advice engine's recommendations for the version drawn, as GET /v1/runs/{id}/advice serves them."""
    return _draw_from_api(
        fetched, run, lambda run_id, project: advice_panel(data.api().advice(run_id, project=project)),
        lambda why: advice_panel(None, error=f"No advice: {why}"))


@callback(Output(ids.RUN_CURVES_GRAPH, "figure"), Input(ids.RUN_VERSION_STORE, "data"),
          State(ids.RUN_ID_STORE, "data"))
def _draw_curves(fetched: dict[str, Any] | None, run: dict[str, Any] | str | None) -> Any:
    """GET /v1/runs/{id}/curves of the version drawn."""
    return _draw_from_api(
        fetched, run, lambda run_id, project: training_curves_figure(data.api().curves(run_id, project=project)),
        lambda why: figures.empty_figure(f"No training curves: {why}", height=300))


@callback(
    Output(ids.RUN_RANK_PANEL, "children"),
    Input(ids.RUN_VERSION_STORE, "data"),
    State(ids.RUN_ID_STORE, "data"),
)
def _draw_rank(fetched: dict[str, Any] | None, run: dict[str, Any] | str | None) -> Any:
    """The drill-down of `?rank=N`: GET /v1/runs/{id}/ranks/{N} of the version drawn."""
    rank = _rank_of(run)
    if rank is None:
        return no_update
    return _draw_from_api(
        fetched, run, lambda run_id, project: rank_panel(data.api().rank(run_id, rank, project=project), project),
        lambda why: message(f"Rank {rank}: {why}", kind="error"))


@callback(
    Output(ids.APP_LOCATION, "href", allow_duplicate=True),
    Input(ids.RUN_RANK_PICK, "value"),
    Input(ids.RUN_HEATMAP_GRAPH, "clickData"),
    Input(ids.RUN_RANKS_GRAPH, "clickData"),
    State(ids.RUN_ID_STORE, "data"),
    prevent_initial_call=True,
)
def _open_rank(picked: int | None, heat_click: dict[str, Any] | None, bar_click: dict[str, Any] | None,
               run: dict[str, Any] | str | None) -> Any:
    """Open a rank's drill-down (`?rank=N`): picked from the list, or clicked in the per-rank chart or on a heat map
    row of one rank (a row grouping several ranks does not say which one is slow in each cell: pick from the list)."""
    run_id, project = _run_of(run)
    trigger = ctx.triggered_id
    if trigger == ids.RUN_RANK_PICK:
        rank = picked
    else:
        click = heat_click if trigger == ids.RUN_HEATMAP_GRAPH else bar_click
        points = (click or {}).get("points") or [{}]
        # the heat map's row label ("5 · node000"; a group "0-7 · node000" names no one rank): Dash leaves a heat
        # map cell's customdata out of clickData
        rank = rank_of_heat_label(points[0].get("y")) if trigger == ids.RUN_HEATMAP_GRAPH \
            else points[0].get("x")
    if not run_id or not isinstance(rank, int) or rank == _rank_of(run):
        return no_update
    return run_parts.run_href(run_id, project, rank)


clientside_callback(
    ClientsideFunction(namespace="goodput", function_name="stepAxisFollowsTime"),
    Output(ids.RUN_STEP_ZOOM, "data"),
    Input(ids.RUN_TIMELINE_GRAPH, "relayoutData"),
    State(ids.RUN_TIMELINE_GRAPH, "id"),
    prevent_initial_call=True,
)


@callback(Output(ids.RUN_LIVE, "children"), Input(ids.RUN_LIVE_STORE, "data"))
def _draw_live(store: dict[str, Any] | None) -> Any:
    live = _live_of(store)
    if live is None or live.status != "running":
        return None
    since = live.seconds_since_progress
    at_risk = fmt.gpu_time(live.at_risk_gpu_seconds)
    usual = fmt.duration(live.median_step_seconds)
    if since is None:
        text = "Running: no step completed yet."
        return html.Div(className="live live-ok", id="run-live-banner", children=text)
    if live.possibly_hung:
        return html.Div(className="live live-hung", id="run-live-banner", children=[
            html.B("Possibly hung. "),
            html.Span(f"No progress for {fmt.duration(since)}", id="run-live-since"),
            (f" (a step usually takes {usual}; flagged after {fmt.duration(live.stall_threshold_seconds)}). "
            f"Last step {fmt.integer(live.last_step)}. "),
            html.Span(f"{at_risk} at risk", id="run-live-at-risk"), " since the last checkpoint. ",
            html.Span(run_parts.suspects_text(live) or "No rank stands out.", id="run-live-suspects")])
    return html.Div(className="live live-ok", id="run-live-banner", children=[
        html.Span(className="pulse"), html.B("Running. "),
        html.Span(f"Last progress {fmt.duration(since)} ago", id="run-live-since"),
        f" (step {fmt.integer(live.last_step)}; a step takes about {usual}). ",
        html.Span(f"{at_risk} at risk", id="run-live-at-risk"), " of work since the last checkpoint."])


@callback(
    Output(ids.RUN_TIMELINE_GRAPH, "figure", allow_duplicate=True),
    Input(ids.RUN_LIVE_STORE, "data"),
    State(ids.RUN_DRAWN_STORE, "data"),
    prevent_initial_call=True,
)
def _move_stall_band(store: dict[str, Any] | None, drawn: int | None) -> Any:
    """Every refresh of a running run: stretch the timeline's "no progress" band to the server's now."""
    live = _live_of(store)
    if live is None or live.status != "running" or drawn is None:
        return no_update  # no timeline with a band on the page yet: the full redraw carries the band
    x, y, text = figures.stall_band(live)
    patch = Patch()
    patch["data"][0]["x"] = x
    patch["data"][0]["y"] = y
    patch["data"][0]["text"] = text
    return patch
