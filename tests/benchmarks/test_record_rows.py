"""benchmarks.record_rows writes the same steps both ways: the record rows hold what today's `steps` rows hold."""

from __future__ import annotations

import numpy as np
import psycopg

from benchmarks._common import postgres_database
from benchmarks.record_rows import RECORDS_PER_GROUP, STEPS_PER_RECORD, Fleet, driver_url, prepare, write_groups


def test_both_ways_store_every_step_of_every_record_once() -> None:
    with postgres_database() as url:
        run_pks = prepare(url)
        fleet = Fleet(run_pks, seed=7)
        groups = [fleet.group() for _ in range(3)]
        made = sorted((pk, rank, int(step), float(start), float(end)) for group in groups
                      for pk, _, _, rank, steps, starts, ends, _ in group
                      for step, start, end in zip(steps, starts, ends, strict=True))
        with psycopg.connect(driver_url(url)) as conn:
            write_groups(conn, "today", groups)
            write_groups(conn, "records", groups)
            today = sorted(conn.execute("SELECT run_pk, rank, step, start_time, end_time FROM steps").fetchall())
            events = conn.execute("SELECT count(*) FROM events WHERE kind = 'steps'").fetchone()
            records = []
            for pk, rank, first, last, columns in conn.execute(
                    "SELECT run_pk, rank, first_step, last_step, columns FROM step_records"):
                steps, starts, ends = np.frombuffer(columns, dtype=np.float64).reshape(6, -1)[:3]
                steps = steps.view(np.int64)
                assert (int(steps[0]), int(steps[-1])) == (first, last)
                records += [(pk, rank, int(s), float(a), float(b)) for s, a, b in zip(steps, starts, ends, strict=True)]
    assert len(made) == 3 * RECORDS_PER_GROUP * STEPS_PER_RECORD
    assert today == made
    assert sorted(records) == made
    assert events == (3 * RECORDS_PER_GROUP,)
