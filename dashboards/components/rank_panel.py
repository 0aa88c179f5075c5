"""The run page's rank drill-down (`/runs/<run_id>?rank=N`): one rank's host and neighbours, its own timeline, its
steps' compute and collective time, and the failures of the attempts it was part of (GET /v1/runs/{id}/ranks/{N})."""

from __future__ import annotations

from typing import Any

from dash import dcc, html

from dashboards import ids
from dashboards.components.kpi import kpi_card
from dashboards.components.run_parts import rank_name, run_href
from dashboards.figures.rank import rank_steps_figure, rank_timeline_figure
from services import presentation as fmt
from services.presentation import COLORS
from services.schemas.ranks import RankDetail

_GRAPH_CONFIG: dcc.Graph.Config = {"displaylogo": False}
_MAX_HOST_LINKS = 32


def rank_panel(detail: RankDetail, project: str | None) -> list[Any]:
    close = dcc.Link("Close the drill-down", href=run_href(detail.run_id, project), id="run-rank-close",
                     className="rank-close")
    title = html.H3([f"Drill-down: {rank_name(detail.rank, detail.host)}", close], id="run-rank-title")
    if not detail.known:
        return [title, html.P(f"The run has no step and no attempt event of rank {detail.rank}.",
                              className="muted", id="run-rank-unknown")]
    return [title, html.Div(_cards(detail), className="kpis"), _neighbours(detail, project),
            html.H4("Its timeline"),
            dcc.Graph(id=ids.RUN_RANK_TIMELINE_GRAPH, figure=rank_timeline_figure(detail), config=_GRAPH_CONFIG),
            html.H4("Its steps: compute and collectives"),
            html.P(f"Compute is {detail.compute_source}; collectives are the seconds inside collective calls. "
                   + (f"Each point is the mean of {fmt.integer(detail.steps.steps_per_point)} consecutive steps "
                      f"of {fmt.integer(detail.steps.steps_total)}." if detail.steps.steps_per_point > 1 else ""),
                   className="muted"),
            dcc.Graph(id=ids.RUN_RANK_STEPS_GRAPH, figure=rank_steps_figure(detail), config=_GRAPH_CONFIG),
            html.H4("Failures it was part of"), _failures(detail)]


def _cards(detail: RankDetail) -> list[html.Div]:
    row = detail.row
    overall = detail.run_median_compute_s
    excess = (row.median_compute_s / overall - 1) if row is not None and overall else None
    return [
        kpi_card("Host", detail.host or fmt.DASH, value_id="run-rank-host",
                 note=f"{len(detail.host_ranks):,} rank{'s' if len(detail.host_ranks) != 1 else ''} seen on it"),
        kpi_card("Median compute", fmt.duration(row.median_compute_s if row else None), value_id="run-rank-median",
                 note=(f"{excess:+.0%} vs the median of all ranks ({fmt.duration(overall)})" if excess is not None
                       else "per step")),
        kpi_card("Straggler cost", fmt.gpu_time(row.straggler_gpu_seconds if row else None),
                 value_id="run-rank-straggler", color=COLORS["straggler"],
                 note="flagged straggler" if row is not None and row.is_straggler else "not flagged"),
        kpi_card("Steps", fmt.integer(detail.steps.steps_total), value_id="run-rank-steps",
                 note=f"in {len(detail.attempts):,} attempt{'s' if len(detail.attempts) != 1 else ''}"),
        kpi_card("Failures", fmt.integer(len(detail.failures)), value_id="run-rank-failures",
                 note="of attempts it was part of"),
        kpi_card("Host clock", fmt.clock_offset(detail.clock_offset_seconds), value_id="run-rank-clock",
                 note=_clock_note(detail)),
    ]


def _clock_note(detail: RankDetail) -> str:
    """Against what the host's clock was measured, and against the collector's."""
    collector = detail.collector_clock_offset_seconds
    said = ("of the run's reference clock, from its step ends; its times are taken back by it"
            if detail.clock_offset_seconds else "with the run's reference clock, by its step ends")
    if detail.clock_offset_seconds is None:
        said = "not measured (no step)"
    if collector:
        said += f"; {fmt.clock_offset(collector)} of the collector's"
    return said


def _neighbours(detail: RankDetail, project: str | None) -> html.Div:
    others = [r for r in detail.host_ranks if r != detail.rank]
    if detail.host is None or not others:
        return html.Div()
    shown = others[:_MAX_HOST_LINKS]
    links: list[Any] = [f"Other ranks on {detail.host}: "]
    for n, r in enumerate(shown):
        links += [", " if n else "", dcc.Link(str(r), href=run_href(detail.run_id, project, r))]
    if len(others) > len(shown):
        links.append(f" and {len(others) - len(shown):,} more")
    return html.Div(links, className="muted", id="run-rank-host-ranks")


def _failures(detail: RankDetail) -> Any:
    if not detail.failures:
        return html.P("None: no attempt this rank was part of failed.", className="muted", id="run-rank-no-failures")
    head = html.Tr([html.Th(h) for h in ("Attempt", "When (UTC)", "Run's step", "Reason", "This rank's last step",
                                         "Behind by", "Its own report")])
    body = [html.Tr([
        html.Td(str(f.attempt)), html.Td(fmt.timestamp(f.time)),
        html.Td(fmt.integer(f.step) if f.step is not None else "during startup"), html.Td(f.reason),
        html.Td(fmt.integer(f.rank_last_step) if f.rank_last_step is not None else "no step"),
        html.Td(f"{f.steps_behind:,} steps" if f.steps_behind else fmt.DASH),
        html.Td("reported the failure" if f.reported_failure else "did not report it"),
    ]) for f in detail.failures]
    return html.Table([html.Thead(head), html.Tbody(body)], className="table", id="run-rank-failures-table")
