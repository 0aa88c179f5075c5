"""GET /v1/runs/{run_id}/live and /v1/live: hang detection from the database, with the server's clock."""

from __future__ import annotations

import itertools
import statistics
import time
from typing import Any

import pytest

from services.analysis.live import live_run
from services.simulate import START_TIME, SimConfig, simulate
from services.storage.runs import DEFAULT_PROJECT, RunRef
from tests.live_database import StoredRun


def post(client: Any, events: list[dict[str, Any]]) -> None:
    for i in range(0, len(events), 500):
        response = client.post("/v1/events", json={"events": events[i:i + 500]})
        assert response.status_code == 200, response.text


def running_sim(run_id: str, stopped_ago_s: float, **overrides: Any) -> list[dict[str, Any]]:
    """A simulated running run whose last step ended `stopped_ago_s` before now."""
    config = {"run_id": run_id, "ranks": 4, "hours": 0.05, "step_s": 4.0, "mtbf_s": None, "end": "running",
              "seed": 1, "checkpoint_every": 20, **overrides}
    probe = simulate(SimConfig(**config))
    last = max(max(e["end"]) for e in probe.events if e["kind"] == "steps")
    shift = time.time() - stopped_ago_s - last
    return simulate(SimConfig(**config, start_time=START_TIME + shift)).events


def one_second_steps(run_id: str, t0: float, last_step: dict[int, int]) -> list[dict[str, Any]]:
    """Each rank (all on host h) starts at t0 and does steps of 1 s up to its `last_step`."""
    events: list[dict[str, Any]] = []
    for rank, last in last_step.items():
        events.append({"event_id": f"s{rank}", "run_id": run_id, "kind": "attempt_start", "time": t0,
                       "attempt": 0, "rank": rank, "world_size": len(last_step), "host": "h"})
        events.append({"event_id": f"st{rank}", "run_id": run_id, "kind": "steps", "time": t0 + last,
                       "attempt": 0, "rank": rank, "step": list(range(1, last + 1)),
                       "start": [t0 + i for i in range(last)], "end": [t0 + i + 1 for i in range(last)]})
    return events


def test_a_running_run_is_hung_once_past_its_threshold_and_the_fleet_lists_it_first(client) -> None:
    post(client, running_sim("stalled", stopped_ago_s=60.0))
    post(client, running_sim("healthy", stopped_ago_s=1.0))
    stalled = client.get("/v1/runs/stalled/live").json()
    assert stalled["hung"] is True and stalled["possibly_hung"] is True
    assert stalled["threshold_seconds"] == pytest.approx(40.5, rel=0.01) and stalled["threshold_basis"] == "steps"
    assert stalled["seconds_since_progress"] == pytest.approx(stalled["server_time"] - stalled["last_progress_time"])
    assert stalled["seconds_since_progress"] > 60.0
    assert stalled["at_risk_gpu_seconds"] > 0 and stalled["world_size"] == 4 and len(stalled["ranks"]) == 4
    healthy = client.get("/v1/runs/healthy/live").json()
    assert healthy["hung"] is False and healthy["suspects"] == []
    fleet = client.get("/v1/live").json()
    assert [r["run_id"] for r in fleet["runs"]] == ["stalled", "healthy"]
    assert (fleet["hung"] == 1 and "ranks" not in fleet["runs"][0]) or fleet["runs"][0]["ranks"] is None
    assert client.get("/v1/runs/nope/live").status_code == 404


def test_the_live_answer_is_what_the_events_sent_say(client, engine) -> None:
    events = running_sim("agree", stopped_ago_s=45.0)
    post(client, events)
    live = client.get("/v1/runs/agree/live").json()
    # worked out from the events: every rank's step ends, the leading rank's last 33, checkpoints as progress
    ends: dict[int, dict[int, float]] = {}
    for e in events:
        if e["kind"] == "steps":
            ends.setdefault(e["rank"], {}).update(zip(e["step"], e["end"], strict=True))
    leader = max(ends, key=lambda r: (max(ends[r]), -r))
    recent = [ends[leader][s] for s in sorted(ends[leader])][-33:]
    median = statistics.median(b - a for a, b in itertools.pairwise(recent))
    progress = max([t for own in ends.values() for t in own.values()]
                   + [e["time"] for e in events if e["kind"] in ("checkpoint_start", "checkpoint_end")])
    assert live["last_step"] == max(max(own) for own in ends.values())
    assert live["median_step_seconds"] == pytest.approx(median)
    assert live["threshold_seconds"] == pytest.approx(max(30.0, 10 * median))
    assert live["last_progress_time"] == pytest.approx(progress)
    assert live["hung"] is True and live["server_time"] - progress > live["threshold_seconds"]
    # and every field as the stored run reads and judges at the answer's server time
    status = StoredRun(engine, RunRef(DEFAULT_PROJECT, "agree")).status(live["server_time"])
    expected = live_run(status, project=live["project"], version=live["version"], latest_time=live["latest_time"],
                        at_risk_gpu_seconds=live["at_risk_gpu_seconds"], allocated_gpus=live["allocated_gpus"])
    for key, value in expected.model_dump(mode="json").items():
        assert live[key] == (pytest.approx(value) if isinstance(value, float) else value), key


