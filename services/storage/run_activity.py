"""A run's latest signs of activity, read with index lookups on ``events (run_pk, kind, time)``, never a scan:
the time of its last step record (a compact ``steps`` record carries the end of its last step as its time) and
the newest ``client_stats`` of each of its processes (attempt, rank)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection, bindparam, text

_STEP_KINDS = ("steps", "step")
_CHUNK = 500

_LAST_STEP_SQL = text(
    "SELECT max(time) FROM events WHERE run_pk = :pk AND kind = :k1 "
    "UNION ALL SELECT max(time) FROM events WHERE run_pk = :pk AND kind = :k2"
)

_CLIENT_STATS_SQL = text("""
SELECT run_pk, data FROM (
    SELECT run_pk, data, ROW_NUMBER() OVER (PARTITION BY run_pk, attempt, rank ORDER BY time DESC) AS newest
    FROM events WHERE kind = 'client_stats' AND run_pk IN :pks
) latest WHERE newest = 1
""").bindparams(bindparam("pks", expanding=True))


def last_step_times(conn: Connection, run_pks: Iterable[int]) -> dict[int, float]:
    """The time of each run's latest step record (runs with none are left out): two lookups per run."""
    out: dict[int, float] = {}
    for pk in run_pks:
        values = [v for (v,) in conn.execute(_LAST_STEP_SQL, {"pk": pk, "k1": _STEP_KINDS[0],
                                                              "k2": _STEP_KINDS[1]}) if v is not None]
        if values:
            out[pk] = float(max(values))
    return out


def latest_client_stats(conn: Connection, run_pks: list[int]) -> dict[int, list[dict[str, Any]]]:
    """Per run: the fields of the newest client_stats of each process (attempt, rank)."""
    out: dict[int, list[dict[str, Any]]] = {}
    for i in range(0, len(run_pks), _CHUNK):
        for run_pk, data in conn.execute(_CLIENT_STATS_SQL, {"pks": run_pks[i:i + _CHUNK]}):
            out.setdefault(run_pk, []).append(json.loads(data) if data else {})
    return out
