"""A pruned run goes on being analysed from what retention kept (its step blocks, its control events, each rank's
first and last heartbeat): pruned any number of times while its events arrive, in random order and batches, its
ledger and views equal those of the same events never pruned; a resend of what was pruned is a duplicate, and
only what retention did not keep of a record is stored (services/storage/pruned.py)."""

from __future__ import annotations

import itertools
import json
import random
import time
from typing import Any

import numpy as np
import pytest
from sqlalchemy import Engine, text

from services.analysis.ledger import build_ledger
from services.analysis.step_blocks import extend_block, summarize_block
from services.analysis.views import build_run_views
from services.collector.batch import parse_batch
from services.derive.cache import AnalysisCache
from services.derive.retention import prune
from services.simulate import SimConfig, simulate
from services.storage.load import load_run_data
from services.storage.records import IngestResult
from services.storage.runs import get_run
from services.storage.step_blocks import load_summarised_run_data
from services.storage.step_columns import stored_step_keys
from services.storage.write import write_batches
from tests.storage.test_incremental_analysis import assert_same


def write(engine: Engine, events: list[dict[str, Any]]) -> IngestResult:
    records = parse_batch(json.dumps({"events": events}).encode(), max_events=10**6, max_rows=10**8)
    (result,) = write_batches(engine, [records])
    return result


def regrouped(events: list[dict[str, Any]], rng: random.Random) -> list[dict[str, Any]]:
    """Some compact step records sent again cut in two under new ids (a spool replay that regroups), same times."""
    out = list(events)
    for i, e in enumerate(events):
        if e["kind"] == "steps" and len(e["step"]) >= 2 and rng.random() < 0.3:
            cut = rng.randrange(1, len(e["step"]))
            for part, sl in (("a", slice(0, cut)), ("b", slice(cut, None))):
                out.append({**{k: (v[sl] if isinstance(v, list) else v) for k, v in e.items()},
                            "event_id": f"replay-{i}-{part}"})
    return out


def prune_now(engine: Engine) -> list[str]:
    """Prune every run that received nothing until now (a retention of 0.1 ms)."""
    return prune(AnalysisCache(engine), retention_days=1e-9, now=time.time() + 0.001).frozen


