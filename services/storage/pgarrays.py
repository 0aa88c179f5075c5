"""The analyses' numeric reads on PostgreSQL: a query's columns fetched as one binary array each, decoded by numpy.

`SELECT array_send(array_agg(c0)), ... FROM (query)` answers one row, whatever the query's number of rows: the
driver hands over each column's bytes in one piece, and numpy reads the elements in place. Read row by row instead
(binary COPY, one message a row), the driver's Python ran once a row: a block of 1,024 ranks x 128 steps cost the
analyses ~96 ms of CPU to fold where it now costs ~43, PostgreSQL ~56 ms where it now costs ~75 (building the arrays):
22 % less in all, and the part that moved left a Python process for the database's (`python -m
benchmarks.block_fold`). Every aggregate of the statement reads the same rows in the same order, so the columns stay
aligned row by row.

For reads of a known bound (a block's step rows: one a rank and step): PostgreSQL builds each array whole, and a value
holds at most 1 GB (~89 million elements of 8 bytes), so reads without one (a block's collectives, several a step; a
whole run's) stream by COPY instead (services.storage.pgcopy.copy_out).
"""

from __future__ import annotations

import numpy as np
from sqlalchemy import Connection

from services.storage.db import psycopg_connection

_HEADER_BYTES = 20  # a one-dimensional array's: five int32


def read_columns(conn: Connection, sql: str, columns: dict[str, str]) -> list[np.ndarray]:
    """The columns of `sql`'s rows (in its select list's order, non-NULL fixed-width values; `columns`: a name and a
    big-endian numpy type for each, e.g. {"step": ">i8", "start": ">f8"}) as arrays in native byte order."""
    count = len(columns)
    aggregates = ", ".join(f"array_send(array_agg(c{k}))" for k in range(count))
    names = ", ".join(f"c{k}" for k in range(count))
    with psycopg_connection(conn).cursor(binary=True) as cursor:
        row = cursor.execute(f"SELECT {aggregates} FROM ({sql}) AS q({names})").fetchone()
    if row is None or row[0] is None:  # no rows: array_agg's NULL
        return [np.empty(0, dtype=np.dtype(typ).newbyteorder("=")) for typ in columns.values()]
    arrays = [decode_array(bytes(payload), typ) for payload, typ in zip(row, columns.values(), strict=True)]
    if len({len(a) for a in arrays}) != 1:
        raise ValueError("the columns' arrays differ in length")
    return arrays


def decode_array(payload: bytes, typ: str) -> np.ndarray:
    """A one-dimensional array without NULLs in PostgreSQL's binary format (`array_send`: dimensions, a has-NULL flag,
    the element type, each dimension's size and lower bound, then each element's length and bytes) -> its elements
    as `typ` (big-endian, fixed width), in native byte order."""
    if len(payload) < 12:
        raise ValueError("not a PostgreSQL binary array")
    ndim, flags = (int(v) for v in np.frombuffer(payload, dtype=">i4", count=2))
    if ndim == 0:  # an empty array has no dimension
        return np.empty(0, dtype=np.dtype(typ).newbyteorder("="))
    if ndim != 1 or len(payload) < _HEADER_BYTES:
        raise ValueError("not a one-dimensional PostgreSQL binary array")
    if flags:
        raise ValueError("a NULL slipped into a numeric column read as an array")
    size = int(np.frombuffer(payload, dtype=">i4", count=1, offset=12)[0])
    element = np.dtype([("length", ">i4"), ("value", typ)])
    if len(payload) != _HEADER_BYTES + size * element.itemsize:
        raise ValueError(f"the array's elements are not {np.dtype(typ).itemsize} bytes wide")
    values = np.frombuffer(payload, dtype=element, offset=_HEADER_BYTES)["value"]
    return values.astype(values.dtype.newbyteorder("="))
