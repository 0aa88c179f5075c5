"""The dashboard reads the API with the browser's own credential, else with GOODPUT_DASHBOARD_TOKEN."""

from __future__ import annotations

import flask
import httpx
import pytest

from dashboards import data
from services.api_client import AccessDenied, ApiClient
from services.settings import DashboardSettings


def _headers_sent(config: DashboardSettings, request_headers: dict[str, str]) -> dict[str, str]:
    app = flask.Flask(__name__)
    app.config[data.CONFIG_KEY] = config
    seen: dict[str, str] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen.update(request.headers)
        return httpx.Response(200, json={"runs": [], "count": 0})

    with app.test_request_context("/dashboard/", headers=request_headers):
        app.extensions[data._CLIENTS_KEY] = {config.api_url: ApiClient(
            str(config.api_url), http=httpx.Client(transport=httpx.MockTransport(handler)))}
        data.api().runs()
    return seen


def test_the_browsers_credential_is_forwarded_as_is() -> None:
    seen = _headers_sent(DashboardSettings(api_url="http://c", token="gpr_000000000000_configured-token-xxxxx"),
                         {"Authorization": "Basic bWU6Z3ByXzEyMzQ1Njc4OWFiY19zZWNyZXQ="})
    assert seen["authorization"] == "Basic bWU6Z3ByXzEyMzQ1Njc4OWFiY19zZWNyZXQ="


def test_without_one_the_configured_token_is_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOODPUT_DASHBOARD_TOKEN", "gpr_000000000000_configured-token-xxxxx")
    config = DashboardSettings(api_url="http://c")
    assert "configured-token" not in repr(config)
    assert _headers_sent(config, {})["authorization"] == "Bearer gpr_000000000000_configured-token-xxxxx"


def test_no_credential_at_all_sends_none() -> None:
    assert "authorization" not in _headers_sent(DashboardSettings(api_url="http://c", token=None), {})


def test_a_refused_credential_is_explained_on_the_page() -> None:
    api = ApiClient("http://c", http=httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(
        401, json={"error": {"message": "token x was revoked"}}))))
    with pytest.raises(AccessDenied) as refused:
        api.runs()
    assert data.explain(refused.value) == "The collector refused the dashboard's credential: token x was revoked"
