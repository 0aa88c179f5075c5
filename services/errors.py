"""Errors of the goodput services. Each becomes one HTTP answer in services.collector.errors.

GoodputServiceError
 ├── RunNotFound          404: no event of that run was ever stored
 ├── RunInSeveralProjects 409: a reader of every project named a run id that several projects use
 ├── RunDetailPruned      410: what was asked needs the run's raw rows, deleted by retention
 ├── InvalidBatch         400 / 413 / 422: the batch is rejected whole, nothing of it stored
 ├── EventIdConflict      409: an event id already stored for the run with other content; batch rejected whole
 ├── Overloaded           503 + Retry-After: the writer is behind; send the same batch again later
 ├── StorageUnavailable   503 + Retry-After: the database refused or is down
 ├── Unauthenticated      401: no credential, or one that is malformed, unknown or revoked
 ├── Forbidden            403: a valid credential that may not do this (wrong kind, a reader of one
 │                        project asking for every project, a remote client while no token exists)
 └── ConfigurationError   bad settings, raised at start-up
"""

from __future__ import annotations

from typing import Any


class GoodputServiceError(Exception):
    pass


class RunNotFound(GoodputServiceError):
    def __init__(self, run_id: str) -> None:
        super().__init__(f"no run {run_id!r}: the collector has no events for it (check the run id the client sends)")
        self.run_id = run_id


class RunInSeveralProjects(GoodputServiceError):
    def __init__(self, run_id: str, projects: list[str]) -> None:
        super().__init__(
            f"run id {run_id!r} exists in {len(projects)} projects ({', '.join(map(repr, projects))}); say which "
            f"with ?project=<name> (the CLI's --project)")
        self.run_id = run_id
        self.projects = projects


class RunDetailPruned(GoodputServiceError):
    """The answer needs a run's raw rows (steps, collectives), which retention deleted: only what was stored for the
    run before (ledger, views, straggler report, resume check with the default tolerances) can be served."""

    def __init__(self, run_id: str, pruned_at: float, what: str) -> None:
        super().__init__(
            f"run {run_id!r}: {what}, and its raw steps and collectives were deleted by retention "
            f"(GOODPUT_RAW_RETENTION_DAYS) at {pruned_at:.0f} (epoch seconds), so it cannot be built again")
        self.run_id = run_id
        self.pruned_at = pruned_at


class InvalidBatch(GoodputServiceError):
    def __init__(self, message: str, *, status: int = 422, code: str = "invalid_event", **details: Any) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.details = details


class EventIdConflict(GoodputServiceError):
    def __init__(self, *, index: int, event_id: str, run_id: str) -> None:
        super().__init__(
            f"events[{index}]: event_id {event_id!r} of run {run_id!r} is already stored with other content; an "
            "event id must name one event (a retry sends the same content). The whole batch was rejected, nothing "
            "of it stored: give the new event its own id")
        self.index = index
        self.event_id = event_id
        self.run_id = run_id


class Overloaded(GoodputServiceError):
    """Refused for load, always before the body is parsed. `reason`: what was at its limit (the label of
    goodput_collector_overloaded_requests_total): "body_budget" (bodies in flight) or "write_queue"."""

    retry_after_s = 1

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class StorageUnavailable(GoodputServiceError):
    retry_after_s = 2


class Unauthenticated(GoodputServiceError):
    pass


class Forbidden(GoodputServiceError):
    def __init__(self, message: str, *, code: str = "forbidden", **details: Any) -> None:
        super().__init__(message)
        self.code = code
        self.details = details


class ConfigurationError(GoodputServiceError):
    pass
