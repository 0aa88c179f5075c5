"""GET /v1/runs/{run_id}/ranks/{rank}: one rank's drill-down read from the database (both databases), equal to the
pure build over the same rank's rows of the simulated events; collective time from `comm` or from collective calls."""

from __future__ import annotations

import pytest

from services.analysis.collective_time import comm_frame
from services.analysis.ledger import build_ledger
from services.analysis.rank_detail import build_rank_detail
from services.analysis.run_data import run_data_from_events
from services.analysis.views import build_run_views
from services.simulate import SimConfig, simulate


@pytest.mark.parametrize("comm_inline", [True, False])
def test_a_ranks_drill_down_is_built_from_its_own_rows(client, comm_inline: bool) -> None:
    config = SimConfig(run_id="rank-api", ranks=8, hours=0.05, mtbf_s=120.0, straggler_rank=3, seed=2,
                       comm_inline=comm_inline)
    result = simulate(config)
    assert client.post("/v1/events", json={"events": result.events}).status_code == 200
    served = client.get("/v1/runs/rank-api/ranks/3").json()
    data = run_data_from_events("rank-api", result.events)
    views = build_run_views(data, build_ledger(data), version=served["version"])
    steps = data.steps[data.steps["rank"] == 3][["attempt", "step", "start", "end", "comm"]]
    comm = data.collectives[data.collectives["rank"] == 3]
    calls = comm.assign(seconds=comm["end"] - comm["start"])[["attempt", "rank", "step", "seconds"]] \
        if len(comm) else comm_frame()
    events = data.events[data.events["rank"] == 3]
    expected = build_rank_detail(views, 3, steps, calls, events).model_dump(mode="json")
    assert served["steps"]["steps_total"] == expected["steps"]["steps_total"] == int((data.steps["rank"] == 3).sum())
    assert served["steps"]["compute_s"] == pytest.approx(expected["steps"]["compute_s"], rel=1e-9)
    assert served["steps"]["collective_s"] == pytest.approx(expected["steps"]["collective_s"], rel=1e-9)
    assert served["compute_source"] == "step duration minus collectives"
    for key in ("host", "host_ranks", "attempts", "failures", "row", "world_size"):
        assert served[key] == expected[key], key
    assert served["host"] == "node000" and served["row"]["is_straggler"]
    assert len(served["failures"]) == sum(1 for a in served["attempts"] if a["failed"])


def test_an_unknown_rank_or_run_says_so(client) -> None:
    result = simulate(SimConfig(run_id="rank-none", ranks=2, hours=0.01, mtbf_s=None, seed=1))
    assert client.post("/v1/events", json={"events": result.events}).status_code == 200
    assert client.get("/v1/runs/rank-none/ranks/7").json()["known"] is False
    assert client.get("/v1/runs/nope/ranks/0").status_code == 404
    assert client.get("/v1/runs/rank-none/ranks/-1").status_code == 422
