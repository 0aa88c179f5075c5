"""One advice, everywhere: for the same run, `GET /v1/runs/{id}/advice`, `goodput advise --json`, `goodput advise`,
the JSON report and the HTML report carry the same recommendations, numbers and wording (the engine's text)."""

from __future__ import annotations

import html
import json
import re
from typing import Any

import pytest

from services.api_client import ApiClient
from services.cli.advice import MAX_WIDTH, print_advice
from services.presentation import advice_stake, percent
from services.schemas.advice import RunAdvice
from services.simulate import SimConfig, simulate

pytestmark = pytest.mark.filterwarnings("ignore:You should not use the 'timeout' argument with the TestClient")

RUNS: dict[str, dict[str, Any]] = {  # the kinds of run of issue 13, small
    "restarts": {"ranks": 8, "hours": 0.15, "mtbf_s": 240.0, "checkpoint_every": 200, "seed": 1},
    "straggler": {"ranks": 8, "hours": 0.08, "mtbf_s": None, "straggler_rank": 5, "seed": 2},
    "hang": {"ranks": 8, "hours": 0.08, "mtbf_s": None, "hang_at_step": 150, "hang_s": 900.0, "seed": 3},
    "healthy": {"ranks": 8, "hours": 0.08, "mtbf_s": None, "seed": 4},
    "idle-gpus": {"ranks": 24, "gpus": 32, "hours": 0.04, "mtbf_s": 150.0, "end": "failed", "max_failures": 1,
                  "checkpoint_every": 30, "seed": 5},
}


def post(client: Any, events: list[dict[str, Any]]) -> None:
    for i in range(0, len(events), 500):
        response = client.post("/v1/events", json={"events": events[i:i + 500]})
        assert response.status_code == 200, response.text


def words(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def texts_of(advice: RunAdvice) -> list[str]:
    """Every sentence and figure of the advice that a surface prints."""
    out = [advice.measured.text, *advice.notes]
    for rec in advice.recommendations:
        out += [rec.title, rec.wording, rec.prediction, rec.confidence.text, rec.model.statement, advice_stake(rec)]
        out += [e.text for e in rec.evidence]
    return out


@pytest.fixture
def runs(client: Any) -> Any:
    for run_id, config in RUNS.items():
        post(client, simulate(SimConfig(run_id=run_id, **config)).events)
    return client


def test_every_surface_shows_the_same_advice(runs: Any, capsys: pytest.CaptureFixture[str]) -> None:
    api = ApiClient("http://testserver", http=runs)  # the CLI's own client, over the test app
    seen: dict[str, set[str]] = {}
    for run_id in RUNS:
        served = runs.get(f"/v1/runs/{run_id}/advice")
        assert served.status_code == 200, served.text
        document = served.json()
        advice = RunAdvice.model_validate(document)
        seen[run_id] = {r.code for r in advice.recommendations}

        report = runs.get(f"/v1/runs/{run_id}/report", params={"format": "json"}).json()
        assert report["measured"] == document["measured"]
        assert report["recommendations"] == document["recommendations"]
        assert report["advice_notes"] == document["notes"]

        assert print_advice(api, run_id, as_json=True) == 0
        assert json.loads(capsys.readouterr().out) == document

        assert print_advice(api, run_id) == 0
        printed = capsys.readouterr().out
        assert all(len(line) <= MAX_WIDTH for line in printed.splitlines())  # fits the terminal
        page = html.unescape(runs.get(f"/v1/runs/{run_id}/report", params={"format": "html"}).text)
        for text in texts_of(advice):
            assert words(text) in words(printed), (run_id, text)
            assert text in page, (run_id, text)
        for n, rec in enumerate(advice.recommendations, 1):
            assert f"{n}. {rec.title}" in printed  # in the API's order

    assert "straggler_rank" in seen["straggler"]
    assert "hang_timeout" in seen["hang"]
    assert "unused_gpus" in seen["idle-gpus"]
    assert "checkpoint_interval" not in seen["healthy"]  # other runs failed; this one did not


def test_the_idle_gpu_run_is_told_8_of_32_gpus_were_never_used(runs: Any) -> None:
    advice = RunAdvice.model_validate(runs.get("/v1/runs/idle-gpus/advice").json())
    (rec,) = [r for r in advice.recommendations if r.code == "unused_gpus"]
    assert rec.title == "8 of 32 GPUs never used"
    ledger = runs.get("/v1/runs/idle-gpus/waste").json()
    allocated, productive = ledger["allocated_gpu_seconds"], ledger["productive_gpu_seconds"]
    wall = sum(a["end"] - a["start"] for a in ledger["allocations"])
    assert rec.gain.gpu_seconds == pytest.approx(8 * wall)  # 8 GPUs idle for the whole allocation
    assert rec.gain.predicted_goodput == pytest.approx(productive / (allocated - 8 * wall))
    assert rec.prediction.startswith(f"Measured goodput {percent(productive / allocated)} -> "
                                     f"{percent(productive / (allocated - 8 * wall))} if only the 24 GPUs")


def test_a_live_run_gone_silent_is_told_to_stop_first_everywhere(client: Any) -> None:
    from tests.collector.test_live_api import running_sim

    post(client, running_sim("silent", stopped_ago_s=120.0))  # hung: its hang so far grows with the clock
    advice = RunAdvice.model_validate(client.get("/v1/runs/silent/advice").json())
    report = client.get("/v1/runs/silent/report", params={"format": "json"}).json()
    assert advice.recommendations[0].code == report["recommendations"][0]["code"] == "hung_now"
    assert advice.recommendations[0].title == report["recommendations"][0]["title"] == "The run is hung now: stop it"
    assert [r.code for r in advice.recommendations] == [r["code"] for r in report["recommendations"]]
    assert advice.recommendations[0].wording.startswith("No progress for 2 min")  # the figures grow between reads


def test_the_startup_parts_and_failure_causes_read_the_same_on_every_surface(
        client: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from dashboards.components.advice_panel import advice_panel
    from tests.analysis.test_advice_parts_and_causes import failing_run
    from tests.dashboards.test_run_page_parts import flat_text

    post(client, failing_run([(5, -9), (5, -9), (2, -9)]))  # 2 of 3 failures on node1 (rank 5), all SIGKILL
    advice = RunAdvice.model_validate(client.get("/v1/runs/failing/advice").json())
    (rec,) = [r for r in advice.recommendations if r.code == "startup"]
    assert rec.title == "Cut the startup's largest parts: relaunch, before the first step"
    assert "began on host node1 (rank 5)" in rec.wording and "all 3 were killed by SIGKILL" in rec.wording
    assert print_advice(ApiClient("http://testserver", http=client), "failing") == 0
    printed = words(capsys.readouterr().out)
    report = html.unescape(client.get("/v1/runs/failing/report", params={"format": "html"}).text)
    panel = words(flat_text(advice_panel(advice)))
    for text in (rec.title, rec.wording, rec.prediction, *(e.text for e in rec.evidence)):
        assert words(text) in printed and text in report and words(text) in panel, text
