"""Errors of the goodput services. Each becomes one HTTP answer in services.collector.errors.

GoodputServiceError
 ├── RunNotFound          404: no event of that run was ever stored
 ├── InvalidBatch         400 / 413 / 422: the batch is rejected whole, nothing of it stored
 ├── Overloaded           503 + Retry-After: the writer is behind; send the same batch again later
 ├── StorageUnavailable   503 + Retry-After: the database refused or is down
 ├── Unauthenticated      401: no credential, or one that is malformed, unknown or revoked
 ├── Forbidden            403: a valid credential that may not do this (wrong kind, another project's run,
 │                        a remote client while no token exists)
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


class InvalidBatch(GoodputServiceError):
    def __init__(self, message: str, *, status: int = 422, code: str = "invalid_event", **details: Any) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.details = details


class Overloaded(GoodputServiceError):
    retry_after_s = 1


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
