"""OneTrip: statements sent to PostgreSQL in one message give each its row count, in order, store values bound by
the client exactly as server-side binding would (doubles to the bit, -0.0, quotes, NULL), and fail whole."""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator

import pytest
from sqlalchemy import Connection, text

from services.storage.db import make_engine
from services.storage.one_trip import OneTrip
from tests.conftest import create_postgres_database, drop_postgres_database

INSERT = "INSERT INTO t (id, x, s) VALUES (%s, %s, %s)"
TRICKY = [0.1 + 0.2, -0.0, 5e-324, 1.7976931348623157e308, 1e-300 / 3, 1777000000.123456789, -2.5e-7]


@pytest.fixture
def conn(postgres_admin_url: str) -> Iterator[Connection]:
    url = create_postgres_database(postgres_admin_url)
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            connection.execute(text("CREATE TABLE t (id int PRIMARY KEY, x float8, s text)"))
            connection.commit()
            yield connection
    finally:
        engine.dispose()
        drop_postgres_database(postgres_admin_url, url)


def _bits(x: float) -> bytes:
    return struct.pack("<d", x)


def test_each_statement_gives_its_row_count_in_order(conn: Connection) -> None:
    trip = OneTrip()
    first = trip.add(INSERT, (1, 1.0, "a"))
    second = trip.add("UPDATE t SET x = %s WHERE id = %s", (2.0, 99))  # no such row: 0
    third = trip.add("UPDATE t SET x = x + %s WHERE id >= %s", (1.0, 0))
    counts = trip.send(conn)
    assert (counts[first], counts[second], counts[third]) == (1, 0, 1)
    assert trip.send(conn) == []  # sent statements are not sent again
    assert conn.execute(text("SELECT x FROM t")).scalar_one() == 2.0


def test_values_bound_by_the_client_are_stored_exactly(conn: Connection) -> None:
    trip = OneTrip()
    for i, x in enumerate(TRICKY):
        trip.add(INSERT, (i, x, "it's; a \\ 'quoted' %s value"))
    trip.add(INSERT, (len(TRICKY), None, None))
    assert trip.send(conn) == [1] * (len(TRICKY) + 1)
    rows = {i: x for i, x in conn.execute(text("SELECT id, x FROM t WHERE x IS NOT NULL")).all()}
    assert [_bits(rows[i]) for i in range(len(TRICKY))] == [_bits(x) for x in TRICKY]
    assert math.copysign(1.0, rows[1]) == -1.0
    assert conn.execute(text("SELECT x, s FROM t WHERE id = :i"), {"i": len(TRICKY)}).one() == (None, None)
    assert set(conn.execute(text("SELECT s FROM t WHERE s IS NOT NULL")).scalars()) == {
        "it's; a \\ 'quoted' %s value"}


def test_a_failing_statement_fails_the_whole_message(conn: Connection) -> None:
    conn.execute(text("INSERT INTO t (id) VALUES (7)"))
    conn.commit()
    trip = OneTrip()
    trip.add(INSERT, (1, 1.0, "kept?"))
    trip.add(INSERT, (7, 2.0, "duplicate key"))
    with pytest.raises(Exception, match="duplicate key"), conn.begin():  # the writer's transaction, rolled back
        trip.send(conn)
    assert conn.execute(text("SELECT id FROM t")).scalars().all() == [7]
