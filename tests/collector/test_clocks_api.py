"""Clocks that disagree, through the collector on both databases (issue 30, point 5; issue 31, point 5).

The ledger takes each host's offset, measured from its ranks' step ends, out before painting: whatever batches the
events came in, in whatever order. Live detection measures a run on the collector's clock: each rank's times are
taken back by its clock's offset from the collector's, as the requests measured it (Goodput-Sent-At, or a lead
that proves a clock ahead), never a client's clock against the server's."""

from __future__ import annotations

import datetime
import random
import time
from typing import Any

import pytest
from sqlalchemy import Engine, text

from services.schemas.ledger import Ledger
from services.simulate import START_TIME, SimConfig, simulate
from services.storage.clock_readings import RequestClock, collector_offsets, readings_of
from services.storage.records import IngestRecord
from services.storage.runs import get_run
from services.storage.write import write_batches
from tests.analysis.test_clocks import two_hosts
from tests.analysis.test_ledger_matches_simulated_truth import assert_matches_truth
from tests.ledger_checks import assert_partition

SENT_AT = "Goodput-Sent-At"


def post(client: Any, events: list[dict[str, Any]], *, clock_offset_s: float | None = None,
         batch: int = 500) -> None:
    """Post in batches; with `clock_offset_s`, as the client does, saying when it sent by a clock that far off."""
    for i in range(0, len(events), batch):
        headers = {SENT_AT: f"{time.time() + clock_offset_s:.6f}"} if clock_offset_s is not None else {}
        response = client.post("/v1/events", json={"events": events[i:i + batch]}, headers=headers)
        assert response.status_code == 200, response.text


def renamed(events: list[dict[str, Any]], run_id: str) -> list[dict[str, Any]]:
    return [{**e, "run_id": run_id, "event_id": f"{run_id}:{e['event_id']}"} for e in events]


def cut_and_shuffled(events: list[dict[str, Any]], seed: int) -> list[list[dict[str, Any]]]:
    rng = random.Random(seed)
    order = list(events)
    rng.shuffle(order)
    batches, at = [], 0
    while at < len(order):
        size = rng.randint(1, 60)
        batches.append(order[at:at + size])
        at += size
    return batches


@pytest.mark.parametrize("offset", [-30.0, 60.0])
def test_a_run_across_two_skewed_hosts_is_the_truth_in_any_cut_and_order(client: Any, offset: float) -> None:
    """16 ranks on two hosts, host node001's clock off; records of 7 steps, sent in random batches and orders as two
    runs: both ledgers are the truth, identical to each other, and every surface says node001's offset."""
    sim = two_hosts(offset, records_per_rank=7, mtbf_s=150.0, seed=3, heartbeat_s=5.0, hours=0.08)
    assert sim.truth.failures >= 1
    ledgers = []
    for k, run_id in enumerate(("cut-a", "cut-b")):
        for batch in cut_and_shuffled(renamed(sim.events, run_id), seed=k):
            post(client, batch)
        ledgers.append(client.get(f"/v1/runs/{run_id}/waste").json())
    assert ledgers[0] == {**ledgers[1], "run_id": "cut-a"}
    ledger = Ledger.model_validate(ledgers[0])
    assert_matches_truth(ledger, sim.truth, sim.config)
    assert ledger.productive_gpu_seconds == pytest.approx(sim.truth.productive, rel=0.01)
    assert {c.host: c.offset_seconds for c in ledger.clocks} == pytest.approx({"node000": 0.0, "node001": offset},
                                                                              abs=1e-3)

    ranks = client.get("/v1/runs/cut-a/ranks").json()["ranks"]
    assert {c["host"]: c["offset_seconds"] for c in ranks["clocks"]} == pytest.approx(
        {"node000": 0.0, "node001": offset}, abs=1e-3)
    assert {r["rank"]: r["clock_offset_seconds"] for r in ranks["rows"]} == pytest.approx(
        {r: (offset if r >= 8 else 0.0) for r in range(16)}, abs=1e-3)
    detail = client.get("/v1/runs/cut-a/ranks/9").json()
    assert detail["host"] == "node001" and detail["clock_offset_seconds"] == pytest.approx(offset, abs=1e-3)
    steps = [e for e in sim.events if e["kind"] == "steps" and e["rank"] == 9 and e["attempt"] == 0]
    assert detail["steps"]["end"][0] == pytest.approx(steps[0]["end"][0] - offset, abs=1e-3)  # its true time
    advice = {r["code"]: r for r in client.get("/v1/runs/cut-a/advice").json()["recommendations"]}
    wording = advice["clock_offset"]["wording"]
    assert "host node001's clock is" in wording.lower() and "NTP" in wording
    assert ("ahead of" if offset > 0 else "behind") in wording


