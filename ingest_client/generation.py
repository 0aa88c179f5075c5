"""Worker generations: a node-local count of worker-process starts that equals the global round number.

torchrun's ``TORCHELASTIC_RESTART_COUNT`` counts restarts of the *local* worker group (pytorch/pytorch#108158):
when a worker on node A fails, agent A spends one restart and joins the next rendezvous round; agent B restarts
its workers for the membership change without counting it (``torch/distributed/elastic/agent/server/api.py``,
``_invoke_run``: "membership changes do not count as retries"). Node B's second generation would then report
attempt 0 again, and ``(attempt, rank, step)`` dedupe would drop its recomputed steps.

Every round, every participating agent starts exactly one process per local rank. So the number of worker
processes this agent has started for this local rank before this one is the round number, on every node. The
count lives in one small file per (host, agent, local rank) under the run's spool directory; each worker process
claims one number once, under a file lock, and passes it on in ``GOODPUT_GENERATION`` (with the claiming pid in
``GOODPUT_WORKER_PID``), so that a subprocess of the worker (a spawned DataLoader or compile worker) or a second
``init()`` reuses it and never counts again. Forked children inherit ``os.environ`` and reuse it too.

The agent is named by ``GOODPUT_LAUNCH_ID`` (one per ``goodput launch``), else by the parent process's pid and
start time from ``/proc`` (the torchrun agent, when the worker is its direct child): never by the host alone,
since two agents may run on one host. Counting is exact when every worker process claims as it starts (the
bootstrap of ``goodput launch``, :mod:`ingest_client.bootstrap`); without it a worker claims in ``init()``, and
a generation that died before ``init()`` is not counted (best effort).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import time
from collections.abc import Mapping, MutableMapping
from pathlib import Path

GENERATION_ENV = "GOODPUT_GENERATION"
WORKER_PID_ENV = "GOODPUT_WORKER_PID"
LAUNCH_ID_ENV = "GOODPUT_LAUNCH_ID"
COUNTER_DIR = "generations"

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Windows; the count is then unlocked (one writer per key anyway)
    fcntl = None  # type: ignore[assignment]


def is_torchrun_worker(env: Mapping[str, str]) -> bool:
    """A process torchrun started for a local rank (the agent and the launcher have no ``RANK``)."""
    return "RANK" in env and "TORCHELASTIC_RESTART_COUNT" in env


def inherited_generation(env: Mapping[str, str]) -> int | None:
    """The generation a worker already claimed (this process or its parent), if any."""
    text = env.get(GENERATION_ENV, "").strip()
    return int(text) if text.isdigit() else None


def agent_key(env: Mapping[str, str]) -> str:
    """Who started this worker: ``<host>-<launch id>`` or ``<host>-agent<ppid>.<start ticks>``."""
    host = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname() or "unknown")[:64]
    launch_id = re.sub(r"[^A-Za-z0-9._-]", "_", env.get(LAUNCH_ID_ENV, "").strip())[:64]
    if launch_id:
        return f"{host}-{launch_id}"
    ppid = os.getppid()
    return f"{host}-agent{ppid}.{_start_ticks(ppid)}"


def _start_ticks(pid: int) -> str:
    """Process start time in clock ticks since boot (field 22 of /proc/<pid>/stat), or ``x`` if unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "x"
    fields = stat[stat.rfind(")") + 2 :].split()  # after "(comm) ": field 3 onwards
    return fields[19] if len(fields) > 19 else "x"


def claim_generation(run_dir: Path, env: MutableMapping[str, str]) -> int:
    """This worker process's generation: reused from ``env`` if already claimed, else counted now.

    ``run_dir`` is the run's spool directory. Writes ``GOODPUT_GENERATION`` and ``GOODPUT_WORKER_PID`` into
    ``env`` (``os.environ`` in a worker). Raises OSError if the count cannot be read or written.
    """
    claimed = inherited_generation(env)
    if claimed is not None:
        return claimed
    local_rank = env.get("LOCAL_RANK", "0").strip() or "0"
    directory = run_dir / COUNTER_DIR
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{agent_key(env)}-local{re.sub(r'[^0-9]', '_', local_rank)}.starts"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        if fcntl is not None:
            with contextlib.suppress(OSError):  # no flock on some network file systems: one writer per key anyway
                fcntl.flock(fd, fcntl.LOCK_EX)
        with os.fdopen(os.dup(fd), "rb") as f:
            generation = sum(1 for line in f.read().splitlines() if line.strip())
        # One line per worker-process start: pid and time, for whoever audits the count.
        os.write(fd, f"{os.getpid()} {time.time():.3f}\n".encode())
    finally:
        os.close(fd)  # also drops the lock
    env[GENERATION_ENV] = str(generation)
    env[WORKER_PID_ENV] = str(os.getpid())
    return generation
