"""Revision 0006: a run's ledger is stored once (in `runs`); the views' copy is folded in, then dropped."""

from __future__ import annotations

from sqlalchemy import inspect, text

from services.storage.db import make_engine
from services.storage.migrate import downgrade, schema_drift, upgrade

RUNS = ("INSERT INTO runs (id, run_id, project, status, version, ledger_version, ledger_json) VALUES "
        "(1, 'views-newer', 'default', 'running', 5, 3, '{\"v\": 3}'), "
        "(2, 'same', 'default', 'finished', 4, 4, '{\"v\": 4}'), "
        "(3, 'views-older', 'default', 'running', 3, 3, '{\"v\": 3}')")
VIEWS = ("INSERT INTO run_views (run_pk, version, analysed_at, analysis_seconds, ledger_json, views_json) VALUES "
         "(1, 4, 0, 0, '{\"v\": 4}', '{}'), (2, 4, 0, 0, '{\"v\": 4}', '{}'), (3, 2, 0, 0, '{\"v\": 2}', '{}')")


def ledgers(engine) -> dict[str, tuple[int, str]]:
    with engine.connect() as conn:
        return {r[0]: (r[1], r[2]) for r in conn.execute(text("SELECT run_id, ledger_version, ledger_json FROM runs"))}


def test_the_views_ledger_moves_to_the_run_when_newer_and_comes_back_on_downgrade(database_url: str) -> None:
    engine = make_engine(database_url)
    upgrade(engine, "0005")
    with engine.begin() as conn:
        conn.execute(text(RUNS))
        conn.execute(text(VIEWS))

    upgrade(engine, "0006")
    assert "ledger_json" not in {c["name"] for c in inspect(engine).get_columns("run_views")}
    assert ledgers(engine) == {"views-newer": (4, '{"v": 4}'), "same": (4, '{"v": 4}'),
                               "views-older": (3, '{"v": 3}')}

    downgrade(engine, "0005")
    with engine.connect() as conn:
        views = {int(pk): str(ledger) for pk, ledger in conn.execute(text("SELECT run_pk, ledger_json FROM run_views"))}
    # views of the run's ledger version get it back; the others are dropped (rebuilt on demand)
    assert views == {1: '{"v": 4}', 2: '{"v": 4}'}
    upgrade(engine)
    assert schema_drift(engine) == []
    engine.dispose()
