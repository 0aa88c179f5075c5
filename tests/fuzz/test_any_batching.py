"""Any batching, any order (issue 30, point 4): a valid run's events cut into batches anywhere and sent in any order
give the same ledger as the whole run sent at once, on SQLite and PostgreSQL.

The runs are the simulator's (failures, kills without a word, hangs, checkpoints, heartbeats, runs that finish or
fail for good), with requeues added: at some restarts the job lost its allocation and was admitted into a new one,
and the launcher that died with the node sent no `allocation_end` for some of them. The sender's side: its batches
are cut anywhere, sent in any order, some sent twice (a retry), and some step records replayed regrouped under new
ids (a spool replay). No rule of the collector may depend on where the stream was cut (docs/events.md,
"Plausibility limits"; docs/ledger.md, "Contradicting inputs").
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.collector.app import create_app
from services.settings import LiveSettings, ServerSettings, ServiceSettings
from services.simulate import SimConfig, simulate
from tests.fuzz.conftest import CASES, budget
from tests.ledger_checks import assert_partition

FUZZ = settings(derandomize=True, deadline=None, database=None, max_examples=budget(25),
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])


@pytest.fixture
def client(database_url: str, engine: Any) -> Iterator[TestClient]:
    # The simulated runs lie in the past: a run without run_end would be hung now, and its provisional hang
    # (which grows with the collector's clock at every read) is not what is compared here.
    settings_ = ServiceSettings(server=ServerSettings(database_url=database_url, serve_dashboard=False,
                                                      warm_analyses_s=0),
                                live=LiveSettings(hang_floor_s=1e12))
    with TestClient(create_app(settings_, engine=engine)) as c:
        yield c


@st.composite
def runs(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A simulated run's events, with requeues at some of its restarts."""
    killed = draw(st.booleans())
    config = SimConfig(
        run_id="sim", seed=draw(st.integers(0, 1 << 20)), ranks=draw(st.integers(1, 3)),
        hours=draw(st.sampled_from([0.004, 0.01, 0.02])), step_s=1.0, startup_s=draw(st.sampled_from([2.0, 8.0])),
        detect_s=3.0, relaunch_s=2.0, queue_s=10.0, tail_s=5.0, checkpoint_s=1.0,
        mtbf_s=draw(st.sampled_from([None, 12.0, 40.0])), max_failures=draw(st.integers(1, 4)),
        checkpoint_every=draw(st.integers(3, 12)), records_per_rank=draw(st.integers(1, 8)),
        end=draw(st.sampled_from(["finished", "failed", "running"])), killed=killed,
        heartbeat_s=draw(st.sampled_from([None, 4.0])), collectives=draw(st.booleans()),
        comm_inline=draw(st.booleans()), hang_at_step=draw(st.sampled_from([None, 7])), hang_s=20.0)
    events = simulate(config).events
    starts: dict[int, float] = {}
    for e in events:
        if e["kind"] == "attempt_start":
            starts[e["attempt"]] = min(e["time"], starts.get(e["attempt"], e["time"]))
    gpus = next(e["gpus"] for e in events if e["kind"] == "allocation_start")
    for attempt in sorted(starts)[1:]:
        how = draw(st.sampled_from(["restart", "requeue", "requeue, allocation_end lost"]))
        if how == "restart":
            continue
        at = starts[attempt]
        events.append({"event_id": f"requeue-{attempt}", "run_id": "sim", "kind": "allocation_start",
                       "time": at - 0.5, "gpus": gpus})
        if how == "requeue":
            events.append({"event_id": f"requeue-end-{attempt}", "run_id": "sim", "kind": "allocation_end",
                           "time": at - config.relaunch_s})
    return sorted(events, key=lambda e: e["time"])


def sent_otherwise(events: list[dict[str, Any]], rng: random.Random) -> list[list[dict[str, Any]]]:
    """The same events as a sender might deliver them: in any order, cut anywhere, some batches sent twice, some
    step records replayed regrouped under new ids."""
    out = list(events)
    for i, e in enumerate(events):
        if e["kind"] == "steps" and len(e["step"]) >= 2 and rng.random() < 0.2:
            cut = rng.randrange(1, len(e["step"]))
            for part, sl in (("a", slice(0, cut)), ("b", slice(cut, None))):
                out.append({**{k: (v[sl] if isinstance(v, list) else v) for k, v in e.items()},
                            "event_id": f"replay-{i}-{part}"})
    if rng.random() < 0.7:
        rng.shuffle(out)
    cuts = sorted(rng.sample(range(1, len(out)), min(len(out) - 1, rng.randint(1, 12))))
    batches = [out[lo:hi] for lo, hi in zip([0, *cuts], [*cuts, len(out)], strict=True)]
    batches += [b for b in batches if rng.random() < 0.15]  # retries: duplicates
    rng.shuffle(batches)
    return batches


def ledger_of(client: TestClient, run_id: str, batches: list[list[dict[str, Any]]]) -> dict[str, Any]:
    for batch in batches:
        response = client.post("/v1/events", json={"events": [{**e, "run_id": run_id} for e in batch]})
        assert response.status_code == 200, response.text
    response = client.get(f"/v1/runs/{run_id}/waste")
    assert response.status_code == 200, response.text
    ledger = response.json()
    assert_partition(ledger)
    return {k: v for k, v in ledger.items() if k != "run_id"}


def test_any_batching_in_any_order_gives_the_ledger_of_the_whole_run_at_once(client: TestClient) -> None:
    examples = iter(range(1 << 30))

    @FUZZ
    @given(runs(), st.integers(0, 1 << 30))
    def check(events: list[dict[str, Any]], seed: int) -> None:
        CASES["hypothesis any batching, any order"] += 1
        n = next(examples)
        whole = ledger_of(client, f"whole-{n}", [events])
        cut = ledger_of(client, f"cut-{n}", sent_otherwise(events, random.Random(seed)))
        assert cut == whole

    check()
