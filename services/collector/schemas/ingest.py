"""Wire models of `POST /v1/events` (docs/events.md), kept apart from the tables so that a column rename never
changes them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

import numpy as np
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, TypeAdapter, model_validator
from pydantic_core import PydanticCustomError

from services.storage.records import CollectiveRows, IngestRecord, StepRows

SCHEMA_VERSION = 1
MAX_WORLD = 1 << 20
MAX_STEP = 1 << 53
MIN_TIME = 946_684_800.0  # 2000-01-01
MAX_TIME = 4_102_444_800.0  # 2100-01-01
MAX_SERIES = 100_000  # rows in one compact record

_PRINTABLE = r"^[^\x00-\x1f\x7f]+$"
EventId = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=_PRINTABLE)]
LaunchId = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=_PRINTABLE)]


def _reachable_run_id(value: str) -> str:
    """A run id must be reachable as /v1/runs/{run_id}/...: HTTP clients and proxies resolve the path segments
    `.` and `..` away, so an id that is only dots, or has such a segment between its slashes, is refused."""
    if value.strip(".") == "" or any(part in (".", "..") for part in value.split("/")):
        raise PydanticCustomError("invalid_run_id", "{message}", {"message": (
            f"run_id {value!r} cannot be reached through the API (URLs resolve the path segments '.' and '..' "
            "away); use letters or digits too")})
    return value


RunId = Annotated[str, StringConstraints(min_length=1, max_length=256, pattern=_PRINTABLE),
                  AfterValidator(_reachable_run_id)]
ShortText = Annotated[str, StringConstraints(min_length=1, max_length=256, pattern=_PRINTABLE)]
OpName = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=_PRINTABLE)]
Time = Annotated[float, Field(ge=MIN_TIME, le=MAX_TIME, allow_inf_nan=False)]
AttemptNo = Annotated[int, Field(ge=0, le=2**31 - 1)]
RankNo = Annotated[int, Field(ge=0, lt=MAX_WORLD)]
StepNo = Annotated[int, Field(ge=0, le=MAX_STEP)]
Gpus = Annotated[int, Field(ge=1, le=MAX_WORLD)]
Finite = Annotated[float, Field(allow_inf_nan=False)]
Seconds = Annotated[float, Field(ge=0, le=1e9, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0, le=2**62)]


# A compact record's columns become NumPy arrays as soon as each is validated, so a large batch never holds
# all of its values as Python objects at once (one list at a time): memory per request stays near the body's.
def _int64_array(values: list[int]) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def _float64_array(values: list[float]) -> np.ndarray:
    return np.asarray(values, dtype=np.float64)


def _float64_array_with_nans(values: list[float | None] | None) -> np.ndarray | None:
    if values is None:
        return None
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


StepColumn = Annotated[list[StepNo], Field(min_length=1, max_length=MAX_SERIES), AfterValidator(_int64_array)]
TimeColumn = Annotated[list[Time], AfterValidator(_float64_array)]


class _Event(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    event_id: EventId
    run_id: RunId
    time: Time
    if TYPE_CHECKING:  # each kind's model declares its own `kind` (the discriminator of AnyEvent)
        kind: str

    def to_record(self) -> IngestRecord:
        fields = self.model_dump(
            exclude={"event_id", "run_id", "kind", "time", "attempt", "rank", "step", "launch"}, exclude_none=True)
        return IngestRecord(
            run_id=self.run_id, event_id=self.event_id, kind=self.kind,
            time=self.time, attempt=getattr(self, "attempt", None), rank=getattr(self, "rank", None),
            step=getattr(self, "step", None), data=fields or None, launch=getattr(self, "launch", None),
        )


class _RankEvent(_Event):
    attempt: AttemptNo  # within `launch` when it is given (docs/events.md, "Attempt numbers")
    rank: RankNo
    launch: LaunchId | None = None  # the launch (torchrun agent, `goodput launch`, process) that numbered `attempt`


class RunSubmitted(_Event):
    kind: Literal["run_submitted"]
    job_id: ShortText | None = None
    name: ShortText | None = None
    gpus: Gpus | None = None


class AllocationStart(_Event):
    kind: Literal["allocation_start"]
    gpus: Gpus
    job_id: ShortText | None = None
    hosts: Annotated[list[ShortText], Field(max_length=100_000)] | None = None


class AllocationEnd(_Event):
    kind: Literal["allocation_end"]
    job_id: ShortText | None = None


class AttemptStart(_RankEvent):
    kind: Literal["attempt_start"]
    world_size: Gpus
    host: ShortText
    local_rank: RankNo | None = None
    pid: Annotated[int, Field(ge=0, le=2**31)] | None = None
    restart_count: AttemptNo | None = None  # torchrun's TORCHELASTIC_RESTART_COUNT (per node), for audit
    generation: AttemptNo | None = None  # the worker's round as counted on its node (docs/events.md)

    @model_validator(mode="after")
    def _rank_inside_world(self) -> AttemptStart:
        if self.rank >= self.world_size:
            raise _field_error("rank", f"rank {self.rank} is not below world_size {self.world_size}")
        return self


DigestValue = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=_PRINTABLE)]


class Resume(_RankEvent):
    kind: Literal["resume"]
    step: StepNo
    checkpoint_step: StepNo | None = None  # the step of the checkpoint it loaded (it existed, whatever else arrived)
    checkpoint: ShortText | None = None  # that checkpoint's path or id
    digest: DigestValue | None = None  # of the state it loaded: compared with the writer's digest of that step


class Step(_RankEvent):
    kind: Literal["step"]
    step: StepNo
    start: Time
    end: Time
    loss: Finite | None = None
    lr: Finite | None = None
    comm: Seconds | None = None

    @model_validator(mode="after")
    def _end_after_start(self) -> Step:
        if self.end < self.start:
            raise _field_error("end", f"end ({self.end}) is before start ({self.start})")
        return self

    def to_record(self) -> IngestRecord:
        rows = StepRows(
            step=np.array([self.step], dtype=np.int64), start=np.array([self.start]), end=np.array([self.end]),
            loss=np.array([_nan(self.loss)]), lr=np.array([_nan(self.lr)]), comm=np.array([_nan(self.comm)]),
        )
        return IngestRecord(run_id=self.run_id, event_id=self.event_id, kind=self.kind, time=self.time,
                            attempt=self.attempt, rank=self.rank, launch=self.launch, step=self.step,
                            step_rows=rows)


class Steps(_RankEvent):
    kind: Literal["steps"]
    step: StepColumn
    start: TimeColumn
    end: TimeColumn
    loss: Annotated[list[Finite | None] | None, AfterValidator(_float64_array_with_nans)] = None
    lr: Annotated[list[Finite | None] | None, AfterValidator(_float64_array_with_nans)] = None
    comm: Annotated[list[Seconds | None] | None, AfterValidator(_float64_array_with_nans)] = None

    @model_validator(mode="after")
    def _columns_agree(self) -> Steps:
        _check_columns(self, ("start", "end", "loss", "lr", "comm"))
        return self

    def to_record(self) -> IngestRecord:
        n = len(self.step)
        rows = StepRows(
            step=np.asarray(self.step, dtype=np.int64), start=np.asarray(self.start, dtype=np.float64),
            end=np.asarray(self.end, dtype=np.float64), loss=_nans(self.loss, n), lr=_nans(self.lr, n),
            comm=_nans(self.comm, n),
        )
        return IngestRecord(run_id=self.run_id, event_id=self.event_id, kind=self.kind, time=self.time,
                            attempt=self.attempt, rank=self.rank, launch=self.launch, step=int(rows.step.max()),
                            data={"n": n}, step_rows=rows)


RequestId = Annotated[int, Field(ge=1, le=2**62)]


class CheckpointStart(_RankEvent):
    kind: Literal["checkpoint_start"]
    step: StepNo
    request_id: RequestId | None = None  # the checkpoint request (POST /v1/runs/{id}/checkpoint-request) it answers


class CheckpointEnd(_RankEvent):
    kind: Literal["checkpoint_end"]
    step: StepNo
    ok: bool
    request_id: RequestId | None = None


class Collective(_RankEvent):
    kind: Literal["collective"]
    step: StepNo
    op: OpName
    start: Time
    end: Time

    @model_validator(mode="after")
    def _end_after_start(self) -> Collective:
        if self.end < self.start:
            raise _field_error("end", f"end ({self.end}) is before start ({self.start})")
        return self

    def to_record(self) -> IngestRecord:
        rows = CollectiveRows(step=np.array([self.step], dtype=np.int64), op=[self.op],
                              start=np.array([self.start]), end=np.array([self.end]))
        return IngestRecord(run_id=self.run_id, event_id=self.event_id, kind=self.kind, time=self.time,
                            attempt=self.attempt, rank=self.rank, launch=self.launch, step=self.step,
                            collective_rows=rows)


class Collectives(_RankEvent):
    kind: Literal["collectives"]
    step: StepColumn
    op: list[OpName]
    start: TimeColumn
    end: TimeColumn

    @model_validator(mode="after")
    def _columns_agree(self) -> Collectives:
        _check_columns(self, ("op", "start", "end"))
        return self

    def to_record(self) -> IngestRecord:
        rows = CollectiveRows(step=np.asarray(self.step, dtype=np.int64), op=list(self.op),
                              start=np.asarray(self.start, dtype=np.float64),
                              end=np.asarray(self.end, dtype=np.float64))
        return IngestRecord(run_id=self.run_id, event_id=self.event_id, kind=self.kind, time=self.time,
                            attempt=self.attempt, rank=self.rank, launch=self.launch, step=int(rows.step.max()),
                            data={"n": len(self.step)}, collective_rows=rows)


class Heartbeat(_RankEvent):
    kind: Literal["heartbeat"]
    step: StepNo | None = None  # the step in progress (last completed + 1)
    collectives: Count | None = None  # collectives started in that step so far


class Digest(_RankEvent):
    kind: Literal["digest"]
    step: StepNo  # the optimizer step after which the state was hashed
    value: DigestValue  # e.g. a hex sha256 prefix of the model / optimizer state; compared as a string


class AttemptEnd(_RankEvent):
    kind: Literal["attempt_end"]
    reason: Literal["completed", "failed", "preempted"]
    detail: Annotated[str, StringConstraints(max_length=2048)] | None = None
    # Sent by `goodput launch` for a worker torchrun saw exit: its exit status, negative: the signal that killed it
    # (docs/events.md). The ledger reads times from the ranks' own records only.
    exit_code: Annotated[int, Field(ge=-255, le=255)] | None = None


class RunEnd(_Event):
    kind: Literal["run_end"]
    status: Literal["finished", "failed", "cancelled"]
    detail: Annotated[str, StringConstraints(max_length=2048)] | None = None  # e.g. the scheduler's reason


PhaseName = Literal["eval", "init_process_group"]  # docs/events.md, "Phases"


class PhaseStart(_RankEvent):
    kind: Literal["phase_start"]
    name: PhaseName
    step: StepNo  # the last step completed when the phase began


class PhaseEnd(_RankEvent):
    kind: Literal["phase_end"]
    name: PhaseName
    step: StepNo  # the step of its phase_start
    ok: bool


class ClientStats(_RankEvent):
    kind: Literal["client_stats"]
    dropped_events: Count = 0
    spool_dropped_events: Count = 0
    send_failures: Count = 0
    rejected_events: Count = 0
    unspooled_events: Count | None = None  # events the client's spool could not take (its disk full or failing)
    step_clock: Literal["cpu", "cuda"] | None = None  # what timed the process's steps (host clocks, CUDA events)
    collective_clock: Literal["cpu", "cuda", "nccl", "off"] | None = None  # what timed its collectives ("off": none,
    # NCCL's timers would have cost more than the client's budget)


AnyEvent = Annotated[
    RunSubmitted | AllocationStart | AllocationEnd | AttemptStart | Resume | Step | Steps | CheckpointStart
    | CheckpointEnd | Collective | Collectives | Heartbeat | Digest | AttemptEnd | RunEnd | ClientStats | PhaseStart
    | PhaseEnd,
    Field(discriminator="kind"),
]
EVENT_KINDS = (
    "run_submitted", "allocation_start", "allocation_end", "attempt_start", "resume", "step", "steps",
    "checkpoint_start", "checkpoint_end", "collective", "collectives", "heartbeat", "digest", "attempt_end",
    "run_end", "client_stats", "phase_start", "phase_end",
)


# One event alone, validated as EventBatch validates each of its events (services.collector.batch's sliced parse).
EVENT_ADAPTER: TypeAdapter[_Event] = TypeAdapter(AnyEvent)


class EventBatch(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    schema_version: Annotated[int, Field(ge=1, le=SCHEMA_VERSION)] = SCHEMA_VERSION
    events: list[AnyEvent]


class IngestAck(BaseModel):
    accepted: int = Field(description="events committed to the database by this request")
    duplicates: int = Field(description="events already stored (client retries and replays); not stored again")


def _nan(value: float | None) -> float:
    return float("nan") if value is None else value


def _nans(values: np.ndarray | list[float | None] | None, n: int) -> np.ndarray:
    """A column the client did not send: a read-only view of one NaN, n long, that takes no memory. (A column it
    sent is already an array, _float64_array_with_nans: asarray returns it as it is.) Views of the usual lengths are
    made once: np.broadcast_to costs more than the rest of a small record's conversion."""
    if values is not None:
        return np.asarray(values, dtype=np.float64)
    if n < len(_NAN_VIEWS):
        return _NAN_VIEWS[n]
    return np.broadcast_to(np.float64(np.nan), (n,))


_NAN_VIEWS = [np.broadcast_to(np.float64(np.nan), (n,)) for n in range(1025)]  # read-only: safe to share


def _check_columns(record: Steps | Collectives, names: tuple[str, ...]) -> None:
    """A compact record's arrays: as long as `step`, and no end before its start."""
    n = len(record.step)
    for name in names:
        values = getattr(record, name)
        if values is not None and len(values) != n:
            raise _field_error(name, f"{name} has {len(values)} values but step has {n}: "
                                     "the arrays must be equal length")
    start, end = record.start, record.end
    bad = np.flatnonzero(np.asarray(end) < np.asarray(start))
    if len(bad):
        i = int(bad[0])
        raise _field_error(f"end.{i}", f"end[{i}] ({end[i]}) is before start[{i}] ({start[i]})")


def _field_error(field: str, message: str) -> PydanticCustomError:
    """A whole-event check's error that still names the field (read back by collector.batch)."""
    return PydanticCustomError("invalid_field", "{message}", {"field": field, "message": message})
