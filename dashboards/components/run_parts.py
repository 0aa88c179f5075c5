"""The run page's pieces built from the API's answers: header, KPI cards, notes and tables (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import quote, urlencode

import dash
from dash import dcc, html
from dash.dash_table.DataTable import DataTable
from dash.types import NumberType

from dashboards import ids
from dashboards.components.kpi import kpi_card, status_badge
from dashboards.theme import FONT, GRID, INK
from services import presentation as fmt
from services.presentation import CATEGORIES, COLORS, DESCRIPTIONS, LABELS, MARKER_COLORS, WASTED_COLOR
from services.schemas.categories import EVAL
from services.schemas.ledger import Ledger
from services.schemas.live import LiveRun
from services.schemas.run_view import RunView
from services.schemas.views import CheckpointRow, NoRankCompute, RankCompute, RestartRow, RunViews

REPORT_FORMATS = (("html", "Report (HTML)"), ("csv", "CSV"), ("json", "JSON"))


def run_href(run_id: str, project: str | None = None, rank: int | None = None) -> str:
    """The run page's address under the app's prefix, `?rank=N` opening that rank's drill-down."""
    query = {k: v for k, v in (("project", project), ("rank", None if rank is None else str(rank))) if v}
    path = f"/runs/{quote(run_id, safe='')}" + (f"?{urlencode(query)}" if query else "")
    try:
        return str(dash.get_relative_path(path))
    except AttributeError:  # no Dash app configured (pure use, tests)
        return path


def api_href(api_base: str, run_id: str, what: str, project: str | None = None, **params: str) -> str:
    """A collector address for the browser: `api_base` is the collector the dashboard reads ("" when it is mounted
    in the collector itself, whose API is at the site's root)."""
    query = {**params, **({"project": project} if project else {})}
    return f"{api_base.rstrip('/')}/v1/runs/{quote(run_id, safe='')}/{what}" + (
        f"?{urlencode(query)}" if query else "")


def links(api_base: str, run_id: str, project: str | None) -> html.Div:
    """The run's report in each format and its advice, as the collector serves them."""
    items: list[Any] = [html.Span("Download:", className="muted")]
    for fmt_name, label in REPORT_FORMATS:
        items.append(html.A(label, href=api_href(api_base, run_id, "report", project, format=fmt_name),
                            id=f"run-link-report-{fmt_name}", target="_blank", rel="noopener"))
    items.append(html.A("Advice (JSON)", href=api_href(api_base, run_id, "advice", project), id="run-link-advice",
                        target="_blank", rel="noopener"))
    return html.Div(items, className="run-links", id=ids.RUN_LINKS)


def rank_name(rank: int, host: str | None) -> str:
    """"rank 5 on node000" (the host when the run reported it)."""
    return f"rank {rank}" + (f" on {host}" if host else "")


def header(ledger: Ledger) -> list[Any]:
    bits = [f"{ledger.restarts:,} restart{'s' if ledger.restarts != 1 else ''}",
            f"{ledger.failures:,} failure{'s' if ledger.failures != 1 else ''}"]
    if ledger.first_time is not None:
        bits.append(f"{fmt.timestamp(ledger.first_time)} → {fmt.timestamp(ledger.latest_time)}")
    if ledger.queue_seconds:
        bits.append(f"queued {fmt.duration(ledger.queue_seconds)}")
    return [html.Div([html.H1([ledger.run_id, " ", status_badge(ledger.status)]),
                      html.Div(" · ".join(bits), className="muted")])]


