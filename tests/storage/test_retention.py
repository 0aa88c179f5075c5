"""Retention of raw rows: day partitions created ahead and dropped (PostgreSQL), rows deleted (SQLite), never a row of
a run that is still going or of a day after the cutoff."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from sqlalchemy import Engine, insert, select, text

from services.derive.cache import AnalysisCache
from services.derive.retention import prune
from services.storage.retention import DAY_S, day_of, day_partitions, ensure_partitions, partition_name
from services.storage.tables import Event, Run, collectives, steps

NOW = 1_798_000_000.0  # 2026-12-23, a fixed clock: partitions and cutoffs do not depend on when the test runs


def add_run(engine: Engine, run_id: str, *, received_at: float, step_ends: list[float]) -> int:
    """A run with raw rows only (one rank), received last at `received_at`; its analyses are stored by prune."""
    with engine.begin() as conn:
        pk = int(conn.execute(insert(Run).values(run_id=run_id, project="default", status="finished", version=1,
                                                 received_at=received_at, first_time=step_ends[0] - 1,
                                                 last_time=step_ends[-1]).returning(Run.id)).scalar_one())
        conn.execute(insert(steps), [{"run_pk": pk, "attempt": 0, "rank": 0, "step": k + 1, "start_time": end - 0.5,
                                      "end_time": end} for k, end in enumerate(step_ends)])
        conn.execute(insert(collectives), [{"run_pk": pk, "attempt": 0, "rank": 0, "step": k + 1, "op": "allreduce",
                                            "start_time": end - 0.2, "end_time": end - 0.1}
                                           for k, end in enumerate(step_ends)])
        conn.execute(insert(Event), [{"run_pk": pk, "event_id": f"hb{k}", "kind": "heartbeat", "time": end,
                                      "attempt": 0, "rank": 0} for k, end in enumerate(step_ends)])
        conn.execute(insert(Event), [{"run_pk": pk, "event_id": "start", "kind": "attempt_start",
                                      "time": step_ends[0] - 1, "attempt": 0, "rank": 0,
                                      "data": '{"world_size": 1}'}])
    return pk


def counts(engine: Engine, pk: int) -> dict[str, int]:
    with engine.connect() as conn:
        tables = ("steps", "step_columns", "collectives", "events", "step_marks", "step_blocks")
        return {table: int(conn.execute(text(f"SELECT count(*) FROM {table} WHERE run_pk = :pk"), {"pk": pk}).scalar()
                           or 0) for table in tables}


def test_partitions_are_created_ahead_and_a_row_outside_them_still_lands(engine: Engine) -> None:
    if engine.dialect.name != "postgresql":
        pytest.skip("SQLite keeps plain tables (retention deletes rows)")
    with engine.begin() as conn:
        created = ensure_partitions(conn, now=NOW, ahead_days=3)
        assert ensure_partitions(conn, now=NOW, ahead_days=3) == []  # idempotent
    today = day_of(NOW)
    assert sorted(created) == sorted(partition_name(t, d) for t in ("steps", "step_columns", "collectives")
                                     for d in range(today, today + 4))
    # a step far ahead goes to the DEFAULT partition; creating its day later moves it into the new partition
    pk = add_run(engine, "far-ahead", received_at=NOW, step_ends=[NOW + 10 * DAY_S])
    with engine.begin() as conn:
        assert conn.execute(text("SELECT count(*) FROM steps_default")).scalar() == 1
        ensure_partitions(conn, now=NOW + 10 * DAY_S, ahead_days=0)
        assert conn.execute(text("SELECT count(*) FROM steps_default")).scalar() == 0
        name = partition_name("steps", today + 10)
        assert conn.execute(text(f'SELECT count(*) FROM "{name}"')).scalar() == 1
    assert counts(engine, pk)["steps"] == 1


def test_retention_drops_old_partitions_and_rows_without_touching_newer_rows_or_runs_still_going(
        engine: Engine) -> None:
    postgres = engine.dialect.name == "postgresql"
    day = day_of(NOW)
    with engine.begin() as conn:
        ensure_partitions(conn, now=NOW - 45 * DAY_S, days=range(day - 45, day + 1))
    old_day = NOW - 40 * DAY_S
    quiet = add_run(engine, "quiet", received_at=old_day, step_ends=[old_day + k for k in range(1, 6)])
    # started 40 days ago, still receiving: its old rows share the dropped partition and must survive
    going = add_run(engine, "going", received_at=NOW - 60, step_ends=[old_day + 7, old_day + 8, NOW - 120])
    newer = add_run(engine, "newer", received_at=NOW - 5 * DAY_S, step_ends=[NOW - 5 * DAY_S + k for k in range(3)])
    before = {pk: counts(engine, pk) for pk in (going, newer)}

    analyses = AnalysisCache(engine)
    dry = prune(analyses, retention_days=30, now=NOW, dry_run=True)
    assert dry.candidates == ["quiet"] and counts(engine, quiet)["steps"] == 5  # a dry run changes nothing
    if postgres:
        assert partition_name("steps", day_of(old_day)) in dry.plan.partitions  # type: ignore[union-attr]

    result = prune(analyses, retention_days=30, now=NOW)
    assert result.frozen == ["quiet"] and result.left_whole == []
    assert not analyses.summaries.holds(quiet)  # built to be frozen, then dropped from the process's cache
    # attempt_start is kept, and the rank's first and last heartbeat (what the analysis reads of them)
    assert counts(engine, quiet) == {"steps": 0, "step_columns": 0, "collectives": 0, "events": 3, "step_marks": 0,
                                     "step_blocks": 0}
    assert {pk: counts(engine, pk) for pk in (going, newer)} == before
    with engine.connect() as conn:
        pruned_at = dict(conn.execute(select(Run.run_id, Run.detail_pruned_at)).all())
        assert pruned_at == {"quiet": NOW, "going": None, "newer": None}
        ledger = conn.execute(select(Run.ledger_json).where(Run.id == quiet)).scalar()
        assert ledger is not None and '"run_id":"quiet"' in ledger  # analysed before its rows went
        products = conn.execute(text("SELECT product FROM run_products WHERE run_pk = :pk"), {"pk": quiet}).scalars()
        assert sorted(products) == ["live-tail", "resume-check", "stragglers"]
        if postgres:
            kept_days = set(day_partitions(conn, "steps"))
            assert all(d >= day_of(NOW - 30 * DAY_S) - 1 for d in kept_days)  # every day before the cutoff dropped
            assert day_of(NOW - 5 * DAY_S) in kept_days and day in kept_days
            assert set(result.pruned.partitions_dropped) >= {  # type: ignore[union-attr]
                partition_name("steps", day_of(old_day)), partition_name("collectives", day_of(old_day))}
            # the going run's two old steps were moved to the DEFAULT partition, not lost
            assert conn.execute(text("SELECT count(*) FROM steps_default WHERE run_pk = :pk"),
                                {"pk": going}).scalar() == 2

    again = prune(analyses, retention_days=30, now=NOW)  # nothing left to do
    assert again.frozen == [] and again.candidates == []


def test_retention_zero_keeps_everything(engine: Engine) -> None:
    pk = add_run(engine, "quiet", received_at=NOW - 400 * DAY_S, step_ends=[NOW - 400 * DAY_S + 1])
    result: Any = prune(AnalysisCache(engine), retention_days=0, now=NOW)
    assert result.cutoff is None and counts(engine, pk)["steps"] == 1


def test_rows_a_pruned_run_receives_later_are_kept_until_they_are_summarised_and_pruned_in_turn(
        engine: Engine) -> None:
    """A pruned run written again (its last steps after a quiet month, a late sync) has rows its step blocks do not
    hold yet: a prune while it is going keeps them, also in a day partition it drops; the next one, once the run
    is quiet again, summarises them onto the kept blocks and deletes them."""
    from services.collector.batch import parse_batch
    from services.storage.write import write_batches

    day = day_of(NOW)
    with engine.begin() as conn:
        ensure_partitions(conn, now=NOW - 45 * DAY_S, days=range(day - 45, day + 1))
    def write(event_id: str, steps: list[int], t0: float, received_at: float) -> int:
        """Steps 0.5 s long, one a second from `t0`, through the collector's writer (step blocks marked), the run
        received at `received_at`."""
        event = {"event_id": event_id, "run_id": "late", "kind": "steps", "time": t0 + len(steps), "attempt": 0,
                 "rank": 0, "step": steps, "start": [t0 + k + 0.5 for k in range(len(steps))],
                 "end": [t0 + k + 1 for k in range(len(steps))]}
        records = parse_batch(json.dumps({"events": [event]}).encode(), max_events=10, max_rows=100)
        assert write_batches(engine, [records])[0].accepted == 1
        with engine.begin() as conn:
            conn.execute(text("UPDATE runs SET received_at = :t WHERE run_id = 'late'"), {"t": received_at})
            return int(conn.execute(text("SELECT id FROM runs WHERE run_id = 'late'")).scalar_one())

    old_day = NOW - 40 * DAY_S
    pk = write("first", [1, 2, 3, 4, 5], old_day, received_at=old_day)
    assert prune(AnalysisCache(engine), retention_days=30, now=NOW).frozen == ["late"]
    assert counts(engine, pk)["steps"] == 0

    # steps 6-7, stamped 35 days ago (in a partition the next prune drops), received a minute before NOW
    late_day = NOW - 35 * DAY_S
    with engine.begin() as conn:
        ensure_partitions(conn, now=NOW, days=[day_of(late_day)])
    write("late-steps", [6, 7], late_day, received_at=NOW - 60)
    result = prune(AnalysisCache(engine), retention_days=30, now=NOW)
    assert result.candidates == [] and counts(engine, pk)["steps"] == 2
    if engine.dialect.name == "postgresql":
        assert partition_name("steps", day_of(late_day)) in result.pruned.partitions_dropped  # type: ignore[union-attr]

    later = NOW + 31 * DAY_S
    assert prune(AnalysisCache(engine), retention_days=30, now=later).frozen == ["late"]
    assert counts(engine, pk)["steps"] == 0
    with engine.connect() as conn:
        stored = conn.execute(select(Run.ledger_json).where(Run.id == pk)).scalar_one()
    assert stored is not None
    ledger = json.loads(stored)
    # steps 1-5 (pruned first) and 6-7 (received after), each 0.5 s on one GPU
    assert ledger["productive_gpu_seconds"] == pytest.approx(7 * 0.5)


@pytest.mark.parametrize("days", [math.nan, math.inf, -1.0])
def test_a_retention_that_is_not_a_finite_number_of_days_touches_nothing(engine: Engine, days: float) -> None:
    pk = add_run(engine, "quiet", received_at=NOW - 40 * DAY_S, step_ends=[NOW - 40 * DAY_S + k for k in range(3)])
    with pytest.raises(ValueError, match=r"retention_days must be a finite number of days >= 0"):
        prune(AnalysisCache(engine), retention_days=days, now=NOW)
    assert counts(engine, pk)["steps"] == 3
    with engine.connect() as conn:
        assert conn.execute(select(Run.detail_pruned_at).where(Run.id == pk)).scalar_one() is None
        if engine.dialect.name == "postgresql":  # not even the coming partitions
            assert day_of(NOW) not in day_partitions(conn, "steps")


@pytest.mark.parametrize(("variable", "value"), [
    ("GOODPUT_RAW_RETENTION_DAYS", "nan"), ("GOODPUT_RAW_RETENTION_DAYS", "inf"),
    ("GOODPUT_RAW_RETENTION_DAYS", "-1"), ("GOODPUT_PRUNE_INTERVAL_S", "nan"), ("GOODPUT_PRUNE_INTERVAL_S", "inf"),
    ("GOODPUT_PRUNE_INTERVAL_S", "-5"),
])
def test_the_collector_refuses_a_retention_setting_that_is_not_a_finite_number(
        monkeypatch: pytest.MonkeyPatch, engine: Engine, variable: str, value: str) -> None:
    from pydantic import ValidationError

    from services.derive.retention import PruneJob
    from services.settings import ServerSettings

    monkeypatch.setenv(variable, value)
    with pytest.raises(ValidationError, match=rf"{variable} must be a finite number of (days|seconds) >= 0"):
        ServerSettings()
    # the collector's job, made without the settings, holds the same rule
    name = "retention_days" if variable == "GOODPUT_RAW_RETENTION_DAYS" else "interval_s"
    kwargs = {"retention_days": 30.0, "interval_s": 3600.0, name: float(value)}
    with pytest.raises(ValueError, match=rf"{variable} must be a finite number"):
        PruneJob(AnalysisCache(engine), **kwargs)
