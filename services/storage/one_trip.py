"""PostgreSQL statements sent together in one round trip: one simple-query message, parameters bound by the client.

A writer's group ends with statements whose answers it reads only as row counts (its clock readings' upsert, one
touch of each run). Sent one by one, or pipelined, each costs the writer a wait on the socket and ~60-250 us of its
CPU in the driver, under the GIL the event loop needs (benchmarks.requests: the writer thread is a third of the
serving process's CPU). One message costs one wait. Client-side binding writes each value as a literal: strings
quoted by the driver, None as NULL, floats as `'<repr>'::float8` (read back to the same double, -0.0 included: the
driver's bare numeral is a `numeric`, which has no negative zero). Each statement is bound on its own and the results
joined: the driver parses a query's text for its placeholders once and keeps the result only for texts of at most
4 KB and 50 parameters, and a group's touches of a dozen runs are more (parsed anew every time: ~0.6 ms a group).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

from sqlalchemy import Connection

from services.storage.db import psycopg_connection


class OneTrip:
    """Statements (positional `%s` placeholders) queued with their parameters, then sent at once by `send`."""

    __slots__ = ("_statements",)

    def __init__(self) -> None:
        self._statements: list[tuple[str, Sequence[Any]]] = []

    def add(self, sql: str, params: Sequence[Any]) -> int:
        """Queue one statement; returns its index in `send`'s row counts."""
        self._statements.append((sql, params))
        return len(self._statements) - 1

    def send(self, conn: Connection) -> list[int]:
        """Run the queued statements in the connection's transaction, in order; each statement's row count. A
        failing statement fails the whole message (the transaction is then aborted, as for any failed statement)."""
        if not self._statements:
            return []
        from psycopg import ClientCursor  # (PostgreSQL only: its driver is not needed on SQLite)

        counts: list[int] = []
        with ClientCursor(psycopg_connection(conn)) as cursor:
            cursor.adapters.register_dumper(float, _exact_float_dumper())
            cursor.execute("; ".join([cursor.mogrify(sql, params) for sql, params in self._statements]))
            while True:
                counts.append(cursor.rowcount)
                if not cursor.nextset():
                    break
        self._statements.clear()
        return counts


@cache
def _exact_float_dumper() -> type:
    from psycopg.types.numeric import FloatDumper

    class ExactFloatDumper(FloatDumper):
        def quote(self, obj: float) -> bytes:
            return b"'%s'::float8" % self.dump(obj)

    return ExactFloatDumper