def kpis(ledger: Ledger) -> list[html.Div]:
    """The card row, every GPU figure in one unit (the one the allocated total calls for)."""
    allocated = ledger.allocated_gpu_seconds
    wasted = float(sum(ledger.waste_gpu_seconds[c] for c in CATEGORIES))
    unit = fmt.gpu_time_unit(allocated)
    wall = fmt.duration(ledger.allocated_wall_seconds)
    cards = [
        kpi_card("Goodput", fmt.percent(ledger.goodput), value_id=ids.kpi_value("run", "goodput"),
                 note="productive ÷ allocated", color=COLORS["productive"]),
        kpi_card("Allocated", fmt.gpu_time(allocated, unit), value_id=ids.kpi_value("run", "allocated"),
                 note=f"{wall} of wall time"),
        kpi_card("Productive", fmt.gpu_time(ledger.productive_gpu_seconds, unit),
                 value_id=ids.kpi_value("run", "productive"),
                 note=fmt.share(ledger.productive_gpu_seconds, allocated), color=COLORS["productive"],
                 title=DESCRIPTIONS["productive"]),
        kpi_card(LABELS[EVAL], fmt.gpu_time(ledger.eval_gpu_seconds, unit), value_id=ids.kpi_value("run", EVAL),
                 note=fmt.share(ledger.eval_gpu_seconds, allocated), color=COLORS[EVAL], title=DESCRIPTIONS[EVAL]),
        kpi_card("Wasted", fmt.gpu_time(wasted, unit), value_id=ids.kpi_value("run", "wasted"),
                 note=fmt.share(wasted, allocated), color=WASTED_COLOR,
                 title="Every waste category together: allocated minus productive and eval"),
    ]
    for c in CATEGORIES:
        value = ledger.waste_gpu_seconds[c]
        cards.append(kpi_card(LABELS[c], fmt.gpu_time(value, unit), value_id=ids.kpi_value("run", f"waste-{c}"),
                              note=fmt.share(value, allocated), color=COLORS[c], title=DESCRIPTIONS[c]))
    split = fmt.startup_split(ledger.startup_parts)
    if split:  # where the startup went: which part to cut
        (top, top_s), rest = split[0], split[1:]
        cards.append(kpi_card(f"{LABELS['startup']}: {top}", fmt.gpu_time(top_s, unit),
                              value_id=ids.kpi_value("run", "startup-split"), color=COLORS["startup"],
                              note=" · ".join(f"{label} {fmt.gpu_time(v, unit)}" for label, v in rest) or "all of it",
                              title="The startup split at the moments the events mark: the processes' start, the "
                                    "process group up, the checkpoint loaded (docs/ledger.md, 'Startup, split')"))
    return cards


def ranks_note(ranks: RankCompute | NoRankCompute, ledger: Ledger) -> str:
    if not ranks.rows:
        return "No step timings yet."
    source = ranks.compute_source or "step duration"
    if isinstance(ranks, RankCompute) and ranks.figures_within is not None:
        source += f" (a long run: medians and p90 within {ranks.figures_within:.1%})"
    slow = ranks.straggler_ranks
    straggler = fmt.gpu_time(ledger.waste_gpu_seconds.straggler)
    clocks = clocks_note(ledger)
    if slow:
        names = ", ".join(str(r) for r in slow[:8]) + ("…" if len(slow) > 8 else "")
        return (f"Median {source} per step, whisker to p90. Straggler rank{'s' if len(slow) > 1 else ''} "
                f"{names} in the straggler colour: the others waited {straggler} for them.{clocks}")
    return f"Median {source} per step, whisker to p90. No rank stands out (straggler time {straggler}).{clocks}"


def clocks_note(ledger: Ledger) -> str:
    """" Host node001's clock is 5.0 s ahead: ..." when a host's clock was off and its times were taken back."""
    off = [c for c in ledger.clocks if c.offset_seconds]
    if not off:
        return ""
    named = "; ".join(f"{c.host} {fmt.clock_offset(c.offset_seconds)}" for c in off[:4])
    more = f" and {len(off) - 4:,} more" if len(off) > 4 else ""
    return (f" Clocks off the run's reference clock, measured from the step ends and taken out of every figure: "
            f"{named}{more} (check their NTP).")


TableRow = dict[str | float | int, str | NumberType | bool]  # a DataTable row, as dash types it

_TABLE_STYLE: dict[str, Any] = {
    "style_as_list_view": True,
    "style_header": {"backgroundColor": "#F9FAFB", "fontWeight": 600, "color": INK, "border": "none",
                     "borderBottom": f"1px solid {GRID}"},
    "style_cell": {"fontFamily": FONT, "fontSize": "13px", "padding": "6px 10px", "color": INK,
                   "border": "none", "borderBottom": f"1px solid {GRID}", "textAlign": "right"},
    "style_cell_conditional": [{"if": {"column_id": "when"}, "textAlign": "left"},
                               {"if": {"column_id": "outcome"}, "textAlign": "left"},
                               {"if": {"column_id": "cause"}, "textAlign": "left", "whiteSpace": "normal",
                                "minWidth": "240px", "maxWidth": "520px"}],
    "style_table": {"overflowX": "auto"},
    "page_size": 10,
    "sort_action": "native",
}


def final_failure_note(view: RunViews) -> html.P | None:
    """Why the run's last attempt failed, when no restart followed it (the restarts table says the others')."""
    failures = view.timeline.failures
    last = failures[-1] if failures else None
    if last is None or any(r.attempt > last.attempt for r in view.timeline.restarts):
        return None
    where = "during startup" if last.step is None else f"at step {fmt.integer(last.step)}"
    return html.P(id="run-final-failure", className="muted", children=[
        html.B(f"Attempt {last.attempt} failed {where}, and no restart followed: "), fmt.failure_cause(last.cause)])


