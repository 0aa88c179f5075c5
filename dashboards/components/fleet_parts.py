"""The fleet page's pieces built from the API's JSON: KPI cards and the runs table (pure)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlencode

import dash
from dash import dcc, html

from dashboards import ids
from dashboards.components.kpi import kpi_card, status_badge
from services import presentation as fmt
from services.presentation import CATEGORIES, COLORS, DESCRIPTIONS, LABELS

TABLE_LIMIT = 200


def run_href(run_id: str, project: str | None = None) -> str:
    """The run page's address under the app's prefix (`/dashboard/runs/<quoted id>?project=P` when embedded): a
    run is identified by (project, run id), so the link carries both."""
    path = f"/runs/{quote(run_id, safe='')}" + (f"?{urlencode({'project': project})}" if project else "")
    try:
        return str(dash.get_relative_path(path))
    except AttributeError:  # no Dash app configured (pure use, tests)
        return path


def kpis(totals: dict[str, float | None], frame: Any) -> list[html.Div]:
    allocated = float(totals["allocated"] or 0.0)
    hung = int(frame["possibly_hung"].sum())
    cards = [
        kpi_card("Fleet goodput", fmt.percent(totals["goodput"]), value_id=ids.kpi_value("fleet", "goodput"),
                 note="productive ÷ allocated GPU time", color=COLORS["productive"]),
        kpi_card("Allocated", fmt.gpu_hours(allocated), value_id=ids.kpi_value("fleet", "allocated"),
                 note=_plural(int(totals["runs"] or 0), "run") + f", {int(totals['running'] or 0):,} running"
                      + (f", {hung} possibly hung" if hung else "")),
        kpi_card("Wasted", fmt.gpu_hours(totals["wasted"]), value_id=ids.kpi_value("fleet", "wasted"),
                 note=f"{fmt.share(float(totals['wasted'] or 0.0), allocated)} of allocated",
                 color=COLORS["hang"]),
    ]
    for c in CATEGORIES:
        value = float(totals[c] or 0.0)
        cards.append(kpi_card(LABELS[c], fmt.gpu_hours(value), value_id=ids.kpi_value("fleet", f"waste-{c}"),
                              note=fmt.share(value, allocated), color=COLORS[c], title=DESCRIPTIONS[c]))
    return cards


def runs_table(frame: Any) -> html.Table:
    head = html.Thead(html.Tr([html.Th(h) for h in (
        "Run", "Status", "Goodput", "Allocated", "Where the GPU time went", "Wasted", "Restarts", "Last progress")]))
    rows = []
    for row in frame.head(TABLE_LIMIT).itertuples(index=False):
        rows.append(html.Tr(**{"data-run-id": row.run_id}, className="hung" if row.possibly_hung else "", children=[
            html.Td(dcc.Link(row.run_id, href=run_href(row.run_id, row.project),
                             className="run-link")),
            html.Td([status_badge(row.status), *([html.Span(
                " updating", className="muted stale-mark",
                title="This run received events since these figures were computed; newer ones are being built.")]
                if row.stale else [])]),
            html.Td(fmt.percent(row.goodput), className="num cell-goodput"),
            html.Td(fmt.gpu_hours(row.allocated_gpu_seconds), className="num cell-allocated"),
            html.Td(stacked_bar(row)),
            html.Td(fmt.gpu_hours(row.wasted_gpu_seconds), className="num cell-wasted"),
            html.Td(f"{row.restarts:,}", className="num"),
            html.Td(last_progress(row)),
        ]))
    extra = []
    if len(frame) > TABLE_LIMIT:
        extra = [html.Caption(f"The {TABLE_LIMIT} worst of {len(frame):,} runs; filter to see the others.")]
    return html.Table(className="runs-table", children=[*extra, head, html.Tbody(rows)])


def stacked_bar(row: Any) -> html.Div:
    allocated = float(row.allocated_gpu_seconds)
    parts = [("productive", float(row.productive_gpu_seconds))]
    parts += [(c, float(getattr(row, f"waste_{c}"))) for c in CATEGORIES]
    segments = []
    for category, value in parts:
        if allocated <= 0 or value <= 0:
            continue
        segments.append(html.Span(
            className=f"seg seg-{category}", title=f"{LABELS[category]}: {fmt.gpu_hours(value)} "
                                                   f"({fmt.share(value, allocated)})",
            style={"width": f"{100 * value / allocated:.3f}%", "backgroundColor": COLORS[category]}))
    return html.Div(className="stacked", children=segments)


def last_progress(row: Any) -> Any:
    if row.status != "running":
        return html.Span(f"ended {fmt.timestamp(row.last_time)}", className="muted small")
    since = row.seconds_since_progress
    if since is None:
        return html.Span("no step yet", className="muted")
    if row.possibly_hung:
        suspects = tuple(getattr(row, "suspect_ranks", ()) or ())
        who = f" (suspect rank{'s' if len(suspects) > 1 else ''} {', '.join(map(str, suspects[:6]))}" \
              f"{'…' if len(suspects) > 6 else ''})" if suspects else ""
        return html.Span(f"⚠ {fmt.duration(since)} ago: possibly hung{who}", className="flag-hung")
    return html.Span(f"{fmt.duration(since)} ago", className="progress-ok")


def _plural(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"
