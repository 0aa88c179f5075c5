"""The goodput dashboard: a Dash multi-page app that reads the collector's HTTP API.

`create_app(api_url)` builds it; `dashboards.mount.mount_dashboard(app)` serves it inside the collector under
/dashboard/ (single-process mode); `python -m dashboards --api URL --port 8050` runs it as its own process.
"""
