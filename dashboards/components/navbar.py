"""The bar on top of every page."""

from __future__ import annotations

import dash
from dash import dcc, html


def navbar() -> html.Header:
    return html.Header(className="navbar", children=[
        dcc.Link(className="brand", href=dash.get_relative_path("/"), children=[
            html.Span("◐", className="brand-mark"), html.Span("goodput")]),
        html.Nav(children=[dcc.Link("Fleet", href=dash.get_relative_path("/"), className="nav-link")]),
        html.Span("where your GPU-hours go", className="tagline"),
    ])
