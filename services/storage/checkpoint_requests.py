"""Checkpoint requests: create, list, and link each to the checkpoint that answered it.

A request is fulfilled by the run's first ok ``checkpoint_end`` whose ``request_id`` is the request's id. The
link is made when requests are read (every read path calls `resolve_fulfilled` first, and a running client
polls the signals endpoint every few seconds), so ingestion stays untouched: one indexed lookup of the run's
``checkpoint_end`` events since the oldest pending request, only while a request is pending.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from sqlalchemy import Connection, Row, insert, select, text, update

from services.storage.tables import CheckpointRequest

# Client clocks may run behind the server's: look this far before the request for its checkpoint_end.
CLOCK_SLACK_S = 3600.0


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointRequestRow:
    id: int
    run_pk: int
    requested_at: float
    reason: str | None
    requested_by: str | None
    fulfilled_at: float | None
    fulfilled_step: int | None

    @property
    def pending(self) -> bool:
        return self.fulfilled_at is None


_T = CheckpointRequest
_COLUMNS = (_T.id, _T.run_pk, _T.requested_at, _T.reason, _T.requested_by, _T.fulfilled_at, _T.fulfilled_step)
_ENDS_SQL = text(
    "SELECT time, step, data FROM events WHERE run_pk = :pk AND kind = 'checkpoint_end' AND time >= :since")


def _row(r: Row[int, int, float, str | None, str | None, float | None, int | None]) -> CheckpointRequestRow:
    return CheckpointRequestRow(id=r[0], run_pk=r[1], requested_at=r[2], reason=r[3], requested_by=r[4],
                                fulfilled_at=r[5], fulfilled_step=r[6])


def create_request(conn: Connection, run_pk: int, *, now: float, reason: str | None,
                   requested_by: str | None) -> CheckpointRequestRow:
    new_id = conn.execute(insert(_T).values(run_pk=run_pk, requested_at=now, reason=reason,
                                            requested_by=requested_by).returning(_T.id)).scalar_one()
    return CheckpointRequestRow(id=int(new_id), run_pk=run_pk, requested_at=now, reason=reason,
                                requested_by=requested_by, fulfilled_at=None, fulfilled_step=None)


def pending_requests(conn: Connection, run_pks: list[int]) -> list[CheckpointRequestRow]:
    if not run_pks:
        return []
    rows = conn.execute(select(*_COLUMNS).where(_T.run_pk.in_(run_pks), _T.fulfilled_at.is_(None))
                        .order_by(_T.id)).all()
    return [_row(r) for r in rows]


def list_requests(conn: Connection, run_pk: int, *, limit: int = 100) -> list[CheckpointRequestRow]:
    rows = conn.execute(select(*_COLUMNS).where(_T.run_pk == run_pk).order_by(_T.id.desc()).limit(limit)).all()
    return [_row(r) for r in rows]


def resolve_fulfilled(conn: Connection, run_pk: int) -> int:
    """Mark the run's pending requests answered by a stored ok checkpoint_end; returns how many it marked."""
    pending = {r.id: r for r in pending_requests(conn, [run_pk])}
    if not pending:
        return 0
    since = min(r.requested_at for r in pending.values()) - CLOCK_SLACK_S
    answers: dict[int, tuple[float, int]] = {}
    for time, step, data in conn.execute(_ENDS_SQL, {"pk": run_pk, "since": since}):
        fields = json.loads(data) if data else {}
        rid = fields.get("request_id")
        if rid in pending and fields.get("ok") and (rid not in answers or time < answers[rid][0]):
            answers[rid] = (float(time), int(step))
    for rid, (time, step) in answers.items():
        conn.execute(update(_T).where(_T.id == rid, _T.fulfilled_at.is_(None))
                     .values(fulfilled_at=time, fulfilled_step=step))
    return len(answers)
