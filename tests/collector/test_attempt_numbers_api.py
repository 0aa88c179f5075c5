"""Attempt numbers decided by the collector from every launch's records (docs/events.md, "Attempt numbers").

Each scenario is written twice: as the launches sent it (each names its `launch` and numbers its own rounds: a
relaunch on another host with a fresh spool starts from 0 again) and as the truth (the run's attempts numbered by
hand, no launch named). Sent in any order and batching, the first must give the run the truth's ledger, attempts
and stored rows, on both databases.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from dataclasses import dataclass
from itertools import count
from typing import Any

import pytest
from sqlalchemy import Engine, text

from services.storage.step_columns import stored_step_keys
from tests.analysis.scenarios import T0
from tests.ledger_checks import assert_partition

_ids = count()


@dataclass(frozen=True)
class Launch:
    """One launch attempt: what one node (or process) ran in one round."""

    launch: str  # the launch's name on the wire
    sent: int  # the attempt number it sent (its own round)
    truth: int  # the run's attempt
    ranks: range
    world: int
    host: str
    start: float  # seconds after T0
    resume: int  # step resumed from (0: fresh start)
    last: int  # last step it completed
    checkpoints: tuple[int, ...] = ()
    end: str | None = None  # attempt_end reason; None: killed without a word


def events_of(a: Launch, run_id: str, *, tagged: bool) -> list[dict[str, Any]]:
    """The launch attempt's records: as sent (`tagged`), or with the run's attempt number and no launch. Launch ""
    stands for clients that name none: they send the run's numbers."""
    who = {"attempt": a.sent, "launch": a.launch} if tagged and a.launch else {"attempt": a.truth}

    def ev(kind: str, t: float, **fields: Any) -> dict[str, Any]:
        return {"event_id": f"{a.launch}-{a.sent}-{next(_ids)}", "run_id": run_id, "kind": kind, "time": T0 + t,
                **who, **fields}

    out = [ev("attempt_start", a.start, rank=r, world_size=a.world, host=a.host) for r in a.ranks]
    t = a.start + 5.0
    out += [ev("resume", t, rank=r, step=a.resume, **({"checkpoint_step": a.resume} if a.resume else {}))
            for r in a.ranks]
    for step in range(a.resume + 1, a.last + 1):
        for r in a.ranks:
            out.append(ev("step", t + 1.0, rank=r, step=step, start=T0 + t, end=T0 + t + 1.0))
        t += 1.0
        if step in a.checkpoints:
            out.append(ev("checkpoint_start", t, rank=a.ranks[0], step=step))
            out.append(ev("checkpoint_end", t + 0.5, rank=a.ranks[0], step=step, ok=True))
            t += 0.5
    if a.end is not None:
        out += [ev("attempt_end", t, rank=r, reason=a.end) for r in a.ranks]
    return out


def run_events(launches: list[Launch], run_id: str, *, tagged: bool, finished_at: float) -> list[dict[str, Any]]:
    out = [e for a in launches for e in events_of(a, run_id, tagged=tagged)]
    out.append({"event_id": f"end-{next(_ids)}", "run_id": run_id, "kind": "run_end", "time": T0 + finished_at,
                "status": "finished"})
    return out


def post_in_batches(client: Any, events: list[dict[str, Any]], rng: random.Random) -> None:
    i = 0
    while i < len(events):
        n = rng.randint(1, 25)
        response = client.post("/v1/events", json={"events": events[i:i + n]})
        assert response.status_code == 200, response.text
        i += n


def stored(engine: Engine, run_id: str) -> dict[str, Any]:
    """What the database holds per (attempt, rank): attempt_starts, step rows, what requests said of the clocks."""
    with engine.connect() as conn:
        starts = conn.execute(text(
            "SELECT e.attempt, e.rank, count(*) FROM events e JOIN runs r ON r.id = e.run_pk "
            "WHERE r.run_id = :run AND e.kind = 'attempt_start' GROUP BY e.attempt, e.rank"), {"run": run_id}).all()
        keys = stored_step_keys(conn, run_id)
        counts = Counter(zip(keys["attempt"].tolist(), keys["rank"].tolist(), strict=True))
        rows = [(a, r, n) for (a, r), n in counts.items()]
        clocks = conn.execute(text(
            "SELECT c.attempt, c.rank FROM clock_readings c JOIN runs r ON r.id = c.run_pk WHERE r.run_id = :run"),
            {"run": run_id}).all()
    return {"starts": sorted(tuple(r) for r in starts), "steps": sorted(tuple(r) for r in rows),
            "clock readings": sorted(tuple(r) for r in clocks)}


