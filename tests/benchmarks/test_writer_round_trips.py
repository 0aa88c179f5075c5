"""benchmarks.writer_round_trips: its proxy forwards PostgreSQL's conversation whole and late (a group written through
it stores every step once, and each round trip takes at least the two delays), and its counter counts the driver's
read waits and leaves psycopg as it found it."""

from __future__ import annotations

import time

import psycopg
from sqlalchemy import text

from benchmarks.writer_gil import REQUESTS_PER_GROUP, request_bodies
from benchmarks.writer_round_trips import ReadWaits, delaying_proxy, round_trip_s, write_timed
from services.storage.db import make_engine
from tests.conftest import migrated_engine

DELAY_S = 0.005


def test_through_the_proxy_every_step_is_stored_once_and_each_round_trip_waits_both_delays(postgres_url: str) -> None:
    with migrated_engine(postgres_url):
        pass
    with delaying_proxy(postgres_url, DELAY_S) as delayed_url:
        assert round_trip_s(delayed_url, trips=10) >= 2 * DELAY_S
        wall, waits = write_timed(delayed_url, 2, request_bodies(time.time() - 3600))
    assert wall >= 2 * DELAY_S * 3 and waits >= 3  # a group is a few round trips, none of them free
    engine = make_engine(postgres_url)
    try:
        with engine.connect() as conn:
            rows, distinct = conn.execute(text(
                "SELECT count(*), (SELECT count(*) FROM (SELECT DISTINCT rank, step FROM steps) d) FROM steps")).one()
    finally:
        engine.dispose()
    assert rows == distinct == (10 + 2) * REQUESTS_PER_GROUP * 2  # the 10 warm-up groups too, two steps a request


def test_the_read_waits_are_counted_and_the_driver_is_restored(postgres_url: str) -> None:
    original = psycopg.Connection.wait
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        with ReadWaits() as waits:
            for _ in range(3):
                conn.execute("SELECT 1")
        assert waits.count >= 3
    assert psycopg.Connection.wait is original
