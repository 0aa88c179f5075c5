"""Analyses kept for good once a run's raw rows are pruned (`run_products`): the straggler report and the resume
check, which are otherwise kept in a collector's memory only (services.derive.cache)."""

from __future__ import annotations

from sqlalchemy import Connection, delete, insert, select

from services.storage.tables import RunProduct


def load_product(conn: Connection, run_pk: int, product: str) -> tuple[int, str] | None:
    """(version, JSON) of the run's kept `product`, or None."""
    row = conn.execute(select(RunProduct.version, RunProduct.product_json)
                       .where(RunProduct.run_pk == run_pk, RunProduct.product == product)).first()
    return None if row is None else (int(row[0]), str(row[1]))


def store_product(conn: Connection, run_pk: int, product: str, *, version: int, product_json: str) -> None:
    conn.execute(delete(RunProduct).where(RunProduct.run_pk == run_pk, RunProduct.product == product))
    conn.execute(insert(RunProduct).values(run_pk=run_pk, product=product, version=version,
                                           product_json=product_json))
