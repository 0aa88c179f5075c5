"""Any unknown path."""

from __future__ import annotations

from typing import Any

import dash
from dash import dcc, html

dash.register_page(__name__, title="goodput: not found")


def layout(**_query: Any) -> html.Div:
    return html.Div(className="empty", children=[
        html.H2("Page not found"),
        html.P(["There is no such page. ", dcc.Link("Back to the fleet", href=dash.get_relative_path("/")), "."]),
    ])
