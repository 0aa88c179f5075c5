"""Alembic environment: target metadata from services.storage.tables; the URL from the caller's config."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from services.storage.db import make_engine
from services.storage.migrate import migration_transaction
from services.storage.retention import include_name
from services.storage.tables import metadata

config = context.config


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        compare_type=True,
        include_name=include_name,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=metadata,
                      literal_binds=True, compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = make_engine(config.get_main_option("sqlalchemy.url") or "sqlite:///goodput.db")
    try:
        with migration_transaction(engine) as conn:  # SQLite: foreign keys off while tables are rebuilt
            _run(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
