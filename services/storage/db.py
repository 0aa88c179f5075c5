"""Engines for the embedded SQLite default and for PostgreSQL."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import orjson
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.pool import NullPool

if TYPE_CHECKING:
    import psycopg

# The database did not answer now (down, restarting, renamed, out of connections, locked): a retry can succeed.
# The collector answers these 503 + Retry-After wherever they are raised (services.collector.errors).
UNREACHABLE_ERRORS: tuple[type[Exception], ...] = (OperationalError, InterfaceError, DisconnectionError, PoolTimeout)


def normalize_url(url: str) -> str:
    """Accept the URLs people write (postgres://, postgresql://) and use the psycopg 3 driver."""
    parsed = make_url(url)
    if parsed.drivername in ("postgres", "postgresql"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def database_status(engine: Engine) -> str:
    """"ok" when the database answers a query now, else "unreachable: <error class>"."""
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:  # reported, not raised
        return f"unreachable: {exc.__class__.__name__}"
    return "ok"


def make_engine(url: str, *, pool_size: int = 10) -> Engine:
    url = normalize_url(url)
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30},
                               poolclass=NullPool if ":memory:" not in url else None)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True)


def sqlite_connection(conn: Connection) -> sqlite3.Connection:
    """The driver's own connection under `conn` on SQLite (cursors that return plain tuples)."""
    return cast(sqlite3.Connection, conn.connection.driver_connection)


def psycopg_connection(conn: Connection) -> psycopg.Connection[tuple[Any, ...]]:
    """The driver's own connection under `conn` on PostgreSQL (COPY, binary cursors)."""
    return cast("psycopg.Connection[tuple[Any, ...]]", conn.connection.driver_connection)


def json_rows(rows: Sequence[Sequence[Any]]) -> str:
    """Rows as one JSON parameter for a statement that reads them with `jsonb_array_elements(%s::jsonb) WITH
    ORDINALITY` (a fixed text, prepared once per connection). Not one array parameter per column: the driver inspects
    and dumps arrays element by element in Python, ~20 us per array, where orjson is one C call (a group's 256
    `events` rows: 19 us; json.dumps took 261). jsonb, not json: it parses each row once, where `->>` on a json value
    scans the row's text again for every field (the `events` insert, 48 rows of 9 fields: 22.5 -> 19.3 us a row). A
    float8 survives exactly (the shortest digits that read back to the same double; jsonb keeps them as numeric) but
    for -0.0, which jsonb's numeric reads as 0: a statement whose floats may be -0.0 reads `json`
    (services.storage.clock_readings). NaN and infinities would go as null: the values written are finite (the
    event schema refuses the others). Numpy scalars go as numbers."""
    return orjson.dumps(rows, option=orjson.OPT_SERIALIZE_NUMPY).decode()


def _sqlite_pragmas(dbapi_connection: sqlite3.Connection, _record: object) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=FULL")  # a 200 means committed: survive power loss, not just a crash
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()
