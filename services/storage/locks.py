"""Work that one collector process at a time does (`goodput serve --workers N` runs N processes on one database).

PostgreSQL: a session-level advisory lock, tried without waiting. SQLite deployments run one collector process,
so the lock is always granted there.
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
