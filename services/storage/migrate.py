"""Apply the Alembic migrations in migrations/ to a database, and check they match the tables (no drift)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from sqlalchemy import Connection, Engine

from services.errors import ConfigurationError
from services.storage.locks import MIGRATION_LOCK, wait_for_transaction_lock
from services.storage.retention import include_name
from services.storage.tables import metadata

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


def alembic_config(engine: Engine) -> Config:
    if not (MIGRATIONS_DIR / "env.py").exists():
        raise ConfigurationError(
            f"the migrations folder {MIGRATIONS_DIR} is missing; run goodput from a checkout of the repository "
            "or an install that ships migrations/")
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False).replace("%", "%%"))
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    config = alembic_config(engine)
    with migration_transaction(engine) as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, revision)


def downgrade(engine: Engine, revision: str = "base") -> None:
    config = alembic_config(engine)
    with migration_transaction(engine) as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, revision)


@contextmanager
def migration_transaction(engine: Engine) -> Iterator[Connection]:
    """One transaction for the migrations, one process at a time: on PostgreSQL the transaction first waits for an
    advisory lock, so that collectors started together on a new database (several hosts, compose) do not both
    create the tables (the second failed with a UniqueViolation on pg_type); the second then finds the
    first's revision committed and has nothing to do. On SQLite, foreign keys are not enforced inside it (SQLite's own
    procedure for changing a table others reference: rebuilding `runs` must not cascade-delete its events) and
    `PRAGMA foreign_key_check` must find nothing before it commits."""
    with engine.connect() as conn:
        sqlite = conn.dialect.name == "sqlite"
        if sqlite:  # effective only outside a transaction: the driver has not begun one yet
            conn.exec_driver_sql("PRAGMA foreign_keys=OFF")
            conn.commit()
        try:
            with conn.begin():
                wait_for_transaction_lock(conn, MIGRATION_LOCK)
                yield conn
                if sqlite:
                    broken = conn.exec_driver_sql("PRAGMA foreign_key_check").all()
                    if broken:
                        raise ConfigurationError(
                            f"the migration left {len(broken)} rows whose run does not exist (first: {broken[0]}); "
                            "nothing was changed")
        finally:
            if sqlite:
                conn.exec_driver_sql("PRAGMA foreign_keys=ON")
                conn.commit()


def schema_drift(engine: Engine) -> list[object]:
    """Differences between the migrated database and services.storage.tables (empty = no drift)."""
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True, "include_name": include_name})
        return list(compare_metadata(context, metadata))


def head_revision() -> str:
    """The newest revision in migrations/versions."""
    from alembic.script import ScriptDirectory

    return str(ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head())


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()
