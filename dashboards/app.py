"""create_app(config) -> the Dash multi-page app (pages in dashboards/pages, styles in dashboards/assets)."""

from __future__ import annotations

from pathlib import Path

import dash
from dash import Dash, dcc, html

from dashboards import ids
from dashboards.components.navbar import navbar
from dashboards.data import CONFIG_KEY
from services.settings import DashboardSettings

_HERE = Path(__file__).resolve().parent


def create_app(config: DashboardSettings | None = None, *, requests_pathname_prefix: str = "/",
               routes_pathname_prefix: str = "/") -> Dash:
    """The dashboard, reading the collector API at `config.api_url` (None: the server it is mounted in).

    Only one app per process: Dash pages and `dash.callback` register globally, and the first app takes them.
    """
    config = config or DashboardSettings()
    app = Dash(
        __name__,
        use_pages=True,
        pages_folder=str(_HERE / "pages"),
        assets_folder=str(_HERE / "assets"),
        requests_pathname_prefix=requests_pathname_prefix,
        routes_pathname_prefix=routes_pathname_prefix,
        title="goodput",
        update_title="",  # the tab keeps its title while callbacks run
        suppress_callback_exceptions=True,
        serve_locally=True,
    )
    app.server.config[CONFIG_KEY] = config
    app.layout = html.Div(className="app", children=[
        dcc.Location(id=ids.APP_LOCATION, refresh="callback-nav"),
        dcc.Interval(id=ids.APP_INTERVAL, interval=int(config.refresh_s * 1000), n_intervals=0),
        navbar(),
        html.Main(className="container", children=[dash.page_container]),
        html.Footer(className="footer", children=[
            ("goodput: productive GPU time ÷ allocated GPU time. Numbers come from the collector's API; "
            "pages refresh every "), html.Span(f"{config.refresh_s:g} s"), "."]),
    ])
    return app
