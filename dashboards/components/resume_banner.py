"""The run page's resume banner: shown only when GET /v1/runs/{id}/resume-check flagged the run."""

from __future__ import annotations

from typing import Any

from dash import html

MAX_LISTED = 3


def resume_banner(check: dict[str, Any] | None) -> html.Div | None:
    """None when the check is missing or ok; else the findings' codes and the first few messages."""
    if not check or check.get("verdict") != "flagged" or not check.get("findings"):
        return None
    findings = check["findings"]
    codes = ", ".join(sorted({str(f["code"]) for f in findings}))
    items = [html.Li(f"{f['code']}: {f['message']}") for f in findings[:MAX_LISTED]]
    if len(findings) > MAX_LISTED:
        items.append(html.Li(f"… and {len(findings) - MAX_LISTED} more (GET /v1/runs/{{id}}/resume-check)"))
    return html.Div(className="live live-hung", id="run-resume-banner", children=[
        html.B("A restart did not resume this run exactly. "),
        html.Span(f"{len(findings)} finding(s): {codes}. Steps trained since then may differ from the run that "
                  "was checkpointed (optimizer buffers, RNG state, data position or step counter not restored?)."),
        html.Ul(items),
    ])
