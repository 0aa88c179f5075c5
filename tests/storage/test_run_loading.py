"""What the database gives back to the analysis core equals what was sent (both backends)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from services.analysis.run_data import run_data_from_events
from services.collector.batch import parse_batch
from services.simulate import SimConfig, simulate
from services.storage.load import load_run_data
from services.storage.runs import get_run
from services.storage.writer import BatchWriter


def test_stored_run_loads_back_identically(engine) -> None:
    result = simulate(SimConfig(run_id="roundtrip", hours=0.05, mtbf_s=120, seed=3, straggler_rank=2, jitter=0.1,
                               comm_inline=False))
    writer = BatchWriter(engine)
    writer.start()
    try:
        records = parse_batch(json.dumps({"events": result.events}).encode(), max_events=10**6, max_rows=10**8)
        ack = writer.submit(records).result(timeout=60)
    finally:
        writer.stop()
    assert ack.accepted == len(result.events)
    with engine.connect() as conn:
        stored = load_run_data(conn, get_run(conn, "roundtrip"), detail=True)
        summed = load_run_data(conn, get_run(conn, "roundtrip"))
    sent = run_data_from_events("roundtrip", result.events)
    key = ["attempt", "rank", "step"]
    a = stored.steps.sort_values(key).reset_index(drop=True)
    b = sent.steps.sort_values(key).reset_index(drop=True)
    for column in ("attempt", "rank", "step", "start", "end", "loss", "lr"):
        np.testing.assert_array_equal(a[column].to_numpy(), b[column].to_numpy())
    assert np.isnan(a["comm"]).all()
    assert len(stored.collectives) == len(sent.collectives)
    # the default load sums collective time per (attempt, rank, step) in the database
    expected = (sent.collectives["end"] - sent.collectives["start"]).groupby(
        [sent.collectives["attempt"], sent.collectives["rank"], sent.collectives["step"]]).sum()
    assert summed.comm is not None
    got = summed.comm.set_index(["attempt", "rank", "step"])["seconds"].sort_index()
    np.testing.assert_allclose(got.to_numpy(), expected.sort_index().to_numpy(), rtol=1e-12)
    assert summed.collectives.empty and np.isnan(summed.steps["loss"]).all()
    assert sorted(stored.events["kind"]) == sorted(sent.events["kind"])


def test_steps_with_their_own_comm_give_the_same_ledger_as_collective_rows(engine) -> None:
    from services.analysis.ledger import build_ledger

    ledgers = []
    for inline in (True, False):
        run_id = f"comm-{inline}"
        result = simulate(SimConfig(run_id=run_id, hours=0.05, mtbf_s=150, seed=4, straggler_rank=1, jitter=0.1,
                                    comm_inline=inline))
        writer = BatchWriter(engine)
        writer.start()
        try:
            writer.submit(parse_batch(json.dumps({"events": result.events}).encode(), max_events=10**6,
                                      max_rows=10**8)).result(timeout=60)
        finally:
            writer.stop()
        with engine.connect() as conn:
            ledgers.append(build_ledger(load_run_data(conn, get_run(conn, run_id))))
    a, b = ledgers
    assert a.waste_gpu_seconds.straggler > 0
    assert a.allocated_gpu_seconds == pytest.approx(b.allocated_gpu_seconds, rel=1e-9)
    assert a.productive_gpu_seconds == pytest.approx(b.productive_gpu_seconds, rel=1e-9)
    assert a.waste_gpu_seconds.model_dump() == pytest.approx(b.waste_gpu_seconds.model_dump(), rel=1e-9)