def restart_table(restarts: Sequence[RestartRow]) -> Any:
    if not restarts:
        return html.P("No restarts: the run kept its first attempt.", className="muted")
    unit = fmt.gpu_time_unit(*(v for r in restarts for v in (r.rework_gpu_seconds, r.hang_gpu_seconds,
                                                             r.startup_gpu_seconds)))
    rows: list[TableRow] = [{
        "attempt": r.attempt, "when": fmt.timestamp(r.time),
        "outcome": _previous_attempt(r),
        "resume": "" if r.resume_step is None else fmt.integer(r.resume_step),  # 3,000 beside "step 3,023"
        "reworked": fmt.integer(r.steps_reworked),
        "rework": fmt.gpu_time(r.rework_gpu_seconds, unit), "hang": fmt.gpu_time(r.hang_gpu_seconds, unit),
        "startup": fmt.gpu_time(r.startup_gpu_seconds, unit),
        "cause": fmt.failure_cause(r.cause) if r.cause is not None else "",
    } for r in restarts]
    columns: list[DataTable.Columns] = [
        {"id": k, "name": v} for k, v in (("attempt", "Attempt"), ("when", "Restarted (UTC)"),
                                          ("outcome", "Previous attempt"), ("resume", "Resume step"),
                                          ("reworked", "Steps redone"), ("rework", "Rework"), ("hang", "Hang"),
                                          ("startup", "Startup"), ("cause", "Why it failed"))]
    return DataTable(id=ids.RUN_RESTART_TABLE + "-data", data=rows, columns=columns, **_TABLE_STYLE)


def _previous_attempt(r: RestartRow) -> str:
    """"failed at step 1,234", or "failed during startup (no step completed)" when it never reached a step."""
    if r.failed_at_step is None:
        return f"{r.after} during startup (no step completed)"
    return f"{r.after} at step {fmt.integer(r.failed_at_step)}"


def unused_gpus_note(view: RunViews) -> html.Div | None:
    """Said plainly when the allocation held more GPUs than any attempt ran ranks on: those GPUs never did any work
    (the ledger books them as idle)."""
    tl = view.timeline
    if not tl.allocations or not tl.attempts:
        return None
    gpus = max(a.gpus for a in tl.allocations)
    ranks = max(a.world_size for a in tl.attempts)
    if ranks >= gpus:
        return None
    unused = gpus - ranks
    return html.Div(className="message message-warning", id="run-unused-gpus", children=[
        html.B(f"{unused:,} of {gpus:,} allocated GPUs never ran a rank. "),
        f"Every attempt ran {ranks:,} rank{'s' if ranks != 1 else ''} on an allocation of {gpus:,} GPUs: the other "
        f"{unused:,} sat idle the whole run (in the Idle figure below). Ask for {ranks:,} GPUs, or run "
        f"{gpus:,} ranks."])


def straggler_table(ranks: RankCompute | NoRankCompute, run_id: str, project: str | None,
                    *, shown: int = 10) -> Any:
    """The ranks that cost the most straggler time (flagged ones first), each named with its host and opening its
    drill-down."""
    rows = sorted(ranks.rows, key=lambda r: (not r.is_straggler, -r.straggler_gpu_seconds, r.rank))[:shown]
    if not rows:
        return html.P("No step timings yet.", className="muted")
    overall = ranks.median_compute_s if isinstance(ranks, RankCompute) else None
    unit = fmt.gpu_time_unit(*(r.straggler_gpu_seconds for r in rows))
    head = html.Tr([html.Th(h) for h in ("Rank", "Host", "Host clock", "Median compute", "p90", "vs all ranks",
                                         f"Straggler cost ({unit.symbol})", "Steps", "")])
    body = []
    for r in rows:
        excess = f"{r.median_compute_s / overall - 1:+.0%}" if overall else fmt.DASH
        body.append(html.Tr(className="straggler-row" if r.is_straggler else "", children=[
            html.Td(dcc.Link(str(r.rank), href=run_href(run_id, project, r.rank))), html.Td(r.host or fmt.DASH),
            html.Td(fmt.clock_offset(r.clock_offset_seconds)),
            html.Td(fmt.duration(r.median_compute_s)), html.Td(fmt.duration(r.p90_compute_s)), html.Td(excess),
            html.Td(fmt.gpu_time(r.straggler_gpu_seconds, unit, with_unit=False)), html.Td(fmt.integer(r.steps)),
            html.Td("flagged straggler" if r.is_straggler else "", className="straggler-flag")]))
    more = len(ranks.rows) - len(rows)
    note = (f"The {len(rows):,} costliest of {len(ranks.rows):,} ranks shown; open any rank from the list above."
            if more > 0 else "Every rank, costliest first.")
    return html.Div([html.Table([html.Thead(head), html.Tbody(body)], className="table straggler-table",
                                id=ids.RUN_STRAGGLER_TABLE + "-data"), html.P(note, className="muted")])


