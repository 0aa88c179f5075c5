"""`goodput runs`: worst first by wasted GPU time, a waste column, filters passed to the API, --json."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from services import presentation as fmt
from services.api_client import ApiClient
from services.cli import main
from services.presentation import CATEGORIES
from services.schemas.runs import RunList
from tests.dashboards.answers import run_item

WASTE = dict.fromkeys(CATEGORIES, 0.0)
RUNS = [  # (run, allocated, waste by category): listed by the API most recent first
    run_item(run_id="recent-healthy", allocated_gpu_seconds=36_000.0, productive_gpu_seconds=34_200.0,
             goodput=0.95, waste_gpu_seconds=WASTE | {"startup": 1_800.0}, last_time=300.0),
    run_item(run_id="bert-16gpu-hang", project="nlp", status="failed", allocated_gpu_seconds=72_000.0,
             productive_gpu_seconds=51_192.0, goodput=51_192.0 / 72_000.0,
             waste_gpu_seconds=WASTE | {"hang": 18_000.0, "startup": 2_808.0}, last_time=200.0),
    run_item(run_id="idle-32", allocated_gpu_seconds=115_200.0, productive_gpu_seconds=86_400.0,
             goodput=0.75, waste_gpu_seconds=WASTE | {"idle": 28_800.0}, last_time=100.0),
]


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[httpx.Request]:
    """Every request the CLI sends, answered with RUNS."""
    requests: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return httpx.Response(200, json=RunList(runs=RUNS, count=len(RUNS)).model_dump(mode="json"))

    real = ApiClient.__init__

    def mocked(self: ApiClient, base_url: str, **kwargs: Any) -> None:
        real(self, base_url, **{**kwargs, "http": httpx.Client(transport=httpx.MockTransport(answer))})

    monkeypatch.setattr(ApiClient, "__init__", mocked)
    return requests


def test_runs_are_listed_worst_first_with_their_waste(asked: list[httpx.Request],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", "--url", "http://c"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["run", "project", "status", "GPU-h", "wasted", "goodput", "biggest", "waste"]
    assert [line.split()[0] for line in lines[1:]] == ["idle-32", "bert-16gpu-hang", "recent-healthy"]
    worst = lines[1].split()
    assert worst[3:] == [fmt.gpu_hours(115_200.0, unit=False), fmt.gpu_hours(28_800.0, unit=False), "75.0%",
                         "idle", "25.0%"]
    assert lines[2].split()[3:] == ["20.00", "5.78", "71.1%", "hang", "25.0%"]  # 20,808 GPU-s wasted
    assert max(map(len, lines)) <= 100  # fits a terminal


def test_runs_filters_go_to_the_api(asked: list[httpx.Request], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", "--url", "http://c", "--project", "nlp", "--status", "failed", "--since", "2026-01-31",
                 "--until", "1800000000", "--run-id", "bert"]) == 0
    params = dict(asked[-1].url.params)
    assert params == {"project": "nlp", "status": "failed", "since": "1769817600.0", "until": "1800000000.0",
                      "run_id": "bert"}
    before = time.time()
    assert main(["runs", "--url", "http://c", "--last", "24h", "--limit", "1"]) == 0
    assert float(asked[-1].url.params["since"]) == pytest.approx(before - 86_400, abs=5)
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()[-1:]] == ["idle-32"]
    with pytest.raises(SystemExit, match="--last must be a positive number and a unit"):
        main(["runs", "--url", "http://c", "--last", "yesterday"])


def test_runs_as_json_are_worst_first_with_the_wasted_gpu_seconds(asked: list[httpx.Request],
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", "--url", "http://c", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["count"] == 3
    assert [(r["run_id"], r["wasted_gpu_seconds"]) for r in document["runs"]] == [
        ("idle-32", 28_800.0), ("bert-16gpu-hang", 20_808.0), ("recent-healthy", 1_800.0)]
    assert RunList.model_validate(document).runs[1] == RUNS[1]  # the API's rows, reordered, plus one figure
