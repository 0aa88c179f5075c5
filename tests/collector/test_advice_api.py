from __future__ import annotations

from services.analysis.advice import AdviceInput
from services.reports.advice import run_advice
from services.schemas.advice import RunAdvice
from services.schemas.ledger import Ledger
from services.schemas.views import RunViews
from services.simulate import SimConfig, simulate


def post(client, events) -> None:
    for i in range(0, len(events), 500):
        assert client.post("/v1/events", json={"events": events[i:i + 500]}).status_code == 200


def test_advice_endpoint_serves_the_engines_advice_of_the_runs_ledger(client) -> None:
    post(client, simulate(SimConfig(run_id="adv-api", ranks=8, hours=1, mtbf_s=900, checkpoint_every=50,
                                    checkpoint_s=20, seed=5)).events)
    ledger = Ledger.model_validate(client.get("/v1/runs/adv-api/waste").json())
    views = RunViews.model_validate(client.get("/v1/runs/adv-api/view").json())  # the view's RunViews part
    served = RunAdvice.model_validate(client.get("/v1/runs/adv-api/advice").json())
    assert served.run_id == "adv-api"
    assert ledger.failures >= 3  # its own failure rate: no peers read; its resume check is clean
    assert served == run_advice(AdviceInput(ledger=ledger, views=views))  # the JSON round trip of the same floats
    (interval,) = [r for r in served.recommendations if r.code == "checkpoint_interval"]
    assert interval.confidence.failure_rate_source == "run" and interval.confidence.failures == ledger.failures
    assert client.get("/v1/runs/nope/advice").status_code == 404


def test_the_fleet_failure_rate_comes_from_runs_of_the_same_project(client, engine) -> None:
    from sqlalchemy import update

    from services.storage.tables import Run

    post(client, simulate(SimConfig(run_id="quiet", ranks=8, hours=0.5, mtbf_s=None, checkpoint_every=20,
                                    checkpoint_s=15, seed=1)).events)
    post(client, simulate(SimConfig(run_id="flaky", ranks=8, hours=1, mtbf_s=600, max_failures=4, seed=2)).events)
    assert client.get("/v1/runs/flaky/waste").json()["failures"] >= 3

    def interval_advice() -> tuple[list[str], list[str]]:
        advice = RunAdvice.model_validate(client.get("/v1/runs/quiet/advice").json())
        return [r.confidence.text for r in advice.recommendations if r.code == "checkpoint_interval"], advice.notes

    with engine.begin() as conn:  # another team's run
        conn.execute(update(Run).where(Run.run_id == "flaky").values(project="other-team"))
    sources, notes = interval_advice()
    assert sources == [] and any(n.startswith("Checkpoint interval: neither this run nor its project's runs")
                                 for n in notes)
    with engine.begin() as conn:
        conn.execute(update(Run).where(Run.run_id == "flaky").values(project="default"))
    sources, notes = interval_advice()  # it checkpoints every 20 s: less often, at the project's rate, said so
    assert len(sources) == 1 and sources[0].startswith("this run and 1 other run of its project with 4-16 ranks")
