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
bootstrap of ``goodput launch``, :mod:`ingest_client.worker.bootstrap`); without it a worker claims in ``init()``, and
a generation that died before ``init()`` is not counted (best effort).

Launch names (:func:`launch_name`): every record names the launch that numbered its attempt (``launch`` on the wire),
from the launch key below and the machine's boot id, without any file. The collector numbers the run's attempts from
every launch's (docs/events.md, "Attempt numbers"): a relaunch on another machine with a fresh spool, and the nodes
of one multi-node launch (one launch name per node), are told apart and joined there, not here.

Launch bases (:func:`claim_launch_attempt`): where this host's spool saw earlier launches of the run, a relaunch
numbers its rounds after theirs (the collector keeps numbers that increase with time). Every launch of the run on
this host has one small file under the same directory, ``<launch key>.launch``, naming its first attempt (its
*base*), its owner process and every attempt a process of it took. A process of a launch that has no file yet
claims its base under a file lock: the base of a concurrent launch of the run still alive on this host (another
node's agent on the same machine), else one more than the largest attempt any earlier launch of the run on this host
took (0 for the first). The other
processes of the launch read the same file, so the ranks of one launch agree whatever order they start in. The
launch key: ``GOODPUT_LAUNCH_ID`` (``goodput launch``, or a framework callback in the process that spawns the
others), else the torchrun agent that started the worker, else the process itself.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import socket
import time
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

GENERATION_ENV = "GOODPUT_GENERATION"
WORKER_PID_ENV = "GOODPUT_WORKER_PID"
LAUNCH_ID_ENV = "GOODPUT_LAUNCH_ID"
LAUNCH_BASE_ENV = "GOODPUT_LAUNCH_BASE"  # the launch's first attempt, passed on to subprocesses like the generation
LAUNCH_NAME_ENV = "GOODPUT_LAUNCH_NAME"  # the launch as named on the wire (launch_name), passed on likewise
COUNTER_DIR = "generations"
LAUNCHES_LOCK = "launches.lock"



def is_torchrun_worker(env: Mapping[str, str]) -> bool:
    """A process torchrun started for a local rank (the agent and the launcher have no ``RANK``)."""
    return "RANK" in env and "TORCHELASTIC_RESTART_COUNT" in env


def inherited_generation(env: Mapping[str, str]) -> int | None:
    """The generation a worker already claimed (this process or its parent), if any."""
    text = env.get(GENERATION_ENV, "").strip()
    return int(text) if text.isdigit() else None


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname() or "unknown")[:64]


def agent_key(env: Mapping[str, str]) -> str:
    """Who started this worker: ``<host>-<launch id>`` or ``<host>-agent<ppid>.<start ticks>``."""
    host = _host()
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


def launch_key(env: Mapping[str, str], *, torchrun_worker: bool) -> tuple[str, int]:
    """This process's launch and the pid that lives as long as it: ``(key, owner pid)``.

    ``<host>-<launch id>`` when ``GOODPUT_LAUNCH_ID`` is set, else the torchrun agent (``<host>-agent<ppid>.<ticks>``,
    owner: the agent), else this process (``<host>-proc<pid>.<ticks>``, owner: itself).
    """
    ppid, pid = os.getppid(), os.getpid()
    owner = ppid if torchrun_worker else pid
    if env.get(LAUNCH_ID_ENV, "").strip():
        return agent_key(env), owner
    if torchrun_worker:
        return f"{_host()}-agent{ppid}.{_start_ticks(ppid)}", owner
    return f"{_host()}-proc{pid}.{_start_ticks(pid)}", owner


