"""The CLI's tables read like the dashboard (services.presentation), and a failing API call is one line and exit 1."""

from __future__ import annotations

import json
import socket
from typing import Any

import httpx
import pytest

from services import presentation as fmt
from services.api_client import ApiClient
from services.cli import main
from services.cli.output import print_ledger
from services.presentation import CATEGORIES
from tests.dashboards.answers import ledger


def printed_ledger(capsys: pytest.CaptureFixture[str], **figures: Any) -> list[str]:
    """`goodput ledger r`'s lines for a served ledger of these figures."""
    served = ledger(run_id="r", status="finished", **figures)
    api = ApiClient("http://c", http=httpx.Client(transport=httpx.MockTransport(
        lambda request: httpx.Response(200, json=served.model_dump(mode="json")))))
    assert print_ledger(api, "r") == 0
    return capsys.readouterr().out.splitlines()


def test_the_ledger_table_writes_gpu_hours_and_shares_as_the_dashboard_does(capsys: pytest.CaptureFixture[str]) -> None:
    waste = dict.fromkeys(CATEGORIES, 0.0) | {"startup": 12.0, "rework": 7_200_000.0}
    lines = printed_ledger(capsys, allocated_gpu_seconds=7_212_012.0, productive_gpu_seconds=12_000.0,
                           waste_gpu_seconds=waste, goodput=12_000.0 / 7_212_012.0, restarts=1, queue_seconds=125.0)
    assert lines[0] == "run r  status finished  restarts 1  queue 2 min 05 s"
    assert lines[1].split() == ["GPU-seconds", "GPU-hours", "share"]
    rows = {line.split()[0]: line for line in lines[2:-1]}
    # a sliver is written in its own unit, never "<0.01"
    assert rows["startup"].split() == ["startup", fmt.gpu_seconds(12.0), "12.0", "GPU-s", fmt.share(12.0, 7_212_012.0)]
    assert rows["rework"].split() == ["rework", "7,200,000", "2,000.00", "99.8%"]
    assert len(rows["rework"]) == len(lines[1])  # the columns line up under their headers
    assert lines[-1] == f"goodput {fmt.percent(12_000.0 / 7_212_012.0)}"


def test_a_small_runs_ledger_table_has_one_gpu_seconds_column(capsys: pytest.CaptureFixture[str]) -> None:
    waste = dict.fromkeys(CATEGORIES, 0.0) | {"startup": 4.0}
    lines = printed_ledger(capsys, allocated_gpu_seconds=34.0, productive_gpu_seconds=30.0, waste_gpu_seconds=waste,
                           goodput=30.0 / 34.0, restarts=0, queue_seconds=0.0)
    assert lines[1].split() == ["GPU-seconds", "share"]  # not "GPU-seconds GPU-seconds share"
    assert {line.split()[0]: line.split()[1:] for line in lines[2:-1]}["startup"] == ["4", "11.8%"]


def test_a_command_the_collector_cannot_answer_says_why_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["ledger", "r", "--url", f"http://127.0.0.1:{port}"]) == 1
    out = capsys.readouterr().out.strip()
    assert out.startswith(f"goodput ledger: cannot reach the collector at http://127.0.0.1:{port}")
    assert "`goodput serve`" in out and "\n" not in out


def test_advise_prints_the_apis_advice_word_for_word_within_the_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    from services.analysis.advice import AdviceInput
    from services.cli.advice import print_advice
    from services.reports.advice import run_advice
    from tests.reports.ledgers import ledger as made

    served = run_advice(AdviceInput(ledger=made(100_000.0, hang=30_000.0, startup=9_000.0, goodput=0.61)))
    assert [r.code for r in served.recommendations] == ["startup"]  # hang without failed attempts: none to cut
    api = ApiClient("http://c", http=httpx.Client(transport=httpx.MockTransport(
        lambda request: httpx.Response(200, json=served.model_dump(mode="json")))))
    assert print_advice(api, "r", as_json=True) == 0
    assert json.loads(capsys.readouterr().out) == served.model_dump(mode="json")
    assert print_advice(api, "r") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "run r (finished)" and max(map(len, lines)) <= 100
    text = " ".join(line.strip() for line in lines)
    rec = served.recommendations[0]
    for sentence in (served.measured.text, rec.title, rec.wording, rec.prediction, rec.confidence.text):
        assert sentence in text


def test_a_small_runs_ledger_is_in_gpu_minutes_like_its_page(capsys: pytest.CaptureFixture[str]) -> None:
    waste = dict.fromkeys(CATEGORIES, 0.0) | {"startup": 60.0}  # a 2-GPU job of 5 minutes
    served = ledger(run_id="small", status="finished", allocated_gpu_seconds=600.0, productive_gpu_seconds=540.0,
                    waste_gpu_seconds=waste, goodput=0.9)
    api = ApiClient("http://c", http=httpx.Client(transport=httpx.MockTransport(
        lambda request: httpx.Response(200, json=served.model_dump(mode="json")))))
    assert print_ledger(api, "small") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["GPU-seconds", "GPU-minutes", "share"]
    rows = {line.split()[0]: line.split() for line in lines[2:-1]}
    assert rows["allocated"] == ["allocated", "600", "10.0", "100.0%"]
    assert rows["startup"] == ["startup", "60", "1.0", "10.0%"]  # not "<0.01" GPU-hours


@pytest.mark.parametrize("typo", [["advice", "r"], ["advice"], ["ledgr", "r"]])
def test_a_mistyped_command_exits_non_zero_naming_the_commands(typo: list[str],
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(typo)
    assert exited.value.code == 2  # a script that runs `goodput advice` sees it fail
    err = capsys.readouterr().err
    assert f"invalid choice: '{typo[0]}'" in err and "'advise'" in err
