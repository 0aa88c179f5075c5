from __future__ import annotations


from services.analysis.advice import checkpoint_advice
from services.simulate import SimConfig, simulate


def test_advice_endpoint_serves_the_checkpoint_interval_advice_of_the_runs_ledger(client) -> None:  # type: ignore[no-untyped-def]
    result = simulate(SimConfig(run_id="adv-api", ranks=8, hours=1, mtbf_s=900, checkpoint_every=50,
                                checkpoint_s=20, seed=5))
    for i in range(0, len(result.events), 500):
        assert client.post("/v1/events", json={"events": result.events[i:i + 500]}).status_code == 200
    ledger = client.get("/v1/runs/adv-api/waste").json()
    advice = client.get("/v1/runs/adv-api/advice").json()
    assert advice["run_id"] == "adv-api"
    assert advice["checkpoint_interval"] == checkpoint_advice(ledger)  # JSON round trip of the same floats
    names = [r["name"] for r in advice["checkpoint_interval"]["intervals"]]
    assert names == ["current", "young", "daly"]
    assert client.get("/v1/runs/nope/advice").status_code == 404
