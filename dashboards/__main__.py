"""`python -m dashboards --api http://collector:8000 --port 8050`: the dashboard as its own process."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from services.settings import DashboardSettings


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dashboards", description="The goodput dashboard (standalone).")
    p.add_argument("--api", help="collector base URL (default GOODPUT_DASHBOARD_API_URL, else http://127.0.0.1:8000)")
    p.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8050, help="listen port (default 8050)")
    p.add_argument("--refresh", type=float, help="seconds between page refreshes (default 5)")
    p.add_argument("--prefix", default="/", help="URL path the dashboard is served under (default /)")
    ns = p.parse_args(argv)
    given: dict[str, Any] = {"api_url": ns.api} if ns.api else {}
    if ns.refresh is not None:
        given["refresh_s"] = ns.refresh
    config = DashboardSettings(**given)
    if config.api_url is None:
        config = config.model_copy(update={"api_url": "http://127.0.0.1:8000"})
    from dashboards.access import require_sign_in
    from dashboards.app import create_app

    prefix = "/" + ns.prefix.strip("/") + "/" if ns.prefix.strip("/") else "/"
    app = create_app(config, requests_pathname_prefix=prefix, routes_pathname_prefix=prefix)
    require_sign_in(app.server, config)  # browsers sign in with a read token (dashboards.access)
    print(f"goodput dashboard on http://{ns.host}:{ns.port}{prefix} reading {config.api_url}", flush=True)
    try:
        from waitress import serve  # optional: a production WSGI server when installed
    except ImportError:
        app.run(host=ns.host, port=ns.port, debug=False)
    else:
        serve(app.server, host=ns.host, port=ns.port, threads=8)
    return 0


if __name__ == "__main__":
    sys.exit(main())
