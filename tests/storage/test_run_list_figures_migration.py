"""Revision 0012 stores the figures the run lists show with each stored ledger: upgrading copies them out of the
ledgers stored before it, the same values as the collector stores with a ledger it builds; downgrading drops them."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from services.analysis.run_figures import RunFigures, usage_from_bytes
from services.collector.app import create_app
from services.storage.migrate import current_revision, downgrade, head_revision, schema_drift, upgrade
from tests.collector.test_run_list_figures import fleet, post, stored_figures


def test_revision_0012_copies_the_figures_out_of_ledgers_stored_before_it(settings: Any, engine: Engine) -> None:
    with TestClient(create_app(settings, engine=engine)) as client:
        post(client, fleet())
        client.get("/v1/runs")  # stores every ledger with its figures
    stored = stored_figures(engine)
    assert len(stored) == 6
    downgrade(engine, "0011")
    with engine.connect() as conn:
        columns = conn.execute(text("SELECT * FROM runs")).keys()
    assert "figures_json" not in columns and "usage_bytes" not in columns
    upgrade(engine)
    assert current_revision(engine) == head_revision() and schema_drift(engine) == []
    copied = stored_figures(engine)
    assert set(copied) == set(stored)
    for run_id, (figures_json, usage) in stored.items():
        figures = RunFigures.model_validate_json(figures_json)
        assert RunFigures.model_validate_json(copied[run_id][0]) == figures
        assert copied[run_id][1] == usage  # the same doubles, in the same order
        pieces = usage_from_bytes(figures, usage)
        assert pieces is not None and len(pieces.start) > 0


def test_revision_0014_copies_the_running_tail_into_the_figures(settings: Any, engine: Engine) -> None:
    with TestClient(create_app(settings, engine=engine)) as client:
        post(client, fleet())
        client.get("/v1/runs")
    stored = stored_figures(engine)
    tails = {run_id: RunFigures.model_validate_json(f).running_tail for run_id, (f, _) in stored.items()}
    assert tails["stalled"] is not None  # a running run has one
    downgrade(engine, "0013")
    for figures_json, _ in stored_figures(engine).values():
        assert not RunFigures.model_validate_json(figures_json).knows_running_tail  # hung runs: their whole ledger
    upgrade(engine)
    for run_id, (figures_json, _) in stored_figures(engine).items():
        figures = RunFigures.model_validate_json(figures_json)
        assert figures.knows_running_tail and figures.running_tail == tails[run_id]