def ledger(client: Any, run_id: str) -> dict[str, Any]:
    response = client.get(f"/v1/runs/{run_id}/waste")
    assert response.status_code == 200, response.text
    body = response.json()
    assert_partition(body)
    return {k: v for k, v in body.items() if k not in ("run_id", "computed_at", "analysed_at")}


def assert_same_run(client: Any, engine: Engine, sent: str, truth: str) -> dict[str, Any]:
    got, want = ledger(client, sent), ledger(client, truth)
    assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)
    assert stored(engine, sent) == stored(engine, truth)
    return got


# A single-process job relaunched on another machine with a fresh spool (a rescheduled pod, a replaced VM): the
# first process checkpoints at 20, reaches 30 and is killed; the second resumes from 20 and finishes at 50.
RELAUNCHED = [
    Launch(launch="pod-a", sent=0, truth=0, ranks=range(1), world=1, host="node-a", start=0.0, resume=0,
           last=30, checkpoints=(20,)),
    Launch(launch="pod-b", sent=0, truth=1, ranks=range(1), world=1, host="node-b", start=60.0, resume=20,
           last=50, end="completed"),
]


def test_a_run_relaunched_on_another_host_with_a_fresh_spool_has_a_restart_and_its_rework(
        client: Any, engine: Engine) -> None:
    rng = random.Random(1)
    post_in_batches(client, run_events(RELAUNCHED, "relaunched", tagged=True, finished_at=120), rng)
    post_in_batches(client, run_events(RELAUNCHED, "truth", tagged=False, finished_at=120), rng)
    got = assert_same_run(client, engine, "relaunched", "truth")
    assert got["restarts"] == 1
    assert got["steps"]["reworked"] == 10  # 21-30, computed by the first process, thrown away by the resume at 20
    assert got["waste_gpu_seconds"]["rework"] == pytest.approx(10.0)
    assert [a["resume_step"] for a in got["attempts"]] == [0, 20]
    check = client.get("/v1/runs/relaunched/resume-check").json()
    assert not {f["code"] for f in check["findings"]} & {"resume_not_a_checkpoint", "repeated_steps"}, check


def test_a_launch_that_started_earlier_but_arrives_later_takes_its_place(client: Any, engine: Engine) -> None:
    """The relaunch's records arrive first (the first host's spool is replayed by `goodput sync` later): it is
    numbered 0 at first, then 1 once the earlier launch arrives, its stored rows moved."""
    rng = random.Random(2)
    events = run_events(RELAUNCHED, "late", tagged=True, finished_at=120)
    later = [e for e in events if e.get("launch") != "pod-a"]
    post_in_batches(client, later, rng)
    assert ledger(client, "late")["restarts"] == 0
    assert stored(engine, "late")["steps"] == [(0, 0, 30)]
    post_in_batches(client, [e for e in events if e.get("launch") == "pod-a"], rng)
    post_in_batches(client, run_events(RELAUNCHED, "truth", tagged=False, finished_at=120), rng)
    assert assert_same_run(client, engine, "late", "truth")["restarts"] == 1
    # a resend is a duplicate, wherever its launch attempt was numbered when it was first stored
    response = client.post("/v1/events", json={"events": events})
    assert response.json() == {"accepted": 0, "duplicates": len(events)}
    assert_same_run(client, engine, "late", "truth")


