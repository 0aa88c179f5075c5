"""goodput ingest client: record where the GPU-hours of a torchrun job go.

    import ingest_client as goodput

    tracker = goodput.init()              # reads torchrun's env and GOODPUT_*
    tracker.resumed(start_step)
    for step in range(start_step + 1, total + 1):
        with tracker.step(step) as s:
            s.loss = train_one_step()
    tracker.finish("finished")

Standard library only; torch is imported lazily by ``Tracker.ddp_comm_hook`` and ``state_digest``.
"""

from __future__ import annotations

import logging

from ingest_client.common.config import ClientConfig, Mode
from ingest_client.common.errors import ConfigError, GoodputClientError, TransportError
from ingest_client.common.events import SCHEMA_VERSION, AttemptEndReason, EventKind, RunStatus
from ingest_client.tools.sync import SyncResult, sync_directory
from ingest_client.worker.api import get_tracker, init
from ingest_client.worker.context import RunContext
from ingest_client.worker.digest import state_digest
from ingest_client.worker.flusher import ClientStats
from ingest_client.worker.tracker import Tracker

logging.getLogger("ingest_client").addHandler(logging.NullHandler())

__all__ = [
    "SCHEMA_VERSION",
    "AttemptEndReason",
    "ClientConfig",
    "ClientStats",
    "ConfigError",
    "EventKind",
    "GoodputClientError",
    "Mode",
    "RunContext",
    "RunStatus",
    "SyncResult",
    "Tracker",
    "TransportError",
    "get_tracker",
    "init",
    "state_digest",
    "sync_directory",
]
