"""KPI cards: a label, a value with a stable id (the browser tests read it), and a small note."""

from __future__ import annotations

from collections.abc import Sequence

from dash import html
from dash.development.base_component import Component

from services.presentation import STATUS_COLORS, STATUS_TEXT_COLORS


def kpi_card(label: str, value: str, *, value_id: str, note: str = "", color: str | None = None,
             title: str | None = None) -> html.Div:
    stripe = {"borderTopColor": color} if color else {}
    return html.Div(className="kpi", style=stripe, title=title or "", children=[
        html.Div(label, className="kpi-label"),
        html.Div(value, id=value_id, className="kpi-value"),
        html.Div(note, className="kpi-note", id=f"{value_id}-note"),
    ])


def status_badge(status: str) -> html.Span:
    """The status in its own colour (services.presentation.STATUS_COLORS: never a waste category's)."""
    return html.Span(status, className=f"badge badge-{status}",
                     style={"backgroundColor": STATUS_COLORS.get(status, STATUS_COLORS["cancelled"]),
                            "color": STATUS_TEXT_COLORS.get(status, "#FFFFFF")})


def message(text: str, *, kind: str = "info", children: Sequence[Component] = ()) -> html.Div:
    """A boxed message (info / warning / error) instead of a traceback or a blank page."""
    return html.Div(className=f"message message-{kind}", children=[html.Div(text), *children])