def test_a_whole_run_2_hours_behind_the_collector_is_judged_on_the_collectors_clock(client: Any) -> None:
    """Issue 31: a run whose clocks are all 2 h behind the collector's was shown hung at once, with 14,491 GPU-s of
    provisional hang. Its requests say when they were sent (2 h behind): live detection measures it on the
    collector's clock, and books a hang only when there is one, of the length there was."""
    behind = -7200.0
    healthy = running("behind-ok", stopped_ago_s=1.0, clock_offset_s=behind)
    stalled = running("behind-stalled", stopped_ago_s=90.0, clock_offset_s=behind)
    post(client, healthy, clock_offset_s=behind)
    post(client, stalled, clock_offset_s=behind)
    post(client, heartbeats("behind-stalled", clock_offset_s=behind), clock_offset_s=behind)

    ok = client.get("/v1/runs/behind-ok/live").json()
    assert ok["hung"] is False and 0 <= ok["seconds_since_progress"] < 10
    assert ok["clock_offset_seconds"] == pytest.approx(behind, abs=1.0)
    assert [r["clock_offset_seconds"] for r in ok["ranks"]] == pytest.approx([behind] * 4, abs=1.0)
    assert client.get("/v1/runs/behind-ok/waste").json()["provisional"] is None

    hung = client.get("/v1/runs/behind-stalled/live").json()
    assert hung["hung"] is True and 85 <= hung["seconds_since_progress"] < 120
    waste = client.get("/v1/runs/behind-stalled/waste").json()
    assert_partition(waste)
    assert waste["provisional"]["hang_gpu_seconds"] == pytest.approx(4 * hung["seconds_since_progress"], abs=4 * 5)
    assert waste["provisional"]["as_of"] - waste["provisional"]["since"] == pytest.approx(
        hung["seconds_since_progress"], abs=5)
    advice = {r["code"]: r for r in client.get("/v1/runs/behind-ok/advice").json()["recommendations"]}
    assert "behind the collector's" in advice["clock_offset"]["wording"]


def test_a_run_dated_2001_neither_hangs_nor_fills_the_fleets_hang_metric(client: Any) -> None:
    """Issue 31: events dated 2001 were accepted and the run's provisional hang, 1.6e9 GPU-s, became the fleet's
    hang metric. Its requests' clocks say 2001 too: it is a healthy run on a clock 25 years behind."""
    behind = datetime.datetime(2001, 6, 1, tzinfo=datetime.UTC).timestamp() - time.time()
    post(client, running("in-2001", stopped_ago_s=1.0, clock_offset_s=behind), clock_offset_s=behind)
    live = client.get("/v1/runs/in-2001/live").json()
    assert live["hung"] is False and live["clock_offset_seconds"] == pytest.approx(behind, abs=1.0)
    waste = client.get("/v1/runs/in-2001/waste").json()
    assert waste["provisional"] is None and waste["allocated_gpu_seconds"] < 4 * 3600
    metrics = client.get("/metrics").text
    hang = next(line for line in metrics.splitlines()
                if line.startswith('goodput_fleet_waste_gpu_seconds{category="hang"'))
    assert float(hang.rsplit(" ", 1)[1]) == pytest.approx(waste["waste_gpu_seconds"]["hang"], abs=1.0)


