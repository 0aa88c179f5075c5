"""A repeated event_id: the same content is a retry (a silent duplicate); other content is refused whole with 409.

Before, a repeat with other content was absorbed as a duplicate: the second event was silently lost.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from sqlalchemy import select, text

from services.storage.records import IngestRecord
from services.storage.step_columns import stored_step_count
from services.storage.tables import Event, Run
from services.storage.write import write_batches

T = 1_700_000_000.0


def steps_record(event_id: str = "s-1", run_id: str = "r") -> dict[str, Any]:
    return {"event_id": event_id, "run_id": run_id, "kind": "steps", "time": T + 4, "attempt": 0, "rank": 0,
            "step": [1, 2, 3], "start": [T + 1, T + 2, T + 3], "end": [T + 2, T + 3, T + 4],
            "loss": [2.5, 2.4, 2.3]}


def ckpt_end(event_id: str = "c-1", ok: bool = True) -> dict[str, Any]:
    return {"event_id": event_id, "run_id": "r", "kind": "checkpoint_end", "time": T + 5, "attempt": 0, "rank": 0,
            "step": 3, "ok": ok}


def post(client, *events: dict[str, Any]):
    return client.post("/v1/events", json={"schema_version": 1, "events": list(events)})


def stored_events(engine) -> list[tuple[str, str]]:
    with engine.connect() as conn:
        return sorted(tuple(r) for r in conn.execute(select(Event.event_id, Event.kind)).all())


def stored_step_rows(engine) -> int:
    with engine.connect() as conn:
        return stored_step_count(conn)


def test_a_true_retry_stays_a_silent_duplicate(client, engine) -> None:
    first = post(client, steps_record(), ckpt_end())
    assert first.status_code == 200 and first.json() == {"accepted": 2, "duplicates": 0}
    again = post(client, steps_record(), ckpt_end())
    assert again.status_code == 200 and again.json() == {"accepted": 0, "duplicates": 2}
    assert stored_step_rows(engine) == 3


@pytest.mark.parametrize("change", ["one step's end", "a loss", "an unsent column sent", "the ok flag", "the kind"])
def test_a_repeated_event_id_with_other_content_is_refused_whole_with_409_naming_it(client, engine, change) -> None:
    assert post(client, steps_record(), ckpt_end()).status_code == 200
    steps, ckpt = steps_record(), ckpt_end()
    changed, index = steps, 1
    if change == "one step's end":
        steps["end"][2] += 0.5
    elif change == "a loss":
        steps["loss"][0] = 9.9
    elif change == "an unsent column sent":
        steps["lr"] = [1e-3, 1e-3, 1e-3]
    elif change == "the ok flag":
        changed, index = ckpt, 2
        ckpt["ok"] = False
    else:
        changed, index = ckpt, 2
        ckpt["kind"] = "checkpoint_start"
        del ckpt["ok"]
    new = steps_record("s-new")  # a new event in the same batch: refused with it
    batch = [new, steps, ckpt] if changed is ckpt else [new, steps]
    before_events, before_rows = stored_events(engine), stored_step_rows(engine)

    response = post(client, *batch)
    assert response.status_code == 409, response.text
    error = response.json()["error"]
    assert error["code"] == "event_id_conflict"
    assert (error["index"], error["event_id"], error["run_id"]) == (index, changed["event_id"], "r")
    assert f"events[{index}]" in error["message"] and "other content" in error["message"]
    assert "nothing of it stored" in error["message"]
    assert stored_events(engine) == before_events and stored_step_rows(engine) == before_rows


def test_a_conflict_inside_one_batch_is_refused_too(client, engine) -> None:
    other = steps_record()
    other["start"] = [T + 1.5, T + 2.5, T + 3.5]
    response = post(client, steps_record(), other)
    assert response.status_code == 409 and response.json()["error"]["index"] == 1
    assert stored_events(engine) == [] and stored_step_rows(engine) == 0
    assert post(client, steps_record(), copy.deepcopy(steps_record())).json() == {"accepted": 1, "duplicates": 1}


def test_the_same_event_id_in_two_projects_runs_of_one_id_is_no_conflict(engine) -> None:
    def record(loss: float) -> IngestRecord:
        return IngestRecord(run_id="r", event_id="e-1", kind="client_stats", time=T, attempt=0, rank=0,
                            data={"dropped_events": int(loss)})

    results = write_batches(engine, [[record(1)], [record(2)]], ["alpha", "beta"])
    assert [(r.accepted, r.conflict) for r in results] == [(1, None), (1, None)]
    with engine.connect() as conn:
        assert sorted(conn.execute(select(Run.project)).scalars()) == ["alpha", "beta"]


def test_in_one_write_group_the_first_batch_wins_and_the_refused_one_creates_no_run(engine) -> None:
    def stats(run_id: str, event_id: str, dropped: int) -> IngestRecord:
        return IngestRecord(run_id=run_id, event_id=event_id, kind="client_stats", time=T, attempt=0, rank=0,
                            data={"dropped_events": dropped})

    first = [stats("r", "e-1", 1)]
    refused = [stats("fresh-run", "x-1", 0), stats("r", "e-1", 2)]
    retry = [stats("r", "e-1", 1), stats("r", "e-2", 3)]
    results = write_batches(engine, [first, refused, retry])
    assert (results[0].accepted, results[0].conflict) == (1, None)
    assert results[1].conflict is not None and (results[1].conflict.index, results[1].conflict.event_id) == (1, "e-1")
    assert (results[2].accepted, results[2].duplicates, results[2].conflict) == (1, 1, None)
    with engine.connect() as conn:
        assert sorted(conn.execute(select(Run.run_id)).scalars()) == ["r"]

    # against stored events: the transaction is rolled back and written again without the refused batch
    later = [stats("another-fresh-run", "y-1", 0), stats("r", "e-2", 4)]
    fine = [stats("r", "e-3", 5)]
    results = write_batches(engine, [later, fine])
    assert results[0].conflict is not None and results[0].conflict.index == 1 and results[1].accepted == 1
    with engine.connect() as conn:
        assert sorted(conn.execute(select(Run.run_id)).scalars()) == ["r"]
        assert sorted(conn.execute(select(Event.event_id)).scalars()) == ["e-1", "e-2", "e-3"]


def test_an_event_stored_before_content_hashes_existed_is_retried_silently(client, engine) -> None:
    assert post(client, ckpt_end()).status_code == 200
    with engine.begin() as conn:
        conn.execute(text("UPDATE events SET content_hash = NULL"))  # as stored before revision 0005
    assert post(client, ckpt_end(ok=False)).json() == {"accepted": 0, "duplicates": 1}


def test_an_event_has_the_same_digest_whichever_way_its_batch_was_parsed() -> None:
    """A batch over 1 MiB is validated one event at a time (sliced); a retry may come in a smaller batch (or
    a bigger one): the same event must digest the same, or a true retry would be refused."""
    import json

    from services.collector.batch import SLICED_PARSE_MIN_BYTES, parse_batch
    from services.storage.write import content_hash

    events = [steps_record("s-1"), {**steps_record("s-2"), "lr": [1e-3, 2e-3, 3e-3], "comm": [0.1, None, 0.2]},
              ckpt_end(), {"event_id": "col", "run_id": "r", "kind": "collectives", "time": T + 4, "attempt": 0,
                           "rank": 0, "step": [1, 1], "op": ["all_reduce", "broadcast"], "start": [T + 1, T + 1.5],
                           "end": [T + 1.2, T + 1.6]}]
    filler = [{**steps_record(f"f-{i}"), "step": list(range(1, 2001)), "start": [T + s for s in range(2000)],
               "end": [T + s + 0.5 for s in range(2000)], "loss": [2.0] * 2000} for i in range(30)]
    big = json.dumps({"schema_version": 1, "events": [*events, *filler]}).encode()
    small = json.dumps({"schema_version": 1, "events": events}).encode()
    assert len(big) >= SLICED_PARSE_MIN_BYTES > len(small)

    def digests(body: bytes) -> list[str]:
        records = parse_batch(body, max_events=10_000, max_rows=1_000_000)[:len(events)]
        return [content_hash(r, json.dumps(r.data, separators=(",", ":")) if r.data else None) for r in records]

    assert digests(big) == digests(small)
    assert len(set(digests(small))) == len(events)
