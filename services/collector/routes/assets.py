"""`GET /v1/assets/plotly.min.js`: the plotly.js the HTML reports load from the collector that served them, so a
report is tens of kilobytes, not 4.9 MB, and needs no internet (services/reports/html.py). Library code, not data:
only the network rule applies, as to /healthz, since a report's script tag carries no token."""

from __future__ import annotations

from functools import cache

import plotly
from fastapi import APIRouter, Response
from plotly.offline import get_plotlyjs

from services.collector.auth import NETWORK

router = APIRouter(tags=["reports"])

PLOTLY_JS = "/v1/assets/plotly.min.js"


@cache
def _plotly_js() -> bytes:
    script: str = get_plotlyjs()  # plotly ships no type hints
    return script.encode()


@router.get(PLOTLY_JS, response_class=Response, dependencies=[NETWORK],
            responses={200: {"content": {"text/javascript": {}}}},
            summary="plotly.js, for the HTML reports' charts (the version of the collector's plotly)")
def get_plotly_js() -> Response:
    return Response(_plotly_js(), media_type="text/javascript; charset=utf-8", headers={
        "Cache-Control": "public, max-age=86400", "ETag": f'"plotly-{plotly.__version__}"'})
