"""benchmarks.writer_gil writes what `benchmarks.requests` posts (wrk's bodies), every step once, and its busy thread
stops when asked."""

from __future__ import annotations

import time

from sqlalchemy import Engine, text

from benchmarks.writer_gil import REQUESTS_PER_GROUP, BusyThread, request_bodies, write_groups
from services.settings import ServiceSettings


def test_the_groups_store_every_step_of_every_request_once(engine: Engine) -> None:
    bodies = request_bodies(time.time() - 3600)
    known_runs: dict[tuple[str, str], int] = {}
    with engine.connect() as conn:
        wall, cpu = write_groups(conn, bodies, 3, ServiceSettings(), known_runs)
        stored = conn.execute(text("SELECT count(*), (SELECT count(*) FROM (SELECT DISTINCT rank, step FROM steps) d) "
                                   "FROM steps")).one()
    assert wall > 0 and cpu > 0
    assert tuple(stored) == (3 * REQUESTS_PER_GROUP * 2, 3 * REQUESTS_PER_GROUP * 2)  # two steps a request


def test_the_busy_thread_runs_until_its_block_ends() -> None:
    with BusyThread() as busy:
        assert busy._thread.is_alive()
    assert not busy._thread.is_alive()