@pytest.mark.parametrize("says_when_it_sent", [False, True])
def test_a_running_run_with_a_rank_1_hour_ahead_is_flagged_hung(client: Any, says_when_it_sent: bool) -> None:
    """Issue 31: with one rank 1 h ahead, a stalled run was never flagged hung and showed seconds_since_progress
    -3554. Its heart-beats (it is stuck, not dead) arrive an hour "early": a clock at least that far ahead, or, from a
    client that says when it sent, exactly that far."""
    ahead = {"node003": 3600.0}
    events = running("one-ahead", stopped_ago_s=60.0, ranks_per_host=1, clock_offsets=ahead)
    beats = heartbeats("one-ahead", ranks_per_host=1, clock_offsets=ahead)
    for rank in range(4):
        offset = ahead.get(f"node{rank:03d}", 0.0)
        mine = [e for e in (*events, *beats) if e.get("rank") == rank]
        post(client, mine, clock_offset_s=offset if says_when_it_sent else None)
    post(client, [e for e in events if "rank" not in e])
    live = client.get("/v1/runs/one-ahead/live").json()
    assert live["hung"] is True and 55 <= live["seconds_since_progress"] < 90
    assert live["clock_offset_seconds"] == 0.0
    offsets = {r["rank"]: r["clock_offset_seconds"] for r in live["ranks"]}
    assert offsets[3] == pytest.approx(3600.0, abs=1.0) and offsets[0] == offsets[1] == offsets[2] == 0.0
    assert client.get("/v1/runs/one-ahead/waste").json()["provisional"]["hang_gpu_seconds"] > 0


YEAR_2000_JAN_2 = datetime.datetime(2000, 1, 2, tzinfo=datetime.UTC).timestamp()


@pytest.mark.parametrize("case", ["reset_to_2000", "15_min_ahead", "20_h_ahead"])
def test_absurd_clocks_of_one_host_leave_the_ledger_the_truth(client: Any, case: str) -> None:
    """Issue 31: one rank reset to 2000-01-02 gave a 2-minute run 3.4e9 allocated GPU-s and the fleet a goodput of
    0.9998; one 15 min ahead hid a 600 s hang and its restart; one 20 h ahead gave a 10-step run 144,020 productive
    GPU-s. Every rank on its own host; the simulator's truth is booked on the true clock."""
    start = time.time() - 3600  # finished within the metrics' window
    configs = {
        "reset_to_2000": dict(ranks=4, hours=100 / 3600, checkpoint_every=50, checkpoint_s=2.0,
                              clock_offsets={"node003": YEAR_2000_JAN_2 - start}),
        "15_min_ahead": dict(ranks=4, hours=200 / 3600, checkpoint_every=50, checkpoint_s=2.0, hang_at_step=120,
                             hang_s=600.0, clock_offsets={"node002": 900.0}),
        "20_h_ahead": dict(ranks=2, hours=10 / 3600, comm_s=0.0, checkpoint_every=100,
                           clock_offsets={"node001": 20 * 3600.0}),
    }
    sim = simulate(SimConfig(run_id=case, ranks_per_host=1, step_s=1.0, mtbf_s=None, startup_s=10.0, seed=4,
                             start_time=start, **configs[case]))  # type: ignore[arg-type]
    post(client, sim.events)
    ledger = Ledger.model_validate(client.get(f"/v1/runs/{case}/waste").json())
    assert_matches_truth(ledger, sim.truth, sim.config)
    assert ledger.allocated_gpu_seconds < sim.config.ranks * 1000
    metrics = client.get("/metrics").text
    fleet = next(line for line in metrics.splitlines() if line.startswith("goodput_fleet_goodput_ratio"))
    assert float(fleet.rsplit(" ", 1)[1]) == pytest.approx(sim.truth.productive / sim.truth.allocated)


def test_a_clock_header_that_is_not_a_time_is_refused_and_nothing_stored(client: Any) -> None:
    event = {"event_id": "e", "run_id": "bad-clock", "kind": "heartbeat", "time": time.time(), "attempt": 0,
             "rank": 0}
    for value in ("soon", "nan", "-5"):
        response = client.post("/v1/events", json={"events": [event]}, headers={SENT_AT: value})
        assert response.status_code == 400, response.text
        assert SENT_AT in response.json()["error"]["message"]
    assert client.get("/v1/runs/bad-clock").status_code == 404


