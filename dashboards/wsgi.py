"""WSGI entry for a production server: `gunicorn -w 2 -b 0.0.0.0:8050 dashboards.wsgi:server`.

Reads GOODPUT_DASHBOARD_API_URL (required here: a standalone dashboard cannot guess the collector's address)
and GOODPUT_DASHBOARD_REFRESH_S. Building the app fetches nothing. Browsers sign in with a read token
(dashboards.access).
"""

from __future__ import annotations

from dashboards.access import require_sign_in
from dashboards.app import create_app
from services.settings import DashboardSettings

_config = DashboardSettings()
if _config.api_url is None:
    raise RuntimeError("set GOODPUT_DASHBOARD_API_URL to the collector's base URL, e.g. http://collector:8000")
server = create_app(_config).server
require_sign_in(server, _config)  # browsers sign in with a read token (dashboards.access)