def test_the_rank_without_heartbeats_and_behind_is_the_suspect(client) -> None:
    now = time.time()
    t0 = now - 200
    events = one_second_steps("ddp", t0, {0: 100, 1: 99, 2: 100})
    for rank in range(3):
        beat = now - 2 if rank != 1 else t0 + 99
        events.append({"event_id": f"hb{rank}", "run_id": "ddp", "kind": "heartbeat", "time": beat,
                       "attempt": 0, "rank": rank, "step": 101 if rank != 1 else 100, "collectives": 1})
    post(client, events)
    live = client.get("/v1/runs/ddp/live").json()
    assert live["hung"] is True and live["last_step"] == 100 and live["pending_step"] == 101
    assert live["suspect_ranks"] == [1]
    (suspect,) = live["suspects"]
    assert any(r.startswith("behind") for r in suspect["reasons"])
    assert any(r.startswith("no heartbeat") for r in suspect["reasons"])
    by_rank = {r["rank"]: r for r in live["ranks"]}
    assert by_rank[0]["heartbeat_age_seconds"] == pytest.approx(live["server_time"] - (now - 2))
    assert by_rank[1]["silent"] and by_rank[1]["behind"] and not by_rank[2]["behind"]


def test_a_finished_run_is_not_live(client) -> None:
    post(client, simulate(SimConfig(run_id="done", ranks=2, hours=0.01, mtbf_s=None, seed=2)).events)
    live = client.get("/v1/runs/done/live").json()
    assert live["status"] == "finished" and live["hung"] is False
    assert client.get("/v1/live").json()["runs"] == []


def scrape(client: Any) -> dict[tuple[str, str], float]:
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            out[(sample.name, sample.labels.get("run_id", ""))] = sample.value
    return out


def test_prometheus_has_a_hung_gauge_and_a_suspect_count_per_running_run(client) -> None:
    post(client, running_sim("stalled", stopped_ago_s=60.0))
    post(client, running_sim("healthy", stopped_ago_s=1.0))
    samples = scrape(client)
    assert samples[("goodput_run_hung", "stalled")] == 1.0
    assert samples[("goodput_run_hung", "healthy")] == 0.0
    assert samples[("goodput_run_hang_suspects", "healthy")] == 0.0
    assert samples[("goodput_fleet_hung_runs", "")] == 1.0


def test_each_rank_is_judged_by_its_latest_heartbeat_within_the_lookback(client) -> None:
    """Heartbeats arrive out of order (several spools); the newest of each rank counts (its time, step and
    collectives), and one older than the lookback (60 s) is not seen at all."""
    now = time.time()
    t0 = now - 300
    events = one_second_steps("beats", t0, {0: 100, 1: 100})
    beats = [(0, now - 30, 101, 2), (0, now - 2, 102, 3), (0, now - 45, 101, 1), (0, now - 10, 102, 1),
             (1, now - 90, 101, 5)]
    events += [{"event_id": f"hb{i}", "run_id": "beats", "kind": "heartbeat", "time": t, "attempt": 0, "rank": r,
                "step": step, "collectives": n} for i, (r, t, step, n) in enumerate(beats)]
    post(client, events)
    live = client.get("/v1/runs/beats/live").json()
    by_rank = {r["rank"]: r for r in live["ranks"]}
    assert by_rank[0]["last_heartbeat_time"] == pytest.approx(now - 2)
    assert by_rank[0]["pending_step"] == 102 and by_rank[0]["collectives_in_pending_step"] == 3
    assert by_rank[1]["last_heartbeat_time"] is None and by_rank[1]["pending_step"] == 101
    assert live["hung"] is True and live["suspect_ranks"] == [1], live["suspects"]
