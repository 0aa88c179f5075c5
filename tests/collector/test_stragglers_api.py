from __future__ import annotations

from services.simulate import SimConfig, simulate


def test_stragglers_endpoint_names_the_slow_rank(client) -> None:
    result = simulate(SimConfig(run_id="strag-api", ranks=8, hours=0.05, mtbf_s=None, straggler_rank=3, seed=1))
    assert client.post("/v1/events", json={"events": result.events}).status_code == 200
    report = client.get("/v1/runs/strag-api/stragglers").json()
    ledger = client.get("/v1/runs/strag-api/waste").json()
    assert report["ranks"][0]["rank"] == 3 and report["ranks"][0]["flagged"]
    assert [r["rank"] for r in report["ranks"] if r["flagged"]] == [3]
    top = report["ranks"][0]
    assert top["slower_steps"] >= report["thresholds"]["consistent_share"] * top["compared_steps"]
    assert top["compared_steps"] >= report["thresholds"]["min_steps"] and top["chance_p"] < 0.01 / 8
    assert report["straggler_gpu_seconds"] == ledger["waste_gpu_seconds"]["straggler"]
    assert client.get("/v1/runs/nope/stragglers").status_code == 404
