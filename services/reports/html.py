"""A run's report as one HTML file, print-friendly, with no request outside the collector that served it.

plotly.js (4.6 MB, 95% of a report that inlines it) is referenced from the collector by default
(`GET /v1/assets/plotly.min.js`, cached by the browser once for every report): a report then weighs tens of
kilobytes and still needs no internet, only the collector that served it, as the dashboard does. A file to send
elsewhere asks for it inlined (`self_contained=true`, `goodput report --self-contained`). Every figure of a chart is
also in a table, so a report whose script cannot load still says everything.

Pure: the report from `services.reports.content.build_report` in, an HTML string out. Figures have a fixed
width that fits an A4 page, so the printed report looks like the screen one.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import plotly.graph_objects as go

from services.presentation import (
    CATEGORY_ORDER,
    COLORS,
    DASH,
    DESCRIPTIONS,
    GPU_SECONDS,
    STATUS_COLORS,
    GpuTimeUnit,
    advice_stake,
    duration,
    failure_cause,
    gpu_seconds,
    gpu_time,
    gpu_time_unit,
    no_advice,
    percent,
    pruned_note,
    startup_split,
    timestamp,
)
from services.reports.content import ALLOCATED, BreakdownRow, RunReport, StragglerRow
from services.schemas.advice import MeasuredRun, Recommendation
from services.schemas.categories import WasteCategory
from services.schemas.ledger import AttemptLedger, ProvisionalHang
from services.schemas.views import CheckpointRow, RestartRow

FIG_WIDTH = 700
_FONT = "Inter, -apple-system, BlinkMacSystemFont, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif"

_CSS = """
:root { --ink: #1F2937; --muted: #6B7280; --grid: #E5E7EB; }
* { box-sizing: border-box; }
body { margin: 0; background: #F3F4F6; color: var(--ink); font: 14px/1.45 %(font)s; }
main { max-width: 760px; margin: 24px auto; background: white; padding: 28px 30px 20px; border-radius: 6px;
       box-shadow: 0 1px 3px rgba(0,0,0,.08); }
h1 { font-size: 22px; margin: 0 0 4px; } h1 code { font-size: 20px; }
h2 { font-size: 16px; margin: 26px 0 8px; padding-bottom: 4px; border-bottom: 1px solid var(--grid); }
.meta { color: var(--muted); margin: 0; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; color: white; font-size: 12px;
         font-weight: 600; vertical-align: 2px; }
.kpis { display: grid; grid-template-columns: repeat(3, 1fr); gap: 10px; margin-top: 18px; }
.kpi { border: 1px solid var(--grid); border-radius: 6px; padding: 8px 12px; }
.kpi .label { color: var(--muted); font-size: 12px; } .kpi .value { font-size: 20px; font-weight: 600; }
.kpi .sub { color: var(--muted); font-size: 12px; }
table { border-collapse: collapse; width: 100%; font-variant-numeric: tabular-nums; margin: 6px 0; }
th, td { padding: 4px 8px; border-bottom: 1px solid var(--grid); text-align: right; white-space: nowrap; }
td.desc { white-space: normal; }
th { font-size: 12px; color: var(--muted); font-weight: 600; white-space: normal; vertical-align: bottom; }
th:first-child, td:first-child { text-align: left; }
td.desc { text-align: left; color: var(--muted); font-size: 12px; }
tr.total td { font-weight: 600; border-top: 2px solid var(--ink); }
.swatch { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 6px; }
.figure { margin: 6px 0; break-inside: avoid; }
.recs { padding-left: 0; list-style: none; margin: 6px 0; }
.recs li { border-left: 4px solid #0072B2; background: #F9FAFB; padding: 8px 12px; margin-bottom: 8px;
    break-inside: avoid; }
.recs .title { font-weight: 600; } .recs .stake, .recs .model, .recs .confidence { color: var(--muted);
    font-size: 12px; }
.recs .prediction { margin-top: 4px; font-weight: 500; }
.recs table.evidence { margin: 4px 0; font-size: 12px; width: auto; }
.recs table.evidence td { padding: 1px 8px 1px 0; border: none; }
.note { color: var(--muted); font-size: 12px; }
footer { margin-top: 24px; color: var(--muted); font-size: 12px; border-top: 1px solid var(--grid); padding-top: 8px; }
@page { size: A4; margin: 12mm; }
@media print {
  body { background: white; font-size: 12px; }
  main { box-shadow: none; margin: 0; padding: 0; max-width: none; }
  h2 { break-after: avoid; }
  section, table, .kpis { break-inside: avoid; }
  .badge, .swatch, .recs li { -webkit-print-color-adjust: exact; print-color-adjust: exact; }
}
""".replace("%(font)s", _FONT)


def _e(value: object) -> str:
    return html.escape(str(value))


def _layout(fig: go.Figure, height: int, **extra: Any) -> go.Figure:
    layout: dict[str, Any] = {"width": FIG_WIDTH, "height": height, "paper_bgcolor": "white",
                              "plot_bgcolor": "white", "font": {"family": _FONT, "size": 12, "color": "#1F2937"},
                              "margin": {"l": 60, "r": 16, "t": 10, "b": 40},
                              "legend": {"orientation": "h", "y": -0.25, "x": 0, "traceorder": "normal"}}
    fig.update_layout(**{**layout, **extra})
    fig.update_xaxes(gridcolor="#E5E7EB", zerolinecolor="#E5E7EB")
    fig.update_yaxes(gridcolor="#E5E7EB", zerolinecolor="#E5E7EB")
    return fig


def _ledger_bar(breakdown: Sequence[BreakdownRow], unit: GpuTimeUnit) -> go.Figure:
    fig = go.Figure()
    for row in breakdown:
        if row.category == ALLOCATED or not row.gpu_seconds:
            continue
        share = row.share or 0.0
        fig.add_bar(y=["allocation"], x=[share], orientation="h", name=row.category,
                    marker_color=COLORS[row.category], text=[percent(share) if share >= 0.04 else ""],
                    textposition="inside", insidetextanchor="middle", textfont={"color": "white"},
                    hovertemplate=f"{row.category}: {percent(row.share)}, "
                                  f"{gpu_time(row.gpu_seconds, unit)}<extra></extra>")
    fig.update_layout(barmode="stack", showlegend=True)
    fig.update_xaxes(range=[0, 1], tickformat=".0%")
    fig.update_yaxes(visible=False)
    return _layout(fig, 150, margin={"l": 10, "r": 16, "t": 6, "b": 30},
                   legend={"orientation": "h", "y": -0.55, "traceorder": "normal"})


def _attempts_figure(attempts: Sequence[AttemptLedger], unit: GpuTimeUnit) -> go.Figure:
    labels = [str(a.attempt) for a in attempts]
    fig = go.Figure()
    for category in CATEGORY_ORDER:
        values = [unit.value(a.gpu_seconds.get(category, 0.0)) for a in attempts]
        if any(values):
            fig.add_bar(x=labels, y=values, name=category, marker_color=COLORS[category],
                        hovertemplate=f"attempt %{{x}} {category}: %{{y:{unit.d3_format}}} {unit.symbol}"
                                      "<extra></extra>")
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title_text="attempt", type="category", tickangle=0)
    fig.update_yaxes(title_text=unit.title)
    return _layout(fig, 300, legend={"orientation": "h", "y": -0.3, "x": 0, "traceorder": "normal"})


def _checkpoint_figure(rows: Sequence[CheckpointRow]) -> go.Figure:
    fig = go.Figure()
    for ok, name, color in ((True, "ok", COLORS[WasteCategory.CHECKPOINT.value]),
                            (False, "failed or torn", COLORS[WasteCategory.HANG.value])):
        part = [r for r in rows if r.ok is ok and not (ok and r.torn)]
        if part:
            fig.add_scatter(x=[datetime.fromtimestamp(r.start, UTC) for r in part],
                            y=[r.blocking_seconds for r in part], mode="markers", name=name,
                            marker={"color": color, "size": 6},
                            customdata=[[r.step, r.attempt] for r in part],
                            hovertemplate="step %{customdata[0]} (attempt %{customdata[1]}): "
                                          "%{y:,.1f} s<extra></extra>")
    fig.update_yaxes(title_text="seconds blocked", rangemode="tozero")
    return _layout(fig, 260)


def _straggler_figure(rows: Sequence[StragglerRow], unit: GpuTimeUnit) -> go.Figure:
    fig = go.Figure()
    fig.add_bar(x=[f"rank {r.rank}" for r in rows], y=[unit.value(r.straggler_gpu_seconds) for r in rows],
                marker_color=COLORS[WasteCategory.STRAGGLER.value],
                hovertemplate=f"%{{x}}: %{{y:{unit.d3_format}}} {unit.symbol}<extra></extra>", showlegend=False)
    fig.update_yaxes(title_text=f"straggler {unit.title}")
    return _layout(fig, 240, bargap=0.3 if len(rows) > 3 else 0.8)


class _Figures:
    """Inlines plotly.js with the first figure only (the later ones reuse it), or none when the page loads it."""

    def __init__(self, *, inline: bool) -> None:
        self._first = inline

    def __call__(self, fig: go.Figure) -> str:
        out = fig.to_html(full_html=False, include_plotlyjs=self._first,
                          config={"displayModeBar": False, "responsive": False})
        self._first = False
        return f'<div class="figure">{out}</div>'


def _kpi(label: str, value: str, sub: str = "") -> str:
    return (f'<div class="kpi"><div class="label">{_e(label)}</div><div class="value">{_e(value)}</div>'
            f'<div class="sub">{_e(sub)}</div></div>')


def _nb(text: str) -> str:
    """A unit that does not break at its hyphen in a table header."""
    return _e(text).replace("-", "&#8209;")


def _breakdown_table(breakdown: Sequence[BreakdownRow], unit: GpuTimeUnit,
                     startup: Sequence[tuple[str, float]] = ()) -> str:
    """The ledger's rows; under startup, its parts (`startup`: presentation.startup_split)."""
    body = []
    second = unit is not GPU_SECONDS  # a column in the run's unit only when it is not the GPU-seconds beside it
    allocated = next((r.gpu_seconds for r in breakdown if r.category == ALLOCATED), 0.0)
    for row in breakdown:
        category = row.category
        swatch = f'<span class="swatch" style="background:{COLORS[category]}"></span>' if category in COLORS else ""
        css = ' class="total"' if category == ALLOCATED else ""
        in_unit = f"<td>{gpu_time(row.gpu_seconds, unit, with_unit=False)}</td>" if second else ""
        body.append(f"<tr{css}><td>{swatch}{_e(category)}</td><td>{gpu_seconds(row.gpu_seconds)}</td>{in_unit}"
                    f"<td>{percent(row.share)}</td>"
                    f'<td class="desc">{_e(DESCRIPTIONS.get(category, ""))}</td></tr>')
        if category == "startup":
            body += [f'<tr class="part"><td>&nbsp;&nbsp;{_e(label)}</td><td>{gpu_seconds(value)}</td>'
                     + (f"<td>{gpu_time(value, unit, with_unit=False)}</td>" if second else "")
                     + f"<td>{percent(value / allocated if allocated > 0 else None)}</td><td></td></tr>"
                     for label, value in startup]
    header = f"<th>{_nb(unit.title)}</th>" if second else ""
    return ("<table><thead><tr><th>category</th><th>GPU&#8209;seconds</th>"
            f"{header}<th>share</th>"
            f"<th></th></tr></thead><tbody>{''.join(body)}</tbody></table>")


def _or_dash(value: object | None) -> object:
    return DASH if value is None else value


def _restarts_table(rows: Sequence[RestartRow], unit: GpuTimeUnit) -> str:
    if not rows:
        return '<p class="note">No restart.</p>'
    body = "".join(
        f"<tr><td>{_e(r.attempt)}</td><td>{_e(timestamp(r.time)[5:-4])}</td><td>{_e(r.after or '')}</td>"
        f"<td>{_e(_or_dash(r.failed_at_step))}</td><td>{_e(_or_dash(r.resume_step))}</td>"
        f"<td>{gpu_time(r.rework_gpu_seconds, unit, with_unit=False)}</td>"
        f"<td>{gpu_time(r.hang_gpu_seconds, unit, with_unit=False)}</td>"
        f"<td>{gpu_time(r.startup_gpu_seconds, unit, with_unit=False)}</td>"
        f'<td class="desc">{_e(failure_cause(r.cause) if r.cause is not None else "")}</td></tr>'
        for r in rows)
    return ("<table><thead><tr><th>attempt</th><th>restarted (UTC)</th><th>after</th><th>failed at</th>"
            f"<th>resumed at</th><th>rework {_nb(unit.symbol)}</th><th>hang {_nb(unit.symbol)}</th>"
            f"<th>startup {_nb(unit.symbol)}</th><th>why it failed</th>"
            f"</tr></thead><tbody>{body}</tbody></table>")


def _straggler_table(rows: Sequence[StragglerRow], unit: GpuTimeUnit) -> str:
    body = "".join(
        f"<tr><td>{_e(r.rank)}</td><td>{_e(r.host or DASH)}</td>"
        f"<td>{gpu_time(r.straggler_gpu_seconds, unit, with_unit=False)}</td><td>{percent(r.share_of_straggler)}</td>"
        f"<td>{duration(r.median_compute_seconds)}</td></tr>"
        for r in rows[:10])
    return (f"<table><thead><tr><th>rank</th><th>host</th><th>straggler {_nb(unit.symbol)}</th>"
            f"<th>share of straggler</th><th>median compute / step</th></tr></thead><tbody>{body}</tbody></table>")


def _recommendation(r: Recommendation) -> str:
    """One recommendation as the engine wrote it: every text field verbatim (GET /v1/runs/{id}/advice's)."""
    evidence = "".join(f"<tr><td>{_e(e.label)}</td><td>{_e(e.text)}</td></tr>" for e in r.evidence)
    return (f'<li id="advice-{_e(r.code)}"><div class="title">{_e(r.title)}</div>'
            f'<div class="wording">{_e(r.wording)}</div><div class="prediction">{_e(r.prediction)}</div>'
            f'<table class="evidence"><tbody>{evidence}</tbody></table>'
            f'<div class="model">Model ({_e(r.model.name)}): {_e(r.model.statement)}</div>'
            f'<div class="confidence">Confidence: {_e(r.confidence.text)}</div>'
            f'<div class="stake">{_e(advice_stake(r))}</div></li>')


def _recommendations(measured: MeasuredRun, recs: Sequence[Recommendation], notes: Sequence[str]) -> str:
    parts = [f'<p class="measured">{_e(measured.text)}</p>']
    if recs:
        parts.append(f'<ol class="recs">{"".join(_recommendation(r) for r in recs)}</ol>')
    else:
        parts.append(f'<p class="note">{_e(no_advice(measured))}</p>')
    if notes:
        parts.append('<p class="note">Weighed and not advised:</p><ul class="notes">'
                     + "".join(f'<li class="note">{_e(n)}</li>' for n in notes) + "</ul>")
    return "".join(parts)


def _provisional_note(provisional: ProvisionalHang | None, unit: GpuTimeUnit) -> str:
    if not provisional:
        return ""
    return (f'<p class="note provisional"><strong>Hung now (provisional):</strong> no progress since '
            f"{_e(timestamp(provisional.since))}; {_e(gpu_time(provisional.hang_gpu_seconds, unit))} of hang "
            f"up to {_e(timestamp(provisional.as_of))} are counted in these figures and replaced by the final "
            "ledger once the attempt ends.</p>")


def _pruned_note(detail_pruned_at: float | None) -> str:
    if detail_pruned_at is None:
        return ""
    return f'<p class="note pruned">{_e(pruned_note(detail_pruned_at))}</p>'


def report_html(report: RunReport, *, plotly_src: str | None = None) -> str:
    """The report; `plotly_src`: the URL the page loads plotly.js from (None: inlined, a self-contained file)."""
    ledger = report.ledger
    breakdown = report.breakdown
    figure = _Figures(inline=plotly_src is None)
    status = ledger.status
    waste_total = ledger.waste_total_gpu_seconds
    allocated = ledger.allocated_gpu_seconds
    ck = report.checkpoints.summary
    unit = gpu_time_unit(allocated)  # one unit for the run, the size of its allocation (as on its page)

    parts = [
        (f"<header><h1>Run <code>{_e(report.run_id)}</code> "
         f'<span class="badge" style="background:{STATUS_COLORS.get(status, "#6B7280")}">{_e(status)}</span></h1>'
         f'<p class="meta">{_e(timestamp(ledger.first_time))} to {_e(timestamp(ledger.latest_time))}'
         f" · {_e(duration(ledger.allocated_wall_seconds))} allocated wall time"
         f" · report written {_e(timestamp(report.generated_at))}</p></header>"),
        _provisional_note(ledger.provisional, unit),
        _pruned_note(report.detail_pruned_at),
        '<section class="kpis">',
        _kpi("goodput", percent(ledger.goodput), "productive / allocated"),
        _kpi("allocated", gpu_time(allocated, unit), f"{gpu_seconds(allocated)} GPU-s"),
        _kpi("productive", gpu_time(ledger.productive_gpu_seconds, unit),
             f"{gpu_seconds(ledger.productive_gpu_seconds)} GPU-s"),
        _kpi("waste", gpu_time(waste_total, unit), percent(waste_total / allocated) + " of allocated"
             if allocated > 0 else ""),
        _kpi("eval", gpu_time(ledger.eval_gpu_seconds, unit), "validation between steps: not waste")
        if ledger.eval_gpu_seconds > 0 else "",
        _kpi("restarts", str(ledger.restarts), f"{ledger.failures} failure(s), MTBF "
             f"{duration(ledger.mtbf_seconds)}"),
        _kpi("at risk", gpu_time(ledger.at_risk_gpu_seconds, unit), "work since the last checkpoint"),
        "</section>",
        "<section><h2>Where the GPU time went</h2>", figure(_ledger_bar(breakdown, unit)),
        _breakdown_table(breakdown, unit, startup_split(ledger.startup_parts)), "</section>",
        "<section><h2>Recommendations</h2>"
        f"{_recommendations(report.measured, report.recommendations, report.advice_notes)}</section>",
    ]
    parts.append("<section><h2>Attempts and restarts</h2>")
    if ledger.attempts:
        parts.append(figure(_attempts_figure(ledger.attempts, unit)))
        parts.append('<p class="note">Per attempt, before the straggler carve-out (straggler time is counted per '
                     "rank, in the table below).</p>")
    parts.append(_restarts_table(report.restarts, unit) + "</section>")

    parts.append("<section><h2>Checkpoints</h2>")
    parts.append(f"<p>{_e(ck.count)} checkpoint(s): {_e(ck.ok)} ok, {_e(ck.failed)} failed, {_e(ck.torn)} torn; "
                 f"median blocking {_e(duration(ck.median_blocking_seconds))}"
                 f", median interval (one write's start to the next) {_e(duration(ck.median_interval_seconds))}"
                 f"; last good step {_e(_or_dash(ck.last_ok_step))}.</p>")
    rows = report.checkpoints.rows or []
    if rows:
        parts.append(figure(_checkpoint_figure(rows)))
    parts.append("</section>")

    stragglers = report.stragglers
    parts.append("<section><h2>Stragglers</h2>")
    if stragglers:
        parts.append(figure(_straggler_figure(stragglers, unit)))
        parts.append(_straggler_table(stragglers, unit))
        if report.median_compute_within is not None:
            parts.append(f'<p class="note">A long run: median compute per step within '
                         f"{_e(percent(report.median_compute_within))} (drawn from fixed-size per-rank histograms; "
                         "straggler time is exact).</p>")
    else:
        parts.append('<p class="note">No rank was charged with straggler time.</p>')
    parts.append("</section>")
    parts.append('<footer>goodput waste ledger. Every allocated GPU-second is counted once: productive or one waste '
                 f"category (rules: docs/ledger.md). GPU time in {_e(unit.title)}, the unit the run's size calls for; "
                 "shares are of the allocated GPU-seconds.</footer>")
    body = "\n".join(parts)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>goodput report: {_e(report.run_id)}</title><style>{_CSS}</style>"
            + (f'<script src="{_e(plotly_src)}" charset="utf-8"></script>' if plotly_src else "") + "</head>"
            f"<body><main>\n{body}\n</main></body></html>\n")