# Two nodes (one launch each, ranks 0-1 and 2-3) over two rounds, then the job relaunched on two other machines
# with fresh spools: the same launch names would come back only from the same agents.
MULTI_NODE = [
    Launch(launch="a1", sent=0, truth=0, ranks=range(0, 2), world=4, host="a", start=0.0, resume=0, last=14,
           checkpoints=(10,)),
    Launch(launch="b1", sent=0, truth=0, ranks=range(2, 4), world=4, host="b", start=0.4, resume=0, last=14,
           checkpoints=()),
    Launch(launch="a1", sent=1, truth=1, ranks=range(0, 2), world=4, host="a", start=30.0, resume=10, last=17,
           checkpoints=(15,)),
    Launch(launch="b1", sent=1, truth=1, ranks=range(2, 4), world=4, host="b", start=30.2, resume=10, last=17),
    Launch(launch="c2", sent=0, truth=2, ranks=range(0, 2), world=4, host="c", start=70.0, resume=15, last=30,
           end="completed"),
    Launch(launch="d2", sent=0, truth=2, ranks=range(2, 4), world=4, host="d", start=70.9, resume=15, last=30,
           end="completed"),
]


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_every_node_of_a_round_gets_one_number_whatever_order_and_batching(
        client: Any, engine: Engine, seed: int) -> None:
    rng = random.Random(seed)
    events = run_events(MULTI_NODE, "nodes", tagged=True, finished_at=120)
    rng.shuffle(events)
    post_in_batches(client, events, rng)
    post_in_batches(client, run_events(MULTI_NODE, "truth", tagged=False, finished_at=120), rng)
    got = assert_same_run(client, engine, "nodes", "truth")
    assert got["restarts"] == 2
    assert [a["resume_step"] for a in got["attempts"]] == [0, 10, 15]
    assert got["steps"]["reworked"] == 4 + 2  # 11-14 of attempt 0, 16-17 of attempt 1
    rng.shuffle(events)
    post_in_batches(client, events, rng)  # a replay of every spool: duplicates only, the same attempts
    assert_same_run(client, engine, "nodes", "truth")


def test_records_without_a_launch_keep_their_numbers_and_a_launch_after_them_continues(
        client: Any, engine: Engine) -> None:
    """A run started by clients older than launches (attempts 0 and 1 as they sent them), relaunched by a new one
    on a fresh spool (its attempt 0 becomes the run's 2), whatever arrives first."""
    old = [Launch(launch="", sent=0, truth=0, ranks=range(1), world=1, host="h", start=0.0, resume=0, last=10,
                  checkpoints=(5,)),
           Launch(launch="", sent=1, truth=1, ranks=range(1), world=1, host="h", start=30.0, resume=5, last=12)]
    new = [Launch(launch="fresh", sent=0, truth=2, ranks=range(1), world=1, host="g", start=60.0, resume=5,
                  last=20, end="completed")]
    post_in_batches(client, run_events(new + old, "mixed", tagged=True, finished_at=100), random.Random(6))
    post_in_batches(client, run_events(old + new, "truth", tagged=False, finished_at=100), random.Random(7))
    assert assert_same_run(client, engine, "mixed", "truth")["restarts"] == 2


def test_a_late_earlier_launch_of_a_pruned_run_moves_what_retention_kept(settings: Any, engine: Engine) -> None:
    """The relaunch's records arrive, the run goes quiet and retention deletes its raw rows (keeping its step
    blocks); then the first host's spool is replayed. The relaunch's attempt moves to 1 with its kept blocks."""
    from fastapi.testclient import TestClient

    from services.collector.app import create_app
    from services.derive.cache import AnalysisCache
    from services.derive.retention import prune

    events = run_events(RELAUNCHED, "pruned", tagged=True, finished_at=120)
    rng = random.Random(8)
    with TestClient(create_app(settings, engine=engine)) as client:
        post_in_batches(client, [e for e in events if e.get("launch") != "pod-a"], rng)
        assert ledger(client, "pruned")["restarts"] == 0
    assert prune(AnalysisCache(engine), retention_days=30, now=time.time() + 40 * 86_400).frozen == ["pruned"]
    with TestClient(create_app(settings, engine=engine)) as client:
        post_in_batches(client, [e for e in events if e.get("launch") == "pod-a"], rng)
        post_in_batches(client, run_events(RELAUNCHED, "truth", tagged=False, finished_at=120), rng)
        got, want = ledger(client, "pruned"), ledger(client, "truth")
    assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)
    assert got["restarts"] == 1 and got["steps"]["reworked"] == 10
