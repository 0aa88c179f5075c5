"""Every report format against GET /v1/runs/{run_id}/waste for the same run, on SQLite and PostgreSQL."""

from __future__ import annotations

import io
import json
import re
import time
from typing import Any

import pandas as pd
import pytest

from services.presentation import gpu_seconds, gpu_time, gpu_time_unit, percent
from services.simulate import SimConfig, simulate

CATEGORIES = ["productive", "eval", "startup", "checkpoint", "rework", "hang", "straggler", "idle", "allocated"]


def send(client: Any, run_id: str, start_time: float, **kw: Any) -> None:
    config = SimConfig(run_id=run_id, ranks=4, hours=0.05, mtbf_s=90.0, checkpoint_every=25, seed=2,
                       start_time=start_time, **kw)
    response = client.post("/v1/events", json={"events": simulate(config).events})
    assert response.status_code == 200, response.text


def test_json_report_carries_the_api_ledger_unchanged(client) -> None:
    send(client, "rep", time.time() - 7200, straggler_rank=3, hang_at_step=40)
    ledger = client.get("/v1/runs/rep/waste").json()
    response = client.get("/v1/runs/rep/report", params={"format": "json"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    report = response.json()
    assert report["ledger"] == ledger
    assert report["run_id"] == "rep"
    rows = {r["category"]: r for r in report["breakdown"]}
    assert list(rows) == CATEGORIES
    assert rows["allocated"]["gpu_seconds"] == ledger["allocated_gpu_seconds"]
    assert rows["productive"]["gpu_seconds"] == ledger["productive_gpu_seconds"]
    for category, gpu_s in ledger["waste_gpu_seconds"].items():
        assert rows[category]["gpu_seconds"] == gpu_s
        assert rows[category]["share"] == pytest.approx(gpu_s / ledger["allocated_gpu_seconds"], rel=1e-12)
    assert sum(r["gpu_seconds"] for c, r in rows.items() if c != "allocated") == \
        pytest.approx(ledger["allocated_gpu_seconds"], rel=1e-9)
    assert len(report["restarts"]) == ledger["restarts"]
    assert report["checkpoints"]["summary"] == ledger["checkpoints"]
    assert report["stragglers"][0]["rank"] == 3 and report["stragglers"][0]["host"]
    codes = {r["code"] for r in report["recommendations"]}
    assert "straggler_rank" in codes and "hang_timeout" in codes
    assert report["recommendations"] == client.get("/v1/runs/rep/advice").json()["recommendations"]
    run_detail = client.get("/v1/runs/rep").json()  # the report never changed the run
    assert run_detail["goodput"] == ledger["goodput"]


def test_csv_report_loads_in_pandas_with_one_row_per_category(client) -> None:
    send(client, "rep-csv", time.time() - 7200, straggler_rank=1)
    ledger = client.get("/v1/runs/rep-csv/waste").json()
    response = client.get("/v1/runs/rep-csv/report", params={"format": "csv"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/csv")
    assert 'filename="rep-csv-report.csv"' in response.headers["content-disposition"]
    table = pd.read_csv(io.StringIO(response.text))
    assert list(table.columns[:6]) == ["run_id", "section", "category", "gpu_seconds", "gpu_hours", "share"]
    frame = table[table["section"] == "ledger"]
    assert list(frame["category"]) == CATEGORIES
    assert set(frame["run_id"]) == {"rep-csv"}
    by = frame.set_index("category")
    allocated = ledger["allocated_gpu_seconds"]
    expected = {"productive": ledger["productive_gpu_seconds"], **ledger["waste_gpu_seconds"], "allocated": allocated}
    for category, gpu_s in expected.items():
        assert by.loc[category, "gpu_seconds"] == round(gpu_s, 2)  # rounded to 0.01 GPU-s, no float noise
        assert by.loc[category, "gpu_hours"] == round(gpu_s / 3600, 6)
        assert by.loc[category, "share"] == round(gpu_s / allocated, 6)
    for line in response.text.splitlines()[1:]:  # no raw float tails such as 33.06666564941406
        assert all(len(cell.partition(".")[2]) <= 6 for cell in line.split(",")[2:] if ":" not in cell), line
    assert by.loc["allocated", "share"] == 1.0
    # besides the ledger: every attempt, checkpoint and rank of the run, as the API serves them
    attempts = table[table["section"] == "attempt"]
    assert list(attempts["attempt"]) == [a["attempt"] for a in ledger["attempts"]]
    assert list(attempts["world_size"]) == [a["world_size"] for a in ledger["attempts"]]
    assert list(attempts["steps_kept"]) == [a["steps_kept"] for a in ledger["attempts"]]
    assert list(attempts["outcome"].fillna("")) == [a["reason"] or ("failed" if a["failed"] else "")
                                                    for a in ledger["attempts"]]
    views = client.get("/v1/runs/rep-csv/view").json()
    checkpoints = table[table["section"] == "checkpoint"]
    assert len(checkpoints) == views["checkpoints_total"] > 0
    assert list(checkpoints["step"]) == [c["step"] for c in views["checkpoints"]]
    assert list(checkpoints["blocking_seconds"]) == [round(c["blocking_seconds"], 2) for c in views["checkpoints"]]
    ranks = table[table["section"] == "rank"].set_index("rank")
    rows = {r["rank"]: r for r in views["ranks"]["rows"]}
    assert ranks.index[0] == 1 and len(ranks) == len(rows)  # the straggler first, every rank of the run
    for rank, row in ranks.iterrows():
        assert row["host"] == rows[rank]["host"]
        assert row["straggler_gpu_seconds"] == round(rows[rank]["straggler_gpu_seconds"], 2)
        assert row["median_compute_seconds"] == round(rows[rank]["median_compute_s"], 6)


def test_html_report_loads_plotly_from_the_collector_or_inlines_it_when_asked(client) -> None:
    send(client, "rep-small", time.time() - 7200, straggler_rank=2, hang_at_step=30)
    response = client.get("/v1/runs/rep-small/report", params={"format": "html"})
    page = response.text
    (src,) = re.findall(r'<script[^>]+src="([^"]+)"', page)  # one script, from the collector that served the page
    assert src == "http://testserver/v1/assets/plotly.min.js" and "Plotly.newPlot" in page
    assert "plotly.js v" not in page and len(response.content) < 200_000  # not the 4.9 MB of an inlined plotly.js
    script = client.get(src)
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
    assert script.text.startswith("/**") and "plotly.js v" in script.text[:200]
    inlined = client.get("/v1/runs/rep-small/report", params={"format": "html", "self_contained": "true"})
    assert re.search(r"<script[^>]+src=", inlined.text) is None and inlined.text.count("plotly.js v") >= 1
    assert len(inlined.content) > len(response.content) + len(script.content) * 0.9


def test_html_report_is_self_contained_and_shows_the_ledgers_numbers(client) -> None:
    send(client, "rep-html", time.time() - 7200, straggler_rank=2, hang_at_step=30)
    ledger = client.get("/v1/runs/rep-html/waste").json()
    response = client.get("/v1/runs/rep-html/report", params={"format": "html", "self_contained": "true"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    page = response.text
    assert re.search(r"<script[^>]+src=", page) is None  # no external script
    assert re.search(r"<link[^>]+href=", page) is None  # no external stylesheet or font
    assert page.count("plotly.js v") >= 1 and "Plotly.newPlot" in page  # plotly.js inlined, figures drawn by it
    assert percent(ledger["goodput"]) in page
    unit = gpu_time_unit(ledger["allocated_gpu_seconds"])  # one unit for the run, by the size of its allocation
    assert gpu_time(ledger["allocated_gpu_seconds"], unit) in page
    assert f"<th>{unit.title.replace('-', '&#8209;')}</th>" in page
    for category, gpu_s in ledger["waste_gpu_seconds"].items():
        assert f"<td>{gpu_seconds(gpu_s)}</td><td>{gpu_time(gpu_s, unit, with_unit=False)}</td>" in page, category
    assert "@media print" in page
    assert "rep-html" in page


def test_report_of_an_unknown_run_is_a_404(client) -> None:
    for fmt in ("json", "csv", "html"):
        response = client.get("/v1/runs/nope/report", params={"format": fmt})
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "run_not_found"
    # the run is resolved first (a 404 says nothing about the parameters); an unknown format of a run is a 422
    assert client.get("/v1/runs/x/report", params={"format": "pdf"}).status_code == 404
    client.post("/v1/events", json={"events": [{"event_id": "e", "run_id": "x", "kind": "run_submitted",
                                                "time": time.time()}]})
    assert client.get("/v1/runs/x/report", params={"format": "pdf"}).status_code == 422


def test_fleet_csv_has_one_row_per_run_and_filters_by_time(client) -> None:
    now = time.time()
    send(client, "week-ago", now - 7 * 86400)
    send(client, "day-ago", now - 86400)
    send(client, "hour-ago", now - 3600, end="failed", max_failures=1)
    response = client.get("/v1/reports/fleet.csv")
    assert response.status_code == 200
    frame = pd.read_csv(io.StringIO(response.text))
    assert set(frame["run_id"]) == {"week-ago", "day-ago", "hour-ago"}
    for row in frame.itertuples():
        ledger = client.get(f"/v1/runs/{row.run_id}/waste").json()
        assert row.allocated_gpu_seconds == round(ledger["allocated_gpu_seconds"], 2)
        assert row.goodput == round(ledger["goodput"], 6)
        assert row.hang_gpu_seconds == round(ledger["waste_gpu_seconds"]["hang"], 2)
        assert row.restarts == ledger["restarts"]
        assert row.status == ledger["status"]
        assert pd.Timestamp(str(row.last_time_utc)).timestamp() == pytest.approx(ledger["latest_time"], abs=1e-3)

    def runs(**params: Any) -> set[str]:
        text = client.get("/v1/reports/fleet.csv", params=params).text
        return set(pd.read_csv(io.StringIO(text))["run_id"]) if text.count("\n") > 1 else set()

    assert runs(since=now - 2 * 86400) == {"day-ago", "hour-ago"}
    assert runs(until=now - 3 * 86400) == {"week-ago"}
    assert runs(status="failed") == {"hour-ago"}
    assert runs(since=now + 86400) == set()


def test_report_json_round_trips_through_a_file(client, tmp_path) -> None:
    send(client, "rep-file", time.time() - 7200)
    path = tmp_path / "r.json"
    path.write_bytes(client.get("/v1/runs/rep-file/report").content)
    assert json.loads(path.read_text())["ledger"] == client.get("/v1/runs/rep-file/waste").json()