def rank_options(ranks: RankCompute | NoRankCompute) -> list[dict[str, Any]]:
    """The rank picker's choices: every rank with its host."""
    return [{"label": rank_name(r.rank, r.host) + (" (straggler)" if r.is_straggler else ""), "value": r.rank}
            for r in sorted(ranks.rows, key=lambda r: r.rank)]


def checkpoint_table(checkpoints: Sequence[CheckpointRow], total: int, ledger: Ledger) -> Any:
    if not checkpoints:
        return html.P("No checkpoints reported: a failure loses everything since the start.", className="muted")
    summary = ledger.checkpoints
    rows: list[TableRow] = [{
        "attempt": c.attempt, "step": c.step, "when": fmt.timestamp(c.start), "blocking": round(c.blocking_seconds, 2),
        "ok": "torn" if c.torn else ("ok" if c.ok else "failed"),
    } for c in reversed(checkpoints)]
    columns: list[DataTable.Columns] = [
        {"id": "step", "name": "Step", "type": "numeric", "format": {"specifier": ",d"}},
        {"id": "attempt", "name": "Attempt", "type": "numeric"},
        {"id": "when", "name": "Started (UTC)"},
        {"id": "blocking", "name": "Blocking (s)", "type": "numeric", "format": {"specifier": ",.2f"}},
        {"id": "ok", "name": "Result"}]
    note = (f"{summary.count:,} checkpoints: {summary.ok:,} ok, {summary.failed:,} failed, "
            f"{summary.torn:,} torn; median blocking {fmt.duration(summary.median_blocking_seconds)}"
            + (f", every {fmt.duration(summary.median_interval_seconds)}"
               if summary.median_interval_seconds is not None else "") + ". Newest first.")
    if total > len(checkpoints):
        note += f" Showing the last {len(checkpoints):,} of {total:,}."
    style = dict(_TABLE_STYLE)
    style["style_data_conditional"] = [
        {"if": {"filter_query": '{ok} != "ok"', "column_id": "ok"}, "color": MARKER_COLORS["failure"],
         "fontWeight": 600}]
    return html.Div([html.P(note, className="muted"),
                     DataTable(id=ids.RUN_CHECKPOINT_TABLE + "-data", data=rows, columns=columns, **style)])


def suspects_text(live: LiveRun | None) -> str | None:
    """The line "Suspect rank 3 on node000 (no heartbeat for 41 s)." of a hung run's live document, strongest
    evidence first as the collector lists them (the host when the rank's attempt_start named one); None when it
    has none."""
    if live is None or not live.hung or not live.suspects:
        return None
    parts = [f"{s.rank}{f' on {s.host}' if s.host else ''} ({'; '.join(s.reasons)})" for s in live.suspects[:8]]
    total = live.suspects_truncated or len(live.suspects)
    more = total - len(parts)
    label = "Suspect rank" if total == 1 else "Suspect ranks"
    return f"{label} {', '.join(parts)}" + (f" and {more} more" if more > 0 else "") + "."


def freshness_note(view: RunView) -> html.Div | None:
    """Shown while the figures below describe an older version of the run than the collector has, or for good once
    retention pruned the run's raw rows (what is built from its step summaries, what is as of then)."""
    if view.detail_pruned_at is not None and not view.stale:
        # older than the run and not stale: pruned by a goodput that kept no step summaries (never analysed again)
        return html.Div(className="freshness", id="run-pruned-note", children=fmt.pruned_note(
            view.detail_pruned_at, unanalysed_events=view.run_version > view.version))
    if not view.stale:
        return None
    took = view.analysis_seconds
    return html.Div(className="freshness", id="run-freshness-note", children=[
        html.B("Updating. "),
        f"The figures below are as of {fmt.timestamp(view.analysed_at)}: the run has received events "
        f"since, and analysing all of it takes about {fmt.duration(took) if took else 'a while'} here. They are "
        "redrawn when the new analysis is ready; the status line above is current."])
