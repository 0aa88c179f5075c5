"""services.storage.pgarrays: a query's numeric columns read as one binary array each come back bit for bit, in the
query's row order and aligned row by row, from no rows to many; what the format cannot carry (a NULL, a width
other than the one named) is refused, not misread."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pytest
from sqlalchemy import Connection, Engine

from services.storage.db import make_engine, psycopg_connection
from services.storage.pgarrays import decode_array, read_columns
from tests.conftest import create_postgres_database, drop_postgres_database

COLUMNS = {"rank": ">i4", "step": ">i8", "value": ">f8"}
AWKWARD = [0.0, -0.0, math.nan, math.inf, -math.inf, 5e-324, 1.7976931348623157e308, 0.1 + 0.2, -1 / 3]


@pytest.fixture
def engine(postgres_admin_url: str) -> Iterator[Engine]:
    url = create_postgres_database(postgres_admin_url)
    engine = make_engine(url)
    try:
        yield engine
    finally:
        engine.dispose()
        drop_postgres_database(postgres_admin_url, url)


def _table(conn: Connection, rows: list[tuple[int, int, float]]) -> None:
    with psycopg_connection(conn).cursor() as cursor:
        cursor.execute("CREATE TEMPORARY TABLE t (n serial, rank int4 NOT NULL, step int8 NOT NULL, "
                       "value float8 NOT NULL)")
        cursor.executemany("INSERT INTO t (rank, step, value) VALUES (%s, %s, %s)", rows)


def test_every_value_comes_back_bit_for_bit_in_the_querys_order(engine: Engine) -> None:
    rng = np.random.default_rng(7)
    rows = [(int(r), int(s), float(v)) for r, s, v in zip(
        rng.integers(-2**31, 2**31, 5000), rng.integers(-2**63, 2**63 - 1, 5000, dtype=np.int64),
        np.concatenate([AWKWARD, rng.standard_normal(5000 - len(AWKWARD)) * 1e6]), strict=True)]
    rows += [(2**31 - 1, 2**63 - 1, 1.0), (-2**31, -2**63, -1.0)]
    with engine.begin() as conn:
        _table(conn, rows)
        rank, step, value = read_columns(conn, "SELECT rank, step, value FROM t ORDER BY n DESC", COLUMNS)
    expected = rows[::-1]
    assert rank.dtype == np.int32 and step.dtype == np.int64 and value.dtype == np.float64
    assert rank.dtype.isnative and step.dtype.isnative and value.dtype.isnative
    assert rank.tolist() == [r for r, _, _ in expected]
    assert step.tolist() == [s for _, s, _ in expected]
    assert value.view(np.uint64).tolist() == np.array([v for _, _, v in expected]).view(np.uint64).tolist()


def test_a_query_without_rows_gives_empty_columns_of_their_types(engine: Engine) -> None:
    with engine.begin() as conn:
        _table(conn, [(1, 2, 3.0)])
        rank, step, value = read_columns(conn, "SELECT rank, step, value FROM t WHERE false", COLUMNS)
    assert (len(rank), len(step), len(value)) == (0, 0, 0)
    assert (rank.dtype, step.dtype, value.dtype) == (np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.float64))


def test_a_null_is_refused_not_read_as_a_number(engine: Engine) -> None:
    with engine.begin() as conn, pytest.raises(ValueError, match="NULL"):
        read_columns(conn, "SELECT 1::int4, 2::int8, v FROM (VALUES (1.0::float8), (NULL)) AS x(v)", COLUMNS)


def test_a_column_of_another_width_is_refused(engine: Engine) -> None:
    with engine.begin() as conn, pytest.raises(ValueError, match="8 bytes wide"):
        read_columns(conn, "SELECT 1::int4, 2::int4, 3.0::float8", COLUMNS)  # int4 where int8 was named


def test_the_decoder_reads_postgresqls_own_encoding() -> None:
    # array_send('{1.5,-2}'::float8[]): one dimension, no NULL, float8 (oid 701), 2 elements from 1
    payload = (bytes.fromhex("00000001 00000000 000002bd 00000002 00000001")
               + bytes.fromhex("00000008 3ff8000000000000 00000008 c000000000000000"))
    assert decode_array(payload, ">f8").tolist() == [1.5, -2.0]
    assert decode_array(bytes.fromhex("00000000 00000000 000002bd"), ">f8").tolist() == []  # '{}'
    with pytest.raises(ValueError, match="one-dimensional"):
        decode_array(bytes.fromhex("00000002 00000000 000002bd") + bytes(16), ">f8")
