from __future__ import annotations

from services.analysis.advice import checkpoint_advice
from services.analysis.ledger_types import Ledger
from services.simulate import SimConfig, simulate


def test_advice_endpoint_serves_the_checkpoint_interval_advice_of_the_runs_ledger(client) -> None:
    result = simulate(SimConfig(run_id="adv-api", ranks=8, hours=1, mtbf_s=900, checkpoint_every=50,
                                checkpoint_s=20, seed=5))
    for i in range(0, len(result.events), 500):
        assert client.post("/v1/events", json={"events": result.events[i:i + 500]}).status_code == 200
    ledger = client.get("/v1/runs/adv-api/waste").json()
    advice = client.get("/v1/runs/adv-api/advice").json()
    assert advice["run_id"] == "adv-api"
    # JSON round trip of the same floats
    assert advice["checkpoint_interval"] == checkpoint_advice(Ledger.model_validate(ledger)).model_dump()
    names = [r["name"] for r in advice["checkpoint_interval"]["intervals"]]
    assert names == ["current", "young", "daly"]
    assert client.get("/v1/runs/nope/advice").status_code == 404


def test_the_fleet_failure_rate_comes_from_runs_of_the_same_project(client, engine) -> None:
    from sqlalchemy import update

    from services.storage.tables import Run

    for config in (SimConfig(run_id="quiet", ranks=8, hours=0.5, mtbf_s=None, seed=1),
                   SimConfig(run_id="flaky", ranks=8, hours=1, mtbf_s=600, max_failures=4, seed=2)):
        events = simulate(config).events
        for i in range(0, len(events), 500):
            assert client.post("/v1/events", json={"events": events[i:i + 500]}).status_code == 200
    assert client.get("/v1/runs/flaky/waste").json()["failures"] >= 3

    def source() -> str:
        return client.get("/v1/runs/quiet/advice").json()["checkpoint_interval"]["inputs"]["mtbf_source"]

    with engine.begin() as conn:  # another team's run
        conn.execute(update(Run).where(Run.run_id == "flaky").values(project="other-team"))
    assert source() == "no failures observed in this run or in similar runs"
    with engine.begin() as conn:
        conn.execute(update(Run).where(Run.run_id == "flaky").values(project="default"))
    assert source().startswith("1 runs of 4-16 ranks in the fleet plus this one")
