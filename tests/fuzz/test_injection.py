"""SQL and HTML injection through run ids and hosts: stored and shown verbatim, escaped wherever it is HTML.

The run id and the hosts below are legal (printable, within the length caps), so the collector must take them,
keep them byte for byte, and never let them act as SQL, HTML or script: not in the API, not in the HTML report,
not on the dashboard (tests/dashboards/test_injection_browser.py).
"""

from __future__ import annotations

import csv
import io
from typing import Any
from urllib.parse import quote

from fastapi.testclient import TestClient

from services.simulate import SimConfig, simulate

RUN_ID = "<img src=x onerror=alert(1)>'; DROP TABLE runs; --\"é"
HOST = "<script>alert('host')</script>"


def _events(run_id: str = RUN_ID) -> list[dict[str, Any]]:
    result = simulate(SimConfig(run_id=run_id, ranks=4, hours=0.05, mtbf_s=None, straggler_rank=2,
                                start_time=1_700_000_000.0, seed=3))
    return [{**e, "host": HOST} if "host" in e else e for e in result.events]


def test_injection_strings_are_data_in_the_api_and_escaped_in_the_html_report(client: TestClient) -> None:
    assert client.post("/v1/events", json={"events": _events()}).status_code == 200
    assert client.post("/v1/events", json={"events": _events("plain-run")}).status_code == 200
    runs = {r["run_id"] for r in client.get("/v1/runs").json()["runs"]}
    assert runs == {RUN_ID, "plain-run"}  # both tables intact, the id kept byte for byte
    assert client.get(f"/v1/runs/{quote(RUN_ID, safe='')}").json()["run_id"] == RUN_ID
    stragglers = client.get(f"/v1/runs/{quote(RUN_ID, safe='')}/ranks").json()
    assert HOST in str(stragglers)

    html = client.get(f"/v1/runs/{quote(RUN_ID, safe='')}/report", params={"format": "html"}).text
    for raw in ("<img src=x", "<script>alert(", "</script><script>"):
        assert raw not in html, raw
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
    csv_text = client.get(f"/v1/runs/{quote(RUN_ID, safe='')}/report", params={"format": "csv"}).text
    assert list(csv.reader(io.StringIO(csv_text)))  # parses: quotes in the id do not break the CSV
    fleet = list(csv.DictReader(io.StringIO(client.get("/v1/reports/fleet.csv").text)))
    assert RUN_ID in {row["run_id"] for row in fleet}
