"""Work that one collector process at a time does (`goodput serve --workers N` runs N processes on one database,
and several hosts may run `goodput serve` on the same one).

PostgreSQL: advisory locks. A session-level one, tried without waiting, for a round of background work (dropped
by PostgreSQL when the session's connection dies, so a killed process never keeps it); a transaction-level one,
waited for, for the migrations at start-up. SQLite deployments run one collector process, so the locks are
always granted there.
"""

from __future__ import annotations

from sqlalchemy import Connection, text


def try_process_lock(conn: Connection, key: int) -> bool:
    """Take the lock `key` for this connection's session if no other session holds it."""
    if conn.dialect.name != "postgresql":
        return True
    taken = bool(conn.execute(text("SELECT pg_try_advisory_lock(:key)"), {"key": key}).scalar())
    conn.commit()
    return taken


def release_process_lock(conn: Connection, key: int) -> None:
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": key})
        conn.commit()


MIGRATION_LOCK = 0x676F6F6D  # ("goom"): one process at a time migrates the database


def wait_for_transaction_lock(conn: Connection, key: int) -> None:
    """Wait until this connection's transaction holds the lock `key`; it is released at commit or rollback."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})
