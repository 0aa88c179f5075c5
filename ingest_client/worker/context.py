"""Who this process is: run id, attempt, rank and host, read once from torchrun's environment.

torchrun sets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``TORCHELASTIC_RESTART_COUNT`` and
``TORCHELASTIC_RUN_ID`` in every worker. The run id given to ``init()`` or ``GOODPUT_RUN_ID``
(see :mod:`ingest_client.common.config`) wins over ``TORCHELASTIC_RUN_ID``.

Attempt number: ``base + max(TORCHELASTIC_RESTART_COUNT, generation)``, where the generation is this worker's round
as counted on its node and the base is the launch's first attempt (:mod:`ingest_client.worker.generation`): at least
``GOODPUT_ATTEMPT_BASE``, and one more than the largest attempt an earlier launch of the run took on this host. The
restart count alone is per node: a node restarted for another node's failure keeps its count. Every record also
names its launch (``launch``); the collector numbers the run's attempts from every launch's, so a relaunch on
another host with a fresh spool is still a new attempt (docs/events.md, "Attempt numbers").
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ingest_client.common.errors import ConfigError

# torchrun uses "none" as its default rendezvous id; it is shared by unrelated runs.
_PLACEHOLDER_RUN_IDS = frozenset({"", "none"})


@dataclass(frozen=True, slots=True, kw_only=True)
class RunContext:
    run_id: str
    attempt: int
    rank: int
    local_rank: int
    world_size: int
    host: str
    pid: int
    restart_count: int = 0  # torchrun's TORCHELASTIC_RESTART_COUNT as this worker saw it (local to its node)
    generation: int | None = None  # worker processes this agent started for this local rank before this one
    launch: str | None = None  # the launch that numbered `attempt`, sent with every record (generation.launch_name)

    def attempt_start_fields(self) -> dict[str, object]:
        """The fields of this process's ``attempt_start`` event (docs/events.md)."""
        fields: dict[str, object] = {
            "attempt": self.attempt, "rank": self.rank, "world_size": self.world_size, "host": self.host,
            "local_rank": self.local_rank, "pid": self.pid, "restart_count": self.restart_count,
        }
        if self.generation is not None:
            fields["generation"] = self.generation
        return fields


def context_from_env(
    *, run_id: str | None, attempt_base: int, environ: Mapping[str, str] | None = None,
    generation_of: Callable[[str], int | None] | None = None,
    attempt_of: Callable[[str, int], int] | None = None, launch: str | None = None,
) -> RunContext:
    """Build the RunContext; ``run_id`` is the already-resolved argument/GOODPUT_RUN_ID, if any.

    ``generation_of(run_id)`` gives this worker's generation (None: unknown); ``attempt_of(run_id, round)`` the
    attempt of this round of the launch (its base counted across launches). Without them the attempt is the
    restart count plus ``attempt_base``.
    """
    env = os.environ if environ is None else environ
    rank = _int_env(env, "RANK", 0, low=0)
    world_size = _int_env(env, "WORLD_SIZE", 1, low=1)
    local_rank = _int_env(env, "LOCAL_RANK", 0, low=0)
    restart_count = _int_env(env, "TORCHELASTIC_RESTART_COUNT", 0, low=0)
    if rank >= world_size:
        raise ConfigError(f"RANK must be smaller than WORLD_SIZE, got RANK={rank} WORLD_SIZE={world_size}.")
    resolved = run_id
    if resolved is None:
        elastic = env.get("TORCHELASTIC_RUN_ID", "").strip()
        if elastic.lower() not in _PLACEHOLDER_RUN_IDS:
            resolved = elastic
    if resolved is None:
        if world_size > 1:
            raise ConfigError(
                "run_id is required for a multi-process job: pass init(run_id=...), set GOODPUT_RUN_ID, "
                f"or start torchrun with --rdzv-id (TORCHELASTIC_RUN_ID is {env.get('TORCHELASTIC_RUN_ID')!r})."
            )
        resolved = f"local-{uuid.uuid4().hex}"
    if not (1 <= len(resolved) <= 256 and resolved.isprintable()):
        raise ConfigError(f"TORCHELASTIC_RUN_ID must be 1-256 printable characters, got {resolved!r}.")
    generation = generation_of(resolved) if generation_of is not None else None
    launch_round = max(restart_count, generation or 0)
    return RunContext(
        run_id=resolved,
        attempt=attempt_of(resolved, launch_round) if attempt_of is not None else launch_round + attempt_base,
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        host=socket.gethostname() or "unknown",
        pid=os.getpid(),
        restart_count=restart_count,
        generation=generation,
        launch=launch,
    )


def _int_env(env: Mapping[str, str], name: str, default: int, *, low: int) -> int:
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError as exc:
        raise ConfigError(f"{name} must be an integer >= {low}, got {text!r}.") from exc
    if value < low:
        raise ConfigError(f"{name} must be an integer >= {low}, got {value}.")
    return value