def claim_launch_attempt(run_dir: Path, env: MutableMapping[str, str], *, torchrun_worker: bool, attempt_base: int,
                         offset: int) -> int:
    """This process's attempt: its launch's base (claimed once per launch, see the module doc) plus ``offset``.

    ``offset`` is the round within the launch (``max(TORCHELASTIC_RESTART_COUNT, generation)``); ``attempt_base``
    (``GOODPUT_ATTEMPT_BASE``) is the lowest base a new launch takes. A base inherited in ``GOODPUT_LAUNCH_BASE``
    (a subprocess of a counted process) is reused without touching the files. Writes ``GOODPUT_LAUNCH_BASE`` into
    ``env``. Raises OSError if the files cannot be read or written.
    """
    inherited = env.get(LAUNCH_BASE_ENV, "").strip()
    if inherited.isdigit():
        return int(inherited) + offset
    key, owner = launch_key(env, torchrun_worker=torchrun_worker)
    directory = run_dir / COUNTER_DIR
    directory.mkdir(parents=True, exist_ok=True)
    lock_fd = os.open(directory / LAUNCHES_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        with contextlib.suppress(OSError):  # no flock on some network file systems: best effort
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        host = _host()
        launches = {path.name[: -len(".launch")]: _read_launch(path) for path in directory.glob("*.launch")}
        mine = {name: launch for name, launch in launches.items() if launch is not None and launch.host == host}
        path = directory / f"{key}.launch"
        if key in mine:
            base = mine[key].base
        else:
            alive = [launch.base for launch in mine.values() if _alive(launch.owner_pid, launch.owner_ticks)]
            if alive:  # another agent of this run on this host, started at the same time: the same launch round
                base = max(alive)
            else:
                taken = [launch.largest for launch in mine.values()]
                base = max(attempt_base, max(taken) + 1 if taken else 0)
            with open(path, "a") as f:
                f.write(f"base {base} host {host} owner {owner} {_start_ticks(owner)}\n")
        attempt = base + offset
        rank = env.get("RANK", "").strip()
        with open(path, "a") as f:  # one line per counted process: the largest tells the next launch where to start;
            # the rank lets `goodput launch` name a worker torchrun saw exit (ingest_client.launcher.worker_exits)
            f.write(f"attempt {attempt} pid {os.getpid()} time {time.time():.3f}"
                    f"{f' rank {rank}' if rank.isdigit() else ''}\n")
    finally:
        os.close(lock_fd)  # also drops the lock
    env[LAUNCH_BASE_ENV] = str(base)
    return attempt


def launch_name(env: MutableMapping[str, str], *, torchrun_worker: bool) -> str:
    """The launch this process belongs to, as every record names it (``launch``): its key (:func:`launch_key`) and
    the machine's boot id, so that no other launch anywhere has it (a pod rescheduled onto another node may keep
    its host name, and its agent its pid). Inherited from ``GOODPUT_LAUNCH_NAME`` when set (a subprocess of a
    counted process), else made and written there. No file is read or written: the collector numbers the run's
    attempts from every launch's (docs/events.md, "Attempt numbers")."""
    inherited = env.get(LAUNCH_NAME_ENV, "").strip()
    if inherited:
        return inherited
    key, _ = launch_key(env, torchrun_worker=torchrun_worker)
    name = f"{key}.{_boot_id()}"[:128]
    env[LAUNCH_NAME_ENV] = name
    return name


def _boot_id() -> str:
    """This machine's boot id (Linux: random per boot, shared by its containers), shortened; ``x`` if unknown."""
    try:
        text = Path("/proc/sys/kernel/random/boot_id").read_text()
    except OSError:
        return "x"
    return re.sub(r"[^0-9a-f]", "", text.lower())[:12] or "x"


@dataclass(frozen=True, slots=True)
class _Launch:
    base: int
    largest: int  # the largest attempt a process of this launch took
    host: str
    owner_pid: int
    owner_ticks: str


def _read_launch(path: Path) -> _Launch | None:
    """A launch file's first line and attempts; None if it is unreadable or torn (a launch killed mid-write)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    first = lines[0].split() if lines else []
    if len(first) != 7 or first[0] != "base" or not first[1].isdigit() or not first[5].isdigit():
        return None
    base = int(first[1])
    attempts = [int(parts[1]) for parts in (line.split() for line in lines[1:])
                if len(parts) >= 2 and parts[0] == "attempt" and parts[1].isdigit()]
    return _Launch(base=base, largest=max([base, *attempts]), host=first[3], owner_pid=int(first[5]),
                   owner_ticks=first[6])


def _alive(pid: int, ticks: str) -> bool:
    """The process ``pid`` still runs and is the one recorded (same start time, so not a reused pid)."""
    return ticks != "x" and pid > 0 and _start_ticks(pid) == ticks
