"""The run page's resume banner: shown when GET /v1/runs/{id}/resume-check flagged the run, or could not check a
restart that loaded a checkpoint (unverified)."""

from __future__ import annotations

from dash import html

from services.schemas.resume import ResumeCheck

MAX_LISTED = 3


def resume_banner(check: ResumeCheck | None) -> html.Div | None:
    """None when the check is missing or ok; else the findings' codes and the first few messages, or why the
    restarts could not be checked."""
    if check is not None and check.verdict == "unverified":
        return _unverified(check)
    if check is None or check.verdict != "flagged" or not check.findings:
        return None
    findings = check.findings
    codes = ", ".join(sorted({f.code for f in findings}))
    items = [html.Li(f"{f.code}: {f.message}") for f in findings[:MAX_LISTED]]
    if len(findings) > MAX_LISTED:
        items.append(html.Li(f"… and {len(findings) - MAX_LISTED} more (GET /v1/runs/{{id}}/resume-check)"))
    return html.Div(className="live live-hung", id="run-resume-banner", children=[
        html.B("A restart did not resume this run exactly. "),
        html.Span(f"{len(findings)} finding(s): {codes}. Steps trained since then may differ from the run that "
                  "was checkpointed (optimizer buffers, RNG state, data position or step counter not restored?)."),
        html.Ul(items),
    ])


def _unverified(check: ResumeCheck) -> html.Div:
    reasons = [r.unverified_reason for r in check.resumes if r.unverified_reason] or [check.reason or ""]
    items = [html.Li(reason) for reason in reasons[:MAX_LISTED]]
    if len(reasons) > MAX_LISTED:
        items.append(html.Li(f"… and {len(reasons) - MAX_LISTED} more (GET /v1/runs/{{id}}/resume-check)"))
    return html.Div(className="message message-warning", id="run-resume-banner", children=[
        html.B("Unverified: a restart of this run could not be checked. "),
        html.Span("Nothing it computed could be compared with the run it resumed. Digest the state when you "
                  "checkpoint it and pass the loaded state's digest to tracker.resumed(step, digest=...) to check "
                  "each resume as it loads."),
        html.Ul(items),
    ])
