from __future__ import annotations

from sqlalchemy import inspect

from services.storage.db import make_engine
from services.storage.migrate import current_revision, downgrade, schema_drift, upgrade


def test_migrations_upgrade_to_the_models_and_downgrade_to_nothing(database_url: str) -> None:
    engine = make_engine(database_url)
    upgrade(engine)
    assert current_revision(engine) is not None
    assert schema_drift(engine) == []
    assert {"runs", "events", "steps", "collectives"} <= set(inspect(engine).get_table_names())
    downgrade(engine)
    assert current_revision(engine) is None
    assert not {"runs", "events", "steps", "collectives"} & set(inspect(engine).get_table_names())
    upgrade(engine)  # and back up again
    assert schema_drift(engine) == []
    engine.dispose()
