"""Load a run and build its straggler report, kept per (run, version) like the dashboard's views."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine

from services.analysis.straggler_report import build_straggler_report
from services.derive.ledger import ledger_for_row
from services.storage.load import RunRef, get_run, load_run_data
from services.derive.version_cache import VersionCache

_CACHE = VersionCache(capacity=16)


def straggler_report(engine: Engine, ref: RunRef) -> dict[str, Any]:
    with engine.connect() as conn:
        run = get_run(conn, ref)
    cached = _CACHE.get(run.ref, run.version)
    if cached is not None:
        return cached
    ledger = ledger_for_row(engine, run)
    with engine.connect() as conn:
        data = load_run_data(conn, run)
    report = build_straggler_report(data, ledger)
    _CACHE.put(run.ref, run.version, report)
    return report