def analysed(engine: Engine, run_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(ledger, views) as the collector builds them (from the step blocks), run id left out."""
    with engine.connect() as conn:
        run = get_run(conn, run_id)
    data = load_summarised_run_data(engine, run)
    ledger = build_ledger(data)
    views = build_run_views(data, ledger, version=1)
    return ({k: v for k, v in ledger.model_dump(mode="json").items() if k != "run_id"},
            {k: v for k, v in views.model_dump(mode="json").items() if k != "run_id"})


def from_every_row(engine: Engine, run_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(ledger, views) recomputed from every stored row of a run that was never pruned, run id left out."""
    with engine.connect() as conn:
        data = load_run_data(conn, get_run(conn, run_id))
    ledger = build_ledger(data)
    views = build_run_views(data, ledger, version=1)
    return ({k: v for k, v in ledger.model_dump(mode="json").items() if k != "run_id"},
            {k: v for k, v in views.model_dump(mode="json").items() if k != "run_id"})


# Each step's collective seconds inline, as the client sends them. (A step reported by collective rows only, whose
# step row arrives after the run was pruned, loses its collective time: those rows went with the prune.)
CONFIGS: list[dict[str, Any]] = [
    dict(ranks=4, hours=0.05, mtbf_s=60, straggler_rank=1, jitter=0.05, end="failed", checkpoint_every=37,
         heartbeat_s=5.0),
    dict(ranks=3, hours=0.04, mtbf_s=45, straggler_rank=2, end="running", killed=True, heartbeat_s=5.0),
    dict(ranks=5, hours=0.04, mtbf_s=None, straggler_rank=0, straggler_prob=0.4, end="finished", heartbeat_s=3.0),
]


@pytest.mark.parametrize("case", range(len(CONFIGS)))
def test_a_run_pruned_while_its_events_arrive_is_analysed_as_if_never_pruned(engine: Engine, case: int) -> None:
    rng = random.Random(31 + case)
    config = SimConfig(run_id="pruned", seed=case, records_per_rank=rng.choice([3, 11, 40]), **CONFIGS[case])
    events = regrouped(simulate(config).events, rng)
    rng.shuffle(events)
    cuts = sorted(rng.sample(range(1, len(events)), 3))
    for lo, hi in itertools.pairwise([0, *cuts, len(events)]):
        for at in range(lo, hi, 40):
            assert write(engine, events[at:min(at + 40, hi)]).conflict is None
        time.sleep(0.01)
        assert prune_now(engine) == ["pruned"]  # its rows go: the next events arrive after a prune
        with engine.connect() as conn:
            assert stored_step_keys(conn, "pruned").empty
        # every event of the run so far sent again: nothing of it is stored, and the analysis stays the same
        before = analysed(engine, "pruned")
        again = write(engine, events[:hi])
        assert (again.accepted, again.duplicates) == (0, hi)
        assert analysed(engine, "pruned") == before

    ledger, views = analysed(engine, "pruned")
    whole = [{**e, "run_id": "whole"} for e in events]  # the same events, never pruned
    for at in range(0, len(whole), 500):
        assert write(engine, whole[at:at + 500]).conflict is None
    full_ledger, full_views = from_every_row(engine, "whole")
    assert_same(full_ledger, ledger, "ledger")
    assert_same(full_views, views, "views")


def test_a_resend_to_a_pruned_run_stores_only_what_retention_did_not_keep(engine: Engine) -> None:
    t0 = time.time() - 600

    def steps(event_id: str, rank: int, first: int, last: int) -> dict[str, Any]:
        n = last - first + 1
        return {"event_id": event_id, "run_id": "r", "kind": "steps", "time": t0 + last, "attempt": 0, "rank": rank,
                "step": list(range(first, last + 1)), "start": [t0 + s - 1 for s in range(first, last + 1)],
                "end": [t0 + s for s in range(first, last + 1)], "comm": [0.1] * n}

    def beat(event_id: str, rank: int, t: float) -> dict[str, Any]:
        return {"event_id": event_id, "run_id": "r", "kind": "heartbeat", "time": t0 + t, "attempt": 0, "rank": rank}

    start = {"event_id": "start", "run_id": "r", "kind": "attempt_start", "time": t0 - 5, "attempt": 0, "rank": 0,
             "world_size": 2, "host": "node0"}
    collectives = {"event_id": "coll", "run_id": "r", "kind": "collectives", "time": t0 + 10, "attempt": 0,
                   "rank": 0, "step": [9, 10], "op": ["allreduce", "allreduce"], "start": [t0 + 8.5, t0 + 9.5],
                   "end": [t0 + 8.6, t0 + 9.6]}
    first = [start, steps("s0", 0, 1, 10), steps("s1", 1, 1, 10), collectives,
             *(beat(f"hb{t}", 0, t) for t in (1, 5, 9))]
    assert write(engine, first).accepted == len(first)
    assert prune_now(engine) == ["r"]

    assert (write(engine, first).accepted, write(engine, first).duplicates) == (0, len(first))
    # a regrouped resend reaching past what was pruned, a heartbeat between the kept first and last (a late one
    # from a spool), a later one, the collectives of a step not summarised yet
    later = [steps("s0-again", 0, 8, 12), beat("hb7", 0, 7), beat("hb20", 0, 20),
             {**collectives, "event_id": "coll-13", "step": [13], "op": ["allreduce"], "start": [t0 + 12.5],
              "end": [t0 + 12.6]}]
    result = write(engine, later)
    assert (result.accepted, result.duplicates) == (3, 1)
    with engine.connect() as conn:
        keys = stored_step_keys(conn)
        stored = sorted(zip(keys["rank"].tolist(), keys["step"].tolist(), strict=True))
        assert stored == [(0, 11), (0, 12)]  # only the rows retention did not keep
        beats = sorted(conn.execute(text("SELECT time FROM events WHERE kind = 'heartbeat'")).scalars())
        assert [round(t - t0) for t in beats] == [1, 9, 20]  # the kept first and last, and the new one
        assert conn.execute(text("SELECT count(*) FROM collectives")).scalar_one() == 1
    # an event id retention kept, sent with other content, is still a conflict
    assert write(engine, [{**start, "world_size": 4}]).conflict is not None


def test_a_pruned_block_extended_with_later_rows_equals_the_block_of_all_its_rows() -> None:
    rng = np.random.default_rng(7)
    for _ in range(200):
        ranks, steps = rng.integers(1, 6), rng.integers(1, 20)
        cells = [(r, s) for r in range(ranks) for s in range(steps) if rng.random() < 0.8]
        if not cells:
            continue
        rank = np.array([c[0] for c in cells], dtype=np.int64)
        step = np.array([c[1] for c in cells], dtype=np.int64) + 256
        start = rng.uniform(0, 100, len(cells))
        end = start + rng.uniform(0.5, 2, len(cells))
        comm = np.where(rng.random(len(cells)) < 0.2, np.nan, rng.uniform(0, 0.4, len(cells)))
        pruned = rng.random(len(cells)) < 0.5
        repeat = pruned & (rng.random(len(cells)) < 0.3)  # rows of pruned cells sent again: the same times
        later = ~pruned | repeat
        base = summarize_block(1, 2, rank[pruned], step[pruned], start[pruned], end[pruned], comm[pruned]) \
            if pruned.any() else None
        extended = extend_block(base, 1, 2, rank[later], step[later], start[later], end[later], comm[later])
        whole = summarize_block(1, 2, rank, step, start, end, comm)
        assert extended is not None
        for name in ("steps", "start", "end", "ranks_per_step", "slowest", "median", "slowest_rank", "known_ranks",
                     "ranks", "compute", "known"):
            np.testing.assert_array_equal(getattr(extended, name), getattr(whole, name), err_msg=name)
        assert (extended.raw_first_start, extended.raw_last_end) == (whole.raw_first_start, whole.raw_last_end)
