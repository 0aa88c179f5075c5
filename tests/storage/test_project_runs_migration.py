"""Revision 0005: a run is identified by (project, run id); existing runs keep their project and their events."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError

from services.storage.db import make_engine
from services.storage.migrate import current_revision, downgrade, head_revision, schema_drift, upgrade


def _seed_at_0004(engine) -> None:
    with engine.begin() as conn:
        for run_id, project in (("llm-exp-42", "alpha"), ("other", "default")):
            conn.execute(text("INSERT INTO runs (run_id, project, status, version, ledger_version) "
                              "VALUES (:run_id, :project, 'running', 3, -1)"), {"run_id": run_id, "project": project})
            pk = conn.execute(text("SELECT id FROM runs WHERE run_id = :r"), {"r": run_id}).scalar_one()
            conn.execute(text("INSERT INTO events (run_pk, event_id, kind, time) "
                              "VALUES (:pk, 'e1', 'run_submitted', 1.7e9)"), {"pk": pk})
            conn.execute(text("INSERT INTO steps (run_pk, attempt, rank, step, start_time, end_time) "
                              "VALUES (:pk, 0, 0, 1, 1.7e9, 1.7e9 + 1)"), {"pk": pk})
            conn.execute(text("INSERT INTO run_views (run_pk, version, analysed_at, analysis_seconds, ledger_json, "
                              "views_json) VALUES (:pk, 3, 1.7e9, 0.1, '{}', '{}')"), {"pk": pk})
            conn.execute(text("INSERT INTO checkpoint_requests (run_pk, requested_at) VALUES (:pk, 1.7e9)"),
                         {"pk": pk})


def _counts(engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {t: conn.execute(text(f"SELECT COUNT(*) FROM {t}")).scalar_one()
                for t in ("runs", "events", "steps", "run_views", "checkpoint_requests")}


def test_upgrade_keeps_every_run_with_its_project_and_every_row_that_references_it(database_url: str) -> None:
    engine = make_engine(database_url)
    upgrade(engine, "0004")
    _seed_at_0004(engine)
    before = _counts(engine)
    upgrade(engine)
    assert current_revision(engine) == head_revision() and schema_drift(engine) == []
    assert _counts(engine) == before == {"runs": 2, "events": 2, "steps": 2, "run_views": 2, "checkpoint_requests": 2}
    with engine.connect() as conn:
        runs = conn.execute(text("SELECT run_id, project, version FROM runs ORDER BY id")).all()
        assert [tuple(r) for r in runs] == [("llm-exp-42", "alpha", 3), ("other", "default", 3)]
        linked = conn.execute(text("SELECT r.run_id, COUNT(*) FROM events e JOIN runs r ON r.id = e.run_pk "
                                   "JOIN steps s ON s.run_pk = r.id GROUP BY r.run_id ORDER BY r.run_id")).all()
        assert [tuple(r) for r in linked] == [("llm-exp-42", 1), ("other", 1)]  # the same pks as before
        assert conn.execute(text("SELECT content_hash FROM events")).scalars().all() == [None, None]
        if conn.dialect.name == "sqlite":
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1  # switched back on afterwards
    with engine.begin() as conn:  # another project may now use the same run id; the same project may not
        conn.execute(text("INSERT INTO runs (run_id, project, status, version, ledger_version) "
                          "VALUES ('llm-exp-42', 'beta', 'running', 0, -1)"))
    with pytest.raises(IntegrityError), engine.begin() as conn:
        conn.execute(text("INSERT INTO runs (run_id, project, status, version, ledger_version) "
                          "VALUES ('llm-exp-42', 'alpha', 'running', 0, -1)"))
    assert {ix["name"] for ix in inspect(engine).get_unique_constraints("runs")} == {"uq_runs_run_id_project"}
    engine.dispose()


def test_downgrade_restores_unique_run_ids_and_keeps_the_data(database_url: str) -> None:
    engine = make_engine(database_url)
    upgrade(engine, "0004")
    _seed_at_0004(engine)
    upgrade(engine)
    downgrade(engine, "0004")
    assert current_revision(engine) == "0004"
    assert _counts(engine) == {"runs": 2, "events": 2, "steps": 2, "run_views": 2, "checkpoint_requests": 2}
    assert "content_hash" not in {c["name"] for c in inspect(engine).get_columns("events")}
    with pytest.raises(IntegrityError), engine.begin() as conn:
        conn.execute(text("INSERT INTO runs (run_id, project, status, version, ledger_version) "
                          "VALUES ('llm-exp-42', 'beta', 'running', 0, -1)"))
    engine.dispose()


def test_downgrade_is_refused_while_two_projects_share_a_run_id(database_url: str) -> None:
    engine = make_engine(database_url)
    upgrade(engine)
    with engine.begin() as conn:
        for project in ("alpha", "beta"):
            conn.execute(text("INSERT INTO runs (run_id, project, status, version, ledger_version) "
                              "VALUES ('shared', :p, 'running', 0, -1)"), {"p": project})
    with pytest.raises(RuntimeError, match="'shared'"):
        downgrade(engine, "0004")
    assert current_revision(engine) == head_revision() and _counts(engine)["runs"] == 2
    engine.dispose()


def test_on_sqlite_the_rebuild_refuses_to_run_while_foreign_keys_would_cascade(tmp_path) -> None:
    from alembic import command

    from services.storage.migrate import alembic_config

    engine = make_engine(f"sqlite:///{tmp_path / 'fk.db'}")
    upgrade(engine, "0004")
    _seed_at_0004(engine)
    config = alembic_config(engine)
    with pytest.raises(RuntimeError, match="delete every event"), engine.begin() as conn:  # foreign keys on
        config.attributes["connection"] = conn
        command.upgrade(config, "head")
    assert current_revision(engine) == "0004" and _counts(engine)["events"] == 2
    engine.dispose()
