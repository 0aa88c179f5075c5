"""The run page's recommendations panel: the advice engine's document (GET /v1/runs/{run_id}/advice) shown as served.

Every sentence and figure is the engine's text (services.analysis.advice writes them once, with services.presentation's
formats), in the order `goodput advise` prints them: the measured sentence; per recommendation its title, what is at
stake, the wording, the prediction, then the evidence, the model and the confidence; the notes of what was weighed and
not advised. Nothing here formats a number of its own, so the page, the CLI, the API and the JSON report cannot
disagree.
"""

from __future__ import annotations

from typing import Any

from dash import html

from services.presentation import COLORS, advice_stake, no_advice
from services.schemas.advice import Recommendation, RunAdvice

_OTHER_COLOR = "#6B7280"  # queue / correctness: not a waste category's colour


def advice_panel(advice: RunAdvice | None, *, error: str | None = None) -> list[Any]:
    if advice is None:
        return [html.H3("What to do"), html.P(error or "Weighing the advice…", className="muted",
                                              id="run-advice-status")]
    items = [_recommendation(n, rec) for n, rec in enumerate(advice.recommendations, 1)]
    body: list[Any] = [
        html.H3("What to do"),
        html.P(advice.measured.text, className="advice-measured", id="run-advice-measured"),
        html.Ol(items, className="advice-list", id="run-advice-list") if items
        else html.P(no_advice(advice.measured), className="advice-none", id="run-advice-none"),
    ]
    if advice.notes:
        body.append(html.Div(className="advice-notes", id="run-advice-notes", children=[
            html.Div("Weighed and not advised:", className="advice-notes-title"),
            html.Ul([html.Li(note, className="advice-note") for note in advice.notes])]))
    return body


def _recommendation(n: int, rec: Recommendation) -> html.Li:
    color = COLORS.get(rec.category, _OTHER_COLOR)
    return html.Li(id=f"run-advice-{rec.code}", className="advice", style={"borderLeftColor": color}, children=[
        html.Div(className="advice-head", children=[
            html.Span(rec.title, className="advice-title"),
            html.Span(advice_stake(rec), className="advice-stake")]),
        html.P(rec.wording, className="advice-wording"),
        html.P(rec.prediction, className="advice-prediction"),
        html.Details(className="advice-why", open=n == 1, children=[
            html.Summary("Evidence, model and confidence"),
            html.Ul(className="advice-evidence", children=[
                html.Li([html.Span(e.label, className="evidence-label"), " ",
                         html.Span(e.text, className="evidence-text")]) for e in rec.evidence]),
            html.P(f"model ({rec.model.name}): {rec.model.statement}", className="advice-model"),
            html.P(f"confidence: {rec.confidence.text}", className="advice-confidence")]),
    ])
