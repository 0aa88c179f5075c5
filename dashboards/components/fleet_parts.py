"""The fleet page's pieces built from the API's JSON: KPI cards, the runs table (one page of it, sortable), the
projects table and the side-by-side comparison of runs (pure)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlencode

import dash
import pandas as pd
from dash import dcc, html

from dashboards import ids
from dashboards.components.kpi import kpi_card, status_badge
from dashboards.figures.fleet import compare_figure
from services import presentation as fmt
from services.presentation import CATEGORIES, COLORS, DESCRIPTIONS, LABELS, WASTED_COLOR, GpuTimeUnit
from services.schemas.categories import EVAL
from services.schemas.fleet import FleetWindow

PAGE_SIZES = (25, 50, 100, 250)
# (sort key of dashboards.data.SORT_COLUMNS or None: not sortable, header, numeric)
RUN_COLUMNS: tuple[tuple[str | None, str, bool], ...] = (
    ("run", "Run", False), ("project", "Project", False), ("status", "Status", False), ("goodput", "Goodput", True),
    ("allocated", "Allocated", True), (None, "Where the GPU time went", False), ("wasted", "Wasted", True),
    ("restarts", "Restarts", True), ("last", "Last progress", False))
_SORTABLE_LABELS = {key: label for key, label, _ in RUN_COLUMNS if key is not None}


def run_href(run_id: str, project: str | None = None) -> str:
    """The run page's address under the app's prefix (`/dashboard/runs/<quoted id>?project=P` when embedded): a
    run is identified by (project, run id), so the link carries both."""
    path = f"/runs/{quote(run_id, safe='')}" + (f"?{urlencode({'project': project})}" if project else "")
    try:
        return str(dash.get_relative_path(path))
    except AttributeError:  # no Dash app configured (pure use, tests)
        return path


def kpis(totals: dict[str, float | None], frame: Any) -> list[html.Div]:
    """The card row, every GPU figure in one unit (the one the allocated total calls for)."""
    allocated = float(totals["allocated"] or 0.0)
    unit = fmt.gpu_time_unit(allocated)
    hung = int(frame["possibly_hung"].sum())
    cards = [
        kpi_card("Fleet goodput", fmt.percent(totals["goodput"]), value_id=ids.kpi_value("fleet", "goodput"),
                 note="productive ÷ allocated GPU time", color=COLORS["productive"]),
        kpi_card("Allocated", fmt.gpu_time(allocated, unit), value_id=ids.kpi_value("fleet", "allocated"),
                 note=_plural(int(totals["runs"] or 0), "run") + f", {int(totals['running'] or 0):,} running"
                      + (f", {hung} possibly hung" if hung else "")),
        kpi_card(LABELS[EVAL], fmt.gpu_time(totals[EVAL], unit), value_id=ids.kpi_value("fleet", EVAL),
                 note=fmt.share(float(totals[EVAL] or 0.0), allocated), color=COLORS[EVAL], title=DESCRIPTIONS[EVAL]),
        kpi_card("Wasted", fmt.gpu_time(totals["wasted"], unit), value_id=ids.kpi_value("fleet", "wasted"),
                 note=f"{fmt.share(float(totals['wasted'] or 0.0), allocated)} of allocated", color=WASTED_COLOR),
    ]
    for c in CATEGORIES:
        value = float(totals[c] or 0.0)
        cards.append(kpi_card(LABELS[c], fmt.gpu_time(value, unit), value_id=ids.kpi_value("fleet", f"waste-{c}"),
                              note=fmt.share(value, allocated), color=COLORS[c], title=DESCRIPTIONS[c]))
    return cards


def sort_label(key: str, sort_key: str, descending: bool) -> tuple[str, str, str]:
    """The (text, class, tooltip) of the header of sortable column `key`: which way the table is sorted by it, if it
    is."""
    label = _SORTABLE_LABELS[key]
    arrow = (" ▼" if descending else " ▲") if key == sort_key else ""
    return (label + arrow, "sort-button" + (" sorted" if arrow else ""),
            f"Sort by {label.lower()}" + (" (click again to reverse)" if arrow else ""))


def runs_head(sort_key: str, descending: bool) -> html.Thead:
    """The runs table's header row; a sortable column's name is a button. It is drawn once with the page and outlives
    every redraw of the rows (`dashboards.pages.fleet` updates only the buttons' labels): a click on a header that a
    refresh replaced would be lost."""
    cells = []
    for key, label, numeric in RUN_COLUMNS:
        if key is None:
            cells.append(html.Th(label))
            continue
        text, class_name, title = sort_label(key, sort_key, descending)
        cells.append(html.Th(className="num" if numeric else "", children=html.Button(
            text, id={"type": ids.FLEET_SORT_BUTTON, "column": key}, n_clicks=0, className=class_name, title=title)))
    return html.Thead(html.Tr(cells))


def runs_rows(frame: Any, unit: GpuTimeUnit | None = None) -> list[html.Tr]:
    """One row per run of `frame` (one page, already sorted), GPU figures in `unit` (by default the one its largest
    allocation calls for)."""
    unit = unit or fmt.gpu_time_unit(*frame["allocated_gpu_seconds"].tolist())
    rows = []
    for row in frame.itertuples(index=False):
        rows.append(html.Tr(**{"data-run-id": row.run_id}, className="hung" if row.possibly_hung else "", children=[
            html.Td(dcc.Link(row.run_id, href=run_href(row.run_id, row.project), className="run-link")),
            html.Td(row.project, className="cell-project"),
            html.Td([status_badge(row.status), *([html.Span(
                " updating", className="muted stale-mark",
                title="This run received events since these figures were computed; newer ones are being built.")]
                if row.stale else [])]),
            html.Td(fmt.percent(row.goodput), className="num cell-goodput"),
            html.Td(fmt.gpu_time(row.allocated_gpu_seconds, unit), className="num cell-allocated"),
            html.Td(stacked_bar(row, unit)),
            html.Td(fmt.gpu_time(row.wasted_gpu_seconds, unit), className="num cell-wasted"),
            html.Td(f"{row.restarts:,}", className="num"),
            html.Td(last_progress(row)),
        ]))
    return rows


def pager(page: int, pages: int, total: int, size: int) -> list[Any]:
    """`Runs 26–50 of 120`, previous / next."""
    first, last = (page - 1) * size + 1, min(page * size, total)
    return [
        html.Button("← Previous", id=ids.FLEET_PAGE_PREV, n_clicks=0, disabled=page <= 1, className="page-button"),
        html.Span(f"Runs {first:,}–{last:,} of {total:,} · page {page:,} of {pages:,}" if total else "No runs",
                  id=ids.FLEET_PAGE_INFO, className="muted"),
        html.Button("Next →", id=ids.FLEET_PAGE_NEXT, n_clicks=0, disabled=page >= pages, className="page-button"),
    ]


def projects_table(projects: Any) -> html.Table:
    """One row per project: runs, goodput, allocated, where the time went, wasted."""
    unit = fmt.gpu_time_unit(*projects["allocated_gpu_seconds"].tolist())
    head = html.Thead(html.Tr([html.Th(h) for h in ("Project", "Runs", "Goodput", "Allocated",
                                                      "Where the GPU time went", "Wasted", "Restarts")]))
    rows = [html.Tr(**{"data-project": row.project}, children=[
        html.Td(html.B(row.project)),
        html.Td(f"{row.runs:,}" + (f" ({row.running:,} running)" if row.running else ""), className="num"),
        html.Td(fmt.percent(row.goodput), className="num cell-goodput"),
        html.Td(fmt.gpu_time(row.allocated_gpu_seconds, unit), className="num cell-allocated"),
        html.Td(stacked_bar(row, unit)),
        html.Td(fmt.gpu_time(row.wasted_gpu_seconds, unit), className="num cell-wasted"),
        html.Td(f"{int(row.restarts):,}", className="num"),
    ]) for row in projects.itertuples(index=False)]
    return html.Table(className="runs-table projects-table", children=[head, html.Tbody(rows)])


def stacked_bar(row: Any, unit: GpuTimeUnit | None = None) -> html.Div:
    allocated = float(row.allocated_gpu_seconds)
    unit = unit or fmt.gpu_time_unit(allocated)
    parts = [("productive", float(row.productive_gpu_seconds)), (EVAL, float(row.eval_gpu_seconds))]
    parts += [(c, float(getattr(row, f"waste_{c}"))) for c in CATEGORIES]
    segments = []
    for category, value in parts:
        if allocated <= 0 or value <= 0:
            continue
        segments.append(html.Span(
            className=f"seg seg-{category}", title=f"{LABELS[category]}: {fmt.gpu_time(value, unit)} "
                                                   f"({fmt.share(value, allocated)})",
            style={"width": f"{100 * value / allocated:.3f}%", "backgroundColor": COLORS[category]}))
    return html.Div(className="stacked", children=segments)


def compare_table(frame: Any) -> html.Table:
    """The chosen runs side by side: one column per run, one row per figure, GPU figures in one unit."""
    unit = fmt.gpu_time_unit(*frame["allocated_gpu_seconds"].tolist())
    runs = list(frame.itertuples(index=False))
    head = html.Thead(html.Tr([html.Th(""), *(html.Th(dcc.Link(r.run_id, href=run_href(r.run_id, r.project),
                                                               className="run-link")) for r in runs)]))

    def line(label: str, cells: list[Any], *, title: str = "", color: str | None = None) -> html.Tr:
        swatch = [html.Span(className="swatch", style={"backgroundColor": color})] if color else []
        return html.Tr([html.Th([*swatch, " " if swatch else "", label], title=title, className="row-head"),
                        *(html.Td(c, className="num") for c in cells)])

    lines = [
        line("Project", [r.project for r in runs]),
        line("Status", [status_badge(r.status) for r in runs]),
        line("Goodput", [fmt.percent(r.goodput) for r in runs]),
        line("Allocated", [fmt.gpu_time(r.allocated_gpu_seconds, unit) for r in runs]),
        line("Productive", [fmt.gpu_time(r.productive_gpu_seconds, unit) for r in runs], color=COLORS["productive"]),
        line(LABELS[EVAL], [fmt.gpu_time(r.eval_gpu_seconds, unit) for r in runs], title=DESCRIPTIONS[EVAL],
             color=COLORS[EVAL]),
        *(line(LABELS[c], [f"{fmt.gpu_time(getattr(r, f'waste_{c}'), unit)} "
                           f"({fmt.share(getattr(r, f'waste_{c}'), r.allocated_gpu_seconds)})" for r in runs],
               title=DESCRIPTIONS[c], color=COLORS[c]) for c in CATEGORIES),
        line("Wasted", [fmt.gpu_time(r.wasted_gpu_seconds, unit) for r in runs], color=WASTED_COLOR),
        line("Restarts", [f"{r.restarts:,}" for r in runs]),
        line("Where the time went", [stacked_bar(r, unit) for r in runs]),
    ]
    return html.Table(id=ids.FLEET_COMPARE_TABLE, className="runs-table compare-table",
                      children=[head, html.Tbody(lines)])


def range_note(window: FleetWindow, frame: Any) -> str:
    """What the figures cover: the range, cut per run; and the runs whose stored figures are not laid out in time."""
    start = window.since if window.since is not None else window.bucket_start
    text = (f"GPU time from {fmt.timestamp(start)} to {fmt.timestamp(window.until)}: each run counts only its "
            "GPU time inside this range.")
    if window.since is None:
        text = f"All time, to {fmt.timestamp(window.until)}."
    spread = int((~frame["laid_out"].astype(bool)).sum())
    if spread:
        text += (f" {spread:,} run{'s were' if spread > 1 else ' was'} analysed by an older version: "
                 "spread evenly over its life until analysed again.")
    return text


def compare_key(project: str, run_id: str) -> str:
    """A run's value in the comparison's picker (and the address): `project/run id`."""
    return f"{project}/{run_id}"


def comparison(frame: Any, chosen: list[str]) -> Any:
    """The chosen runs (`compare_key`s) side by side: a table and a chart; a hint while fewer than two are chosen."""
    keys = [k.split("/", 1) for k in chosen if "/" in k]
    index = {(p, r): i for i, (p, r) in enumerate(zip(frame["project"], frame["run_id"], strict=True))}
    picked = [index[(p, r)] for p, r in keys if (p, r) in index]
    if len(picked) < 2:
        return html.P("Choose at least two runs.", className="muted small") if chosen else []
    runs = frame.iloc[picked]
    return html.Div(className="compare", children=[
        html.Div(className="table-wrap", children=compare_table(runs)),
        dcc.Graph(id=ids.FLEET_COMPARE_GRAPH, figure=compare_figure(runs), config={"displaylogo": False}),
    ])


def last_progress(row: Any) -> Any:
    if row.status != "running":
        return html.Span(f"ended {fmt.timestamp(row.last_time)}", className="muted small")
    since = row.seconds_since_progress
    if since is None or (isinstance(since, float) and pd.isna(since)):
        return html.Span("no step yet", className="muted")
    if row.possibly_hung:
        suspects = tuple(getattr(row, "suspect_ranks", ()) or ())
        who = f" (suspect rank{'s' if len(suspects) > 1 else ''} {', '.join(map(str, suspects[:6]))}" \
              f"{'…' if len(suspects) > 6 else ''})" if suspects else ""
        return html.Span(f"⚠ {fmt.duration(since)} ago: possibly hung{who}", className="flag-hung")
    return html.Span(f"{fmt.duration(since)} ago", className="progress-ok")


def _plural(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"
