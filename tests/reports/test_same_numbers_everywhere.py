"""The same run, the same numbers: the API's figures written by services.presentation appear as such in the CLI
(`goodput ledger`, `goodput runs`, `goodput advise`), the HTML report and the dashboard's run page parts; and
`goodput runs --last 1h` cuts runs to the range exactly as the dashboard's "Last hour" does."""

from __future__ import annotations

import html
import json
import time
from typing import Any

import pytest

from dashboards import data
from dashboards.components import run_parts
from services import presentation as fmt
from services.api_client import ApiClient
from services.cli.advice import print_advice
from services.cli.output import RunFilter, print_ledger, print_runs
from services.schemas.advice import RunAdvice
from services.simulate import SimConfig, simulate
from tests.collector.test_live_api import post
from tests.dashboards.test_resume_banner import flat_text

pytestmark = pytest.mark.filterwarnings("ignore:You should not use the 'timeout' argument with the TestClient")


def texts(components: Any) -> str:
    return "".join(flat_text(c) for c in components) if isinstance(components, list) else flat_text(components)


def test_a_first_small_job_reads_the_same_on_every_surface(client: Any, capsys: pytest.CaptureFixture[str]) -> None:
    # a first real job: 4 ranks, steps of ~70 ms, rank 1 slower: figures in GPU-seconds or -minutes, times in ms
    config = SimConfig(run_id="first", ranks=4, hours=0.01, step_s=0.06, comm_s=0.005, startup_s=5.0, mtbf_s=None,
                       checkpoint_every=100, checkpoint_s=0.5, queue_s=0.0, tail_s=1.0, straggler_rank=1,
                       straggler_factor=1.4, seed=5, start_time=time.time() - 600)
    post(client, simulate(config).events)
    api = ApiClient("http://testserver", http=client)
    view = api.view("first")
    ledger, ranks = view.ledger, view.ranks
    allocated = ledger.allocated_gpu_seconds
    unit = fmt.gpu_time_unit(allocated)
    assert unit is not fmt.GPU_HOURS  # a small job: never "0.01 GPU-h"
    allocated_text = fmt.gpu_time(allocated, unit)
    slow = next(r for r in ranks.rows if r.rank == 1)
    median_text = fmt.duration(slow.median_compute_s)
    assert median_text.endswith(" ms")  # 73 ms stays 73 ms, not "0.1 s"

    assert print_ledger(api, "first") == 0
    cli_ledger = capsys.readouterr().out
    allocated_row = next(line.split() for line in cli_ledger.splitlines() if line.startswith("allocated"))
    in_table = fmt.gpu_time(allocated, unit, with_unit=False) if unit is not fmt.GPU_SECONDS else None
    assert allocated_row[1] == fmt.gpu_seconds(allocated) and (in_table is None or allocated_row[2] == in_table)
    assert cli_ledger.count("GPU-seconds") == 1

    assert print_runs(api, RunFilter()) == 0
    runs_line = capsys.readouterr().out.splitlines()[1].split()
    assert runs_line[3] == fmt.gpu_time(allocated, unit, with_unit=False)

    advice = RunAdvice.model_validate(client.get("/v1/runs/first/advice").json())
    assert allocated_text in advice.measured.text
    assert print_advice(api, "first") == 0
    assert allocated_text in capsys.readouterr().out
    evidence = {e.key: e.text for r in advice.recommendations for e in r.evidence}
    assert evidence["rank_1_median_compute_seconds"] == median_text

    report = html.unescape(client.get("/v1/runs/first/report", params={"format": "html"}).text)
    assert f"<td>{fmt.gpu_seconds(allocated)}</td>" in report and advice.measured.text in report
    assert f"<td>{median_text}</td>" in report
    assert "<0.01" not in report and "0.01 GPU-h" not in report

    page = texts(run_parts.kpis(ledger)) + texts(run_parts.straggler_table(ranks, "first", None))
    assert allocated_text in page and median_text in page


def test_runs_last_hour_is_the_dashboards_last_hour(client: Any, capsys: pytest.CaptureFixture[str]) -> None:
    # a 3-hour run on 8 GPUs that ended a minute ago: the last hour holds about a third of it
    config: dict[str, Any] = {"run_id": "long", "ranks": 8, "hours": 3.0, "mtbf_s": None, "checkpoint_every": 500,
                              "seed": 9}
    probe = simulate(SimConfig(**config))
    end = max(max(e["end"]) if isinstance(e.get("end"), list) else e.get("end") or e["time"] for e in probe.events)
    post(client, simulate(SimConfig(**config, start_time=probe.events[0]["time"] + time.time() - 60 - end)).events)
    api = ApiClient("http://testserver", http=client)
    whole = api.runs().runs[0].allocated_gpu_seconds

    started = time.time()
    assert print_runs(api, RunFilter(last="1h"), as_json=True) == 0
    (cli,) = json.loads(capsys.readouterr().out)["runs"]
    since, until = data.time_range("1h", None, None, api.live_runs().server_time)
    dashboard = data.window_frame(api.fleet_window(since=since, until=until)).iloc[0]
    elapsed = time.time() - started
    assert since is not None and until is None  # the last hour ends now

    ends = max(a.end for a in api.ledger("long").allocations)  # the allocation ended about a minute ago
    truth = 8 * (ends - (since - elapsed / 2))  # 8 GPUs from the range's start to the allocation's end
    assert cli["allocated_gpu_seconds"] == pytest.approx(truth, abs=8 * (elapsed + 1))
    assert cli["allocated_gpu_seconds"] == pytest.approx(dashboard["allocated_gpu_seconds"], abs=8 * (elapsed + 1))
    assert cli["allocated_gpu_seconds"] < whole / 2  # the range's share, not the whole run
