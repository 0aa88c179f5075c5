"""`goodput runs`: worst first by wasted GPU time, a waste column, filters passed to the API, --json."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from services import presentation as fmt
from services.api_client import ApiClient
from services.cli import main
from services.presentation import CATEGORIES
from services.schemas.fleet import FleetWindow, RunInWindow, WindowFigures
from services.schemas.ledger import WasteBreakdown
from services.schemas.live import LiveRuns
from services.schemas.runs import RunList
from tests.dashboards.answers import live_run, run_item

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
SERVER_TIME = 1_000.0
# recent-healthy is running and hung: 400 s without progress
LIVE = LiveRuns(server_time=SERVER_TIME, hung=1, runs=[live_run(run_id="recent-healthy", hung=True, possibly_hung=True,
                                                               seconds_since_progress=400.0)])


def window_of(runs: list[Any]) -> FleetWindow:
    """/v1/fleet/window's answer: each run with a quarter of its figures inside the range."""
    cut = [RunInWindow(run=r, laid_out=True, buckets={}, window=WindowFigures(
        allocated_gpu_seconds=r.allocated_gpu_seconds / 4, productive_gpu_seconds=r.productive_gpu_seconds / 4,
        waste_gpu_seconds=WasteBreakdown(**{k: v / 4 for k, v in r.waste_gpu_seconds.items()}),
        goodput=r.goodput)) for r in runs]
    return FleetWindow(since=None, until=SERVER_TIME, bucket_start=0.0, bucket_s=1.0, bucket_count=1,
                       server_time=SERVER_TIME, runs=cut)


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[httpx.Request]:
    """Every request the CLI sends, answered with RUNS."""
    requests: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        document = {"/v1/live": LIVE, "/v1/fleet/window": window_of(RUNS)}.get(
            request.url.path, RunList(runs=RUNS, count=len(RUNS)))
        return httpx.Response(200, json=document.model_dump(mode="json"))

    real = ApiClient.__init__

    def mocked(self: ApiClient, base_url: str, **kwargs: Any) -> None:
        real(self, base_url, **{**kwargs, "http": httpx.Client(transport=httpx.MockTransport(answer))})

    monkeypatch.setattr(ApiClient, "__init__", mocked)
    return requests


def test_runs_are_listed_worst_first_with_their_waste(asked: list[httpx.Request],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", "--url", "http://c"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["run", "project", "status", "GPU-h", "wasted", "goodput", "biggest", "waste", "last",
                                "progress"]
    assert [line.split()[0] for line in lines[1:]] == ["idle-32", "bert-16gpu-hang", "recent-healthy"]
    worst = lines[1].split()
    in_hours = fmt.GPU_HOURS
    assert worst[3:] == [fmt.gpu_time(115_200.0, in_hours, with_unit=False),
                         fmt.gpu_time(28_800.0, in_hours, with_unit=False), "75.0%",
                         "idle", "25.0%", "15", "min", "00", "s", "ago"]  # its last event: 900 s before now
    assert lines[2].split()[3:8] == ["20.00", "5.78", "71.1%", "hang", "25.0%"]  # 20,808 GPU-s wasted
    assert lines[3].endswith("6 min 40 s ago, hung")  # the live status: 400 s without progress, hung
    assert max(map(len, lines)) <= 120


def test_runs_filters_go_to_the_api(asked: list[httpx.Request], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", "--url", "http://c", "--project", "nlp", "--status", "failed", "--since", "2026-01-31",
                 "--until", "1800000000", "--run-id", "bert"]) == 0
    assert asked[-1].url.path == "/v1/fleet/window"  # a range: the dashboard's endpoint, figures cut to it
    params = dict(asked[-1].url.params)
    assert params == {"project": "nlp", "status": "failed", "since": "1769817600.0", "until": "1800000000.0",
                      "run_id": "bert", "buckets": "1"}
    assert main(["runs", "--url", "http://c", "--last", "24h", "--limit", "1"]) == 0
    assert float(asked[-1].url.params["since"]) == SERVER_TIME - 86_400  # on the collector's clock
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out[-1:]] == ["idle-32"]
    assert out[-1].split()[3:5] == ["8.00", "2.00"]  # a quarter of 32.00 and 8.00 GPU-h: inside the range only
    with pytest.raises(SystemExit, match="--last: a duration is a positive number and a unit"):
        main(["runs", "--url", "http://c", "--last", "yesterday"])


def test_runs_as_json_are_worst_first_with_the_wasted_gpu_seconds(asked: list[httpx.Request],
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", "--url", "http://c", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["count"] == 3
    assert [(r["run_id"], r["wasted_gpu_seconds"]) for r in document["runs"]] == [
        ("idle-32", 28_800.0), ("bert-16gpu-hang", 20_808.0), ("recent-healthy", 1_800.0)]
    assert RunList.model_validate(document).runs[1] == RUNS[1]  # the API's rows, reordered, plus one figure
