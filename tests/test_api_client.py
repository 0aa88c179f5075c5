"""services.api_client: typed answers, one credential header, and every failure as one exception tree."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from services.api_client import (
    AccessDenied,
    ApiClient,
    ApiStatusError,
    CollectorUnreachable,
    NotFound,
    UnexpectedAnswer,
    bearer,
)
from tests.dashboards.answers import ledger


def client(handler: Callable[[httpx.Request], httpx.Response], credential: str | None = None) -> ApiClient:
    http = httpx.Client(transport=httpx.MockTransport(handler))
    return ApiClient("http://collector/", credential=credential, http=http)


def answering(status: int, body: Any) -> ApiClient:
    return client(lambda request: httpx.Response(status, json=body))


def test_the_ledger_comes_back_as_the_typed_ledger_it_was_served_as() -> None:
    served = ledger(run_id="team/run 1", allocated_gpu_seconds=10.0, productive_gpu_seconds=10.0, goodput=1.0,
                    straggler_gpu_seconds_by_rank={3: 1.5})
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(200, json=served.model_dump(mode="json"))

    got = client(handler).ledger("team/run 1", project="p")
    assert got == served
    assert seen == ["http://collector/v1/runs/team%2Frun%201/waste?project=p"]


def test_the_credential_is_one_header_and_a_client_with_another_shares_the_connections() -> None:
    sent: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request.headers.get("Authorization"))
        return httpx.Response(200, json={"runs": [], "count": 0})

    api = client(handler, credential=bearer("gpr_x"))
    api.runs(status=None, project="")
    api.with_credential("Basic abc").runs()
    api.with_credential(bearer(None)).runs()
    assert sent == ["Bearer gpr_x", "Basic abc", None]


def test_the_error_envelope_becomes_an_exception_with_its_code_message_and_details() -> None:
    envelope = {"error": {"code": "run_in_several_projects", "message": "say which", "run_id": "r",
                          "projects": ["a", "b"]}}
    with pytest.raises(ApiStatusError) as refused:
        answering(409, envelope).ledger("r")
    error = refused.value
    assert (error.status, error.code, error.message) == (409, "run_in_several_projects", "say which")
    assert error.details == {"run_id": "r", "projects": ["a", "b"]}
    assert error.path == "/v1/runs/r/waste"
    assert str(error) == "the collector answered 409: say which"


@pytest.mark.parametrize(("status", "kind"), [(401, AccessDenied), (403, AccessDenied), (404, NotFound),
                                              (503, ApiStatusError)])
def test_each_status_has_its_exception(status: int, kind: type[ApiStatusError]) -> None:
    with pytest.raises(kind) as refused:
        answering(status, {"error": {"code": "x", "message": "no"}}).live("r")
    assert type(refused.value) is kind and refused.value.message == "no"


def test_an_answer_without_an_envelope_is_reported_with_its_text() -> None:
    api = client(lambda request: httpx.Response(502, text="<html>Bad Gateway</html>"))
    with pytest.raises(ApiStatusError, match="answered 502: <html>Bad Gateway</html>") as refused:
        api.runs()
    assert refused.value.code == ""


def test_an_answer_the_api_does_not_document_is_unexpected() -> None:
    with pytest.raises(UnexpectedAnswer, match="not what the collector's API documents") as wrong:
        answering(200, {"hello": "world"}).ledger("r")
    assert wrong.value.__cause__ is not None
    with pytest.raises(UnexpectedAnswer):
        client(lambda request: httpx.Response(200, text="<html>a login page</html>")).runs()


def test_nothing_listening_says_to_start_goodput_serve() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: nothing listens there
    with pytest.raises(CollectorUnreachable, match="Start it with `goodput serve`") as unreachable:
        ApiClient(f"http://127.0.0.1:{port}").runs()
    assert f"127.0.0.1:{port}" in str(unreachable.value)
    assert isinstance(unreachable.value.__cause__, httpx.ConnectError)


def test_a_collector_that_does_not_answer_in_time_is_unreachable_too() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    with pytest.raises(CollectorUnreachable, match="did not answer in time"):
        client(handler).runs()


def test_a_pending_resume_check_is_none_and_documents_come_back_as_bytes() -> None:
    assert answering(202, {"error": {"code": "resume_check_pending", "message": "later"}}).resume_check("r") is None
    assert client(lambda request: httpx.Response(200, text="run_id,project\n")).fleet_report() == b"run_id,project\n"
