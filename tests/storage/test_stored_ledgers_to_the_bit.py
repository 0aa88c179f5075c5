"""Storage changes nothing of a ledger: simulator runs of every shape, stored together in one database through the
collector's parser and writer, give the ledger built from their events in memory, to the bit (the JSON served,
compared as text), both as the collector builds it (from the step blocks, services.storage.step_blocks) and from
every stored row (services.storage.load). Whatever layout stores the steps, this holds before and after: the
guard of docs/storage.md's "the ledger is unchanged"."""

from __future__ import annotations

import json
from typing import Any

from services.analysis.ledger import build_ledger
from services.analysis.run_data import run_data_from_events
from services.collector.batch import parse_batch
from services.simulate import SimConfig, simulate
from services.storage.load import load_run_data
from services.storage.runs import get_run
from services.storage.step_blocks import load_summarised_run_data
from services.storage.write import write_batches

RUNS: list[dict[str, Any]] = [
    dict(ranks=4, hours=0.05, mtbf_s=60, straggler_rank=1, jitter=0.05, end="failed", checkpoint_every=37),
    dict(ranks=3, hours=0.04, mtbf_s=45, comm_inline=False, straggler_rank=2, end="running", killed=True),
    dict(ranks=6, hours=0.05, mtbf_s=None, straggler_rank=0, straggler_prob=0.4, jitter=0.1),
    dict(ranks=2, hours=0.06, mtbf_s=50, comm_inline=False, checkpoint_every=50),
    dict(ranks=5, hours=0.03, mtbf_s=40, collectives=False, end="running", records_per_rank=7, heartbeat_s=5.0),
    dict(ranks=4, hours=0.05, mtbf_s=300, hang_at_step=30, hang_s=120.0, detect_s=40.0, heartbeat_s=5.0),
    dict(ranks=3, gpus=5, hours=0.04, mtbf_s=80, step_s=0.3, records_per_rank=1, queue_s=30.0),
    dict(ranks=4, hours=0.05, mtbf_s=70, digest_every=10, resume_fault="loss", records_per_rank=13),
    dict(ranks=4, hours=0.05, mtbf_s=70, resume_fault="repeat", end="failed", max_failures=2),
    dict(ranks=16, hours=0.02, mtbf_s=None, ranks_per_host=4, clock_offsets={"node001": 0.4, "node003": -0.25},
         straggler_rank=9, jitter=0.02),
]


def _store(engine: Any, events: list[dict[str, Any]]) -> None:
    for at in range(0, len(events), 250):
        records = parse_batch(json.dumps({"events": events[at:at + 250]}).encode(), max_events=10**6,
                              max_rows=10**8)
        (result,) = write_batches(engine, [records])
        assert result.conflict is None and result.duplicates == 0


def test_every_simulated_run_s_stored_ledger_equals_its_events_ledger_to_the_bit(engine) -> None:
    runs = {f"bit-{i}": simulate(SimConfig(run_id=f"bit-{i}", seed=i, **config)).events
            for i, config in enumerate(RUNS)}
    for events in runs.values():  # several runs in one database: each reads only its own rows
        _store(engine, events)
    for run_id, events in runs.items():
        expected = build_ledger(run_data_from_events(run_id, events)).model_dump_json()
        with engine.connect() as conn:
            run = get_run(conn, run_id)
            from_rows = build_ledger(load_run_data(conn, run)).model_dump_json()
        from_blocks = build_ledger(load_summarised_run_data(engine, run)).model_dump_json()
        assert from_rows == expected, run_id
        assert from_blocks == expected, run_id


def test_a_resent_run_is_counted_duplicate_and_its_ledger_stays_the_same_bits(engine) -> None:
    events = simulate(SimConfig(run_id="resent", seed=11, **RUNS[0])).events
    _store(engine, events)
    records = parse_batch(json.dumps({"events": events}).encode(), max_events=10**6, max_rows=10**8)
    (result,) = write_batches(engine, [records])
    assert (result.accepted, result.duplicates) == (0, len(events))
    with engine.connect() as conn:
        run = get_run(conn, "resent")
    assert (build_ledger(load_summarised_run_data(engine, run)).model_dump_json()
            == build_ledger(run_data_from_events("resent", events)).model_dump_json())