def test_readings_follow_a_clock_set_right_within_two_minutes(engine: Engine) -> None:
    """A host 30 s ahead whose NTP steps it right: its offset is the larger of this minute's and the last minute's
    readings, so the old one is gone two minutes later. Requests that took their time (an earlier minute) change
    nothing; replays (events older than the request by minutes) measure nothing."""
    minute = 60.0 * 1_000_000

    def send(received: float, sent_ahead: float, event_age_s: float = 0.1) -> None:
        record = IngestRecord(run_id="ntp", event_id=f"e{received}", kind="heartbeat",
                              time=received + sent_ahead - event_age_s, attempt=0, rank=0)
        readings = readings_of([record], RequestClock(received_at=received, sent_at=received + sent_ahead))
        write_batches(engine, [[record]], clocks=[readings])

    def offset() -> float:
        with engine.connect() as conn:
            return collector_offsets(conn, get_run(conn, "ntp").pk, 0)[0]

    send(minute + 1, 30.0)
    assert offset() == pytest.approx(30.0)
    send(minute + 70, 0.002)  # set right: the last minute's reading still counts
    assert offset() == pytest.approx(30.0)
    send(minute + 20, 45.0)  # a request from the minute before that arrives late: not a reading of now
    assert offset() == pytest.approx(30.0)
    send(minute + 130, 0.003)
    assert offset() == 0.0  # within the deadband: a delay, not a clock
    send(minute + 131, -3600.0, event_age_s=600.0)  # a spool replayed from another clock: measures nothing
    assert offset() == 0.0


def test_a_reading_that_raises_nothing_leaves_the_row_as_it_was(engine: Engine) -> None:
    """Most requests of a live run raise no reading of their minute: the row is not written again (its
    `received_at` is the latest request that raised one); a larger reading, or the next minute's, is."""
    minute = 60.0 * 1_000_000

    def send(received: float, sent_ahead: float | None, lead_s: float) -> None:
        record = IngestRecord(run_id="kept", event_id=f"e{received}", kind="heartbeat", time=received + lead_s,
                              attempt=0, rank=0)
        sent = None if sent_ahead is None else received + sent_ahead
        write_batches(engine, [[record]], clocks=[readings_of([record], RequestClock(received_at=received,
                                                                                     sent_at=sent))])

    def row() -> tuple[float, float | None, float]:
        with engine.connect() as conn:
            found = conn.execute(text("SELECT lead_s, offset_s, received_at FROM clock_readings WHERE rank = 0")).one()
        return found[0], found[1], found[2]

    send(minute + 1, None, 3.0)
    assert row() == pytest.approx((3.0, None, minute + 1))
    send(minute + 2, None, 2.0)  # raises nothing
    assert row() == pytest.approx((3.0, None, minute + 1))
    send(minute + 3, 4.0, 2.0)  # the first offset of the minute
    assert row() == pytest.approx((3.0, 4.0, minute + 3))
    send(minute + 4, 3.5, 2.5)  # raises nothing
    assert row() == pytest.approx((3.0, 4.0, minute + 3))
    send(minute + 5, 4.5, 1.0)  # a larger offset
    assert row() == pytest.approx((3.0, 4.5, minute + 5))
    send(minute + 6, None, 3.5)  # a larger lead
    assert row() == pytest.approx((3.5, 4.5, minute + 6))
    send(minute + 61, None, 0.5)  # the next minute, smaller: written
    assert row() == pytest.approx((0.5, None, minute + 61))


# -- runs as a client sends them live --------------------------------------------------------------------------


def running(run_id: str, *, stopped_ago_s: float, clock_offset_s: float = 0.0,
            **overrides: Any) -> list[dict[str, Any]]:
    """A simulated running run of 4 ranks whose last step ended `stopped_ago_s` before now (truly), every clock
    `clock_offset_s` off (or the hosts of `clock_offsets` alone)."""
    config = {"run_id": run_id, "ranks": 4, "hours": 0.05, "step_s": 4.0, "mtbf_s": None, "end": "running",
              "seed": 1, "checkpoint_every": 20, **overrides}
    probe = simulate(SimConfig(**{**config, "clock_offsets": {}}))
    last = max(max(e["end"]) for e in probe.events if e["kind"] == "steps")
    start = START_TIME + time.time() - stopped_ago_s - last + clock_offset_s
    return simulate(SimConfig(**config, start_time=start)).events


def heartbeats(run_id: str, *, clock_offset_s: float = 0.0, ranks_per_host: int = 8,
               clock_offsets: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """A heartbeat of each of 4 ranks stuck in step 1,000 (whatever step it is: the live rules read its age), sent
    now by its own clock."""
    now = time.time() + clock_offset_s
    return [{"event_id": f"{run_id}:beat{rank}", "run_id": run_id, "kind": "heartbeat", "attempt": 0, "rank": rank,
             "time": now + (clock_offsets or {}).get(f"node{rank // ranks_per_host:03d}", 0.0) - 0.2}
            for rank in range(4)]
