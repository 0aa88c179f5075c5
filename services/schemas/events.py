"""Wire models of `POST /v1/events` (docs/events.md), kept apart from the tables so that a column rename never
changes them; services.collector.records maps a validated event to what storage writes."""

from __future__ import annotations

import operator
from array import array
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, TypeAdapter, model_validator
from pydantic_core import PydanticCustomError

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


# A compact record's columns become packed arrays of machine numbers (the standard library's `array`, which NumPy
# reads without a copy) as soon as each is validated, so a large batch never holds all of its values as Python
# objects at once (one list at a time): memory per request stays near the body's.
def _int64_array(values: list[int]) -> array[int]:
    return array("q", values)


def _float64_array(values: list[float]) -> array[float]:
    return array("d", values)


def _float64_array_with_nans(values: list[float | None] | None) -> array[float] | None:
    if values is None:
        return None
    nan = float("nan")
    return array("d", [nan if v is None else v for v in values])


StepColumn = Annotated[list[StepNo], Field(min_length=1, max_length=MAX_SERIES), AfterValidator(_int64_array)]
TimeColumn = Annotated[list[Time], AfterValidator(_float64_array)]


class Event(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    event_id: EventId
    run_id: RunId
    time: Time
    if TYPE_CHECKING:  # each kind's model declares its own `kind` (the discriminator of AnyEvent)
        kind: str



class RankEvent(Event):
    attempt: AttemptNo  # within `launch` when it is given (docs/events.md, "Attempt numbers")
    rank: RankNo
    launch: LaunchId | None = None  # the launch (torchrun agent, `goodput launch`, process) that numbered `attempt`


class RunSubmitted(Event):
    kind: Literal["run_submitted"]
    job_id: ShortText | None = None
    name: ShortText | None = None
    gpus: Gpus | None = None


class AllocationStart(Event):
    kind: Literal["allocation_start"]
    gpus: Gpus
    job_id: ShortText | None = None
    hosts: Annotated[list[ShortText], Field(max_length=100_000)] | None = None


class AllocationEnd(Event):
    kind: Literal["allocation_end"]
    job_id: ShortText | None = None


class AttemptStart(RankEvent):
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


class Resume(RankEvent):
    kind: Literal["resume"]
    step: StepNo
    checkpoint_step: StepNo | None = None  # the step of the checkpoint it loaded (it existed, whatever else arrived)
    checkpoint: ShortText | None = None  # that checkpoint's path or id
    digest: DigestValue | None = None  # of the state it loaded: compared with the writer's digest of that step


class Step(RankEvent):
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



class Steps(RankEvent):
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



RequestId = Annotated[int, Field(ge=1, le=2**62)]


class CheckpointStart(RankEvent):
    kind: Literal["checkpoint_start"]
    step: StepNo
    request_id: RequestId | None = None  # the checkpoint request (POST /v1/runs/{id}/checkpoint-request) it answers


class CheckpointEnd(RankEvent):
    kind: Literal["checkpoint_end"]
    step: StepNo
    ok: bool
    request_id: RequestId | None = None


class Collective(RankEvent):
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



class Collectives(RankEvent):
    kind: Literal["collectives"]
    step: StepColumn
    op: list[OpName]
    start: TimeColumn
    end: TimeColumn

    @model_validator(mode="after")
    def _columns_agree(self) -> Collectives:
        _check_columns(self, ("op", "start", "end"))
        return self



class Heartbeat(RankEvent):
    kind: Literal["heartbeat"]
    step: StepNo | None = None  # the step in progress (last completed + 1)
    collectives: Count | None = None  # collectives started in that step so far


class Digest(RankEvent):
    kind: Literal["digest"]
    step: StepNo  # the optimizer step after which the state was hashed
    value: DigestValue  # e.g. a hex sha256 prefix of the model / optimizer state; compared as a string


class AttemptEnd(RankEvent):
    kind: Literal["attempt_end"]
    reason: Literal["completed", "failed", "preempted"]
    detail: Annotated[str, StringConstraints(max_length=2048)] | None = None
    # Sent by `goodput launch` for a worker torchrun saw exit: its exit status, negative: the signal that killed it
    # (docs/events.md). The ledger reads times from the ranks' own records only.
    exit_code: Annotated[int, Field(ge=-255, le=255)] | None = None


class RunEnd(Event):
    kind: Literal["run_end"]
    status: Literal["finished", "failed", "cancelled"]
    detail: Annotated[str, StringConstraints(max_length=2048)] | None = None  # e.g. the scheduler's reason


PhaseName = Literal["eval", "init_process_group"]  # docs/events.md, "Phases"


class PhaseStart(RankEvent):
    kind: Literal["phase_start"]
    name: PhaseName
    step: StepNo  # the last step completed when the phase began


class PhaseEnd(RankEvent):
    kind: Literal["phase_end"]
    name: PhaseName
    step: StepNo  # the step of its phase_start
    ok: bool


class ClientStats(RankEvent):
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
EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(AnyEvent)


class EventBatch(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    schema_version: Annotated[int, Field(ge=1, le=SCHEMA_VERSION)] = SCHEMA_VERSION
    events: list[AnyEvent]


class IngestAck(BaseModel):
    accepted: int = Field(description="events committed to the database by this request")
    duplicates: int = Field(description="events already stored (client retries and replays); not stored again")


def _check_columns(record: Steps | Collectives, names: tuple[str, ...]) -> None:
    """A compact record's arrays: as long as `step`, and no end before its start."""
    n = len(record.step)
    for name in names:
        values = getattr(record, name)
        if values is not None and len(values) != n:
            raise _field_error(name, f"{name} has {len(values)} values but step has {n}: "
                                     "the arrays must be equal length")
    start, end = record.start, record.end
    if any(map(operator.lt, end, start)):
        i = next(i for i, (s, e) in enumerate(zip(start, end, strict=True)) if e < s)
        raise _field_error(f"end.{i}", f"end[{i}] ({end[i]}) is before start[{i}] ({start[i]})")


def _field_error(field: str, message: str) -> PydanticCustomError:
    """A whole-event check's error that still names the field (read back by collector.batch)."""
    return PydanticCustomError("invalid_field", "{message}", {"field": field, "message": message})
