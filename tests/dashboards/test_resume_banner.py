"""The run page's resume banner and the API call behind it."""

from __future__ import annotations

import httpx

from dashboards.components.resume_banner import resume_banner
from services.api_client import ApiClient
from tests.dashboards.answers import resume_check


def flat_text(component) -> str:
    if component is None:
        return ""
    if isinstance(component, str):
        return component
    children = getattr(component, "children", None)
    if isinstance(children, list | tuple):
        return "".join(flat_text(c) for c in children)
    return flat_text(children)


def test_no_banner_for_an_ok_or_missing_check() -> None:
    assert resume_banner(None) is None
    assert resume_banner(resume_check("ok", [])) is None


def test_a_flagged_check_names_its_findings() -> None:
    findings = [{"code": "loss_mismatch", "message": f"attempt 1, message {i}"} for i in range(5)]
    banner = resume_banner(resume_check("flagged", findings))
    assert banner is not None and banner.to_plotly_json()["props"]["id"] == "run-resume-banner"
    text = flat_text(banner)
    assert "5 finding(s): loss_mismatch" in text and "message 0" in text and "message 2" in text
    assert "message 3" not in text and "2 more" in text


def test_an_unverified_check_says_so_with_the_reason() -> None:
    reason = "attempt 1 resumed from step 250: no recomputed step and no digest at load arrived"
    check = resume_check("ok", []).model_copy(update={"verdict": "unverified", "reason": reason})
    banner = resume_banner(check)
    assert banner is not None and banner.to_plotly_json()["props"]["id"] == "run-resume-banner"
    text = flat_text(banner)
    assert text.startswith("Unverified: a restart of this run could not be checked.") and reason in text
    assert "tracker.resumed(step, digest=...)" in text


def test_the_api_client_asks_the_resume_check_endpoint_without_waiting_for_it() -> None:
    seen: list[str] = []
    pending = {"error": {"code": "resume_check_pending", "message": "being computed"}}

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.raw_path.decode())
        if len(seen) == 1:
            return httpx.Response(202, json=pending)
        return httpx.Response(200, json=resume_check("ok", []).model_dump(mode="json"))

    api = ApiClient("http://collector", http=httpx.Client(transport=httpx.MockTransport(handler)))
    assert api.resume_check("team/run 1") is None  # the first check of a big run is still running
    check = api.resume_check("team/run 1")
    assert check is not None and check.verdict == "ok"
    assert seen == ["/v1/runs/team%2Frun%201/resume-check?stale_ok=true"] * 2
