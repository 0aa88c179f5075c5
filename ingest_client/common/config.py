"""Client configuration: constructor argument, then environment variable, then default.

Every environment variable the client reads is declared here, once:

``GOODPUT_URL``
    Collector base URL, e.g. ``http://collector:8080``; events go to ``{url}/v1/events``.
``GOODPUT_TOKEN``
    Bearer token sent as ``Authorization: Bearer <token>``.
``GOODPUT_TOKEN_FILE``
    A file that holds the token (its first line; keep it ``chmod 600``), instead of ``GOODPUT_TOKEN``: a token in
    a file is in no process's environment. Set one of the two, not both (``init(token=...)`` or
    ``init(token_file=...)`` wins over both). Never pass a token on a command line: every user of the machine
    reads it there (``ps``, ``/proc/<pid>/cmdline``).
``GOODPUT_MODE``
    ``online`` (spool, then send), ``offline`` (spool only; send later with ``goodput sync``),
    or ``disabled`` (record nothing). Default: ``online`` when a URL is set, else ``offline``.
``GOODPUT_SPOOL_DIR``
    Directory of the local spool. Default: ``~/.cache/goodput/spool``.
``GOODPUT_RUN_ID``
    Run id; takes precedence over torchrun's ``TORCHELASTIC_RUN_ID``.
``GOODPUT_ATTEMPT_BASE``
    Integer added to the attempt number, ``max(TORCHELASTIC_RESTART_COUNT, generation)`` (set by
    ``goodput launch`` for requeued jobs). The collector keeps a launch's numbers where they increase with time.
``GOODPUT_NODE_RELAY``
    ``0``: every rank under ``goodput launch`` sends its own records to the collector (``--no-node-relay``);
    by default the launcher relays its node's ranks' records as one sender (:mod:`ingest_client.launcher.relay`).
``GOODPUT_BOOTSTRAP``
    ``0``: ``goodput launch`` does not start the workers' trackers as their interpreters start
    (:mod:`ingest_client.worker.bootstrap`); same as ``goodput launch --no-bootstrap``. Default on.
``GOODPUT_LAUNCH_ID``
    Set by ``goodput launch``, one per launch: names the node's torchrun agent in the count of worker
    generations and in the launch every record names (:mod:`ingest_client.worker.generation`).
``GOODPUT_GENERATION``, ``GOODPUT_WORKER_PID``
    Set by the client in a worker process when it claims its generation, so that the worker's subprocesses
    and a second ``init()`` reuse it; not for users to set.
``GOODPUT_QUEUE_CAPACITY``
    Rows held in memory before the oldest are dropped (and counted). Default 100000.
``GOODPUT_SPOOL_MAX_BYTES``
    Spool bytes per process, its quarantine of refused batches included, before the oldest quarantined batch, then
    the oldest segment, is dropped (and counted). Default 256 MiB.
``GOODPUT_FLUSH_INTERVAL_S``
    How often the flusher wakes. Default 0.2.
``GOODPUT_HEARTBEAT_INTERVAL_S``
    A rank sends a ``heartbeat`` (the step in progress, the collectives started in it) once it has ended no step
    for this many seconds, and again every interval while it ends none: while it steps, its step records say it
    lives. Default 5.
``GOODPUT_HTTP_TIMEOUT_S``
    Deadline of one whole HTTP request, every request the client makes (connecting, sending, and the answer's
    headers and body: a server that answers a byte at a time cannot hold the sender longer). Default 2.
``GOODPUT_EVENTS_VIA``
    Set by ``goodput launch --node-relay``: the node relay's address (:mod:`ingest_client.launcher.relay`); records go
    there, and the relay forwards them with the node's other ranks' (they stay in this process's spool until the
    collector acknowledged them). Checkpoint requests are still asked of ``GOODPUT_URL``.
``GOODPUT_SIGTERM_REASON``
    ``attempt_end`` reason recorded on SIGTERM: ``failed`` (default) or ``preempted``.
``GOODPUT_EXIT_TIMEOUT_S``
    How long interpreter exit may wait for the last events to be sent. Default 5.
``GOODPUT_SIGNAL_POLL_S``
    How often rank 0 asks the collector for checkpoint requests (``tracker.should_checkpoint()``); 0 turns
    polling off. Default 2.
``GOODPUT_POLL_ALL_RANKS``
    ``1``: every rank polls, not only rank 0 (for scripts that reduce the flag themselves). Default off.
``GOODPUT_STEP_CLOCK``
    What times ``tracker.step()``: ``auto`` (default: CUDA events when the process uses CUDA, so a step is its
    interval on the GPU's timeline; else the host's clocks), ``cpu`` or ``cuda``.

torchrun's own variables (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``TORCHELASTIC_RESTART_COUNT``,
``TORCHELASTIC_RUN_ID``) are read by :mod:`ingest_client.worker.context`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import Enum
from pathlib import Path
from typing import Any, SupportsFloat, SupportsIndex, SupportsInt

from ingest_client.common.errors import ConfigError


class Mode(str, Enum):
    ONLINE = "online"
    OFFLINE = "offline"
    DISABLED = "disabled"


ENV_VARS: dict[str, str] = {
    "url": "GOODPUT_URL",
    "events_via": "GOODPUT_EVENTS_VIA",
    "token": "GOODPUT_TOKEN",
    "token_file": "GOODPUT_TOKEN_FILE",
    "mode": "GOODPUT_MODE",
    "spool_dir": "GOODPUT_SPOOL_DIR",
    "run_id": "GOODPUT_RUN_ID",
    "attempt_base": "GOODPUT_ATTEMPT_BASE",
    "queue_capacity": "GOODPUT_QUEUE_CAPACITY",
    "spool_max_bytes": "GOODPUT_SPOOL_MAX_BYTES",
    "flush_interval_s": "GOODPUT_FLUSH_INTERVAL_S",
    "heartbeat_interval_s": "GOODPUT_HEARTBEAT_INTERVAL_S",
    "http_timeout_s": "GOODPUT_HTTP_TIMEOUT_S",
    "sigterm_reason": "GOODPUT_SIGTERM_REASON",
    "exit_timeout_s": "GOODPUT_EXIT_TIMEOUT_S",
    "signal_poll_s": "GOODPUT_SIGNAL_POLL_S",
    "poll_all_ranks": "GOODPUT_POLL_ALL_RANKS",
    "step_clock": "GOODPUT_STEP_CLOCK",
}

# Variables goodput's own processes set for each other; not for users to set (docs/reference/settings.md).
INTERNAL_ENV_VARS: dict[str, str] = {
    "GOODPUT_LAUNCHED": "`1` in the processes `goodput launch` starts: the launcher reports the run's end, so "
                        "`tracker.finish()` only ends the attempt",
    "GOODPUT_LAUNCH_BASE": "the launch's first attempt, passed from a counted worker to its subprocesses",
    "GOODPUT_LAUNCH_NAME": "the launch's name as every record sends it (`launch`), passed from a worker to its "
                           "subprocesses",
    "GOODPUT_PREEMPTED_MARKER": "a file the launcher writes when the scheduler warned of a preemption, so that a "
                                "worker's SIGTERM ends its attempt `preempted`",
}

DEFAULT_SPOOL_DIR = Path("~/.cache/goodput/spool")
SIGTERM_REASONS = ("failed", "preempted", "completed")
STEP_CLOCKS = ("auto", "cpu", "cuda")


def _where(name: str) -> str:
    env = ENV_VARS.get(name)
    suffix = f" or {env}" if env else ""
    return f"(set by init({name}=...){suffix})."


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientConfig:
    """Resolved client settings. Build with :meth:`from_env`; invalid values raise ConfigError."""

    mode: Mode = Mode.OFFLINE
    url: str | None = None
    events_via: str | None = None
    token: str | None = field(default=None, repr=False)
    token_file: Path | None = None  # where ``token`` was read from (from_env reads it)
    run_id: str | None = None
    spool_dir: Path = DEFAULT_SPOOL_DIR
    attempt_base: int = 0
    queue_capacity: int = 100_000
    spool_max_bytes: int = 256 * 1024 * 1024
    flush_interval_s: float = 0.2
    heartbeat_interval_s: float = 5.0
    stats_interval_s: float = 10.0
    http_timeout_s: float = 2.0
    sigterm_reason: str = "failed"
    exit_timeout_s: float = 5.0
    max_batch_events: int = 500
    max_batch_bytes: int = 1024 * 1024
    install_handlers: bool = True
    signal_poll_s: float = 2.0
    poll_all_ranks: bool = False
    step_clock: str = "auto"

    def __post_init__(self) -> None:
        if not isinstance(self.mode, Mode):
            raise ConfigError(f"mode must be a Mode, got {self.mode!r} {_where('mode')}")
        if self.mode is Mode.ONLINE:
            if not self.url:
                raise ConfigError(f"url is required when mode is 'online', got {self.url!r} {_where('url')}")
            if not self.url.startswith(("http://", "https://")):
                raise ConfigError(
                    f"url must start with http:// or https://, got {self.url!r} {_where('url')}"
                )
        if self.events_via is not None and not self.events_via.startswith(("http://", "https://")):
            raise ConfigError(f"events_via must start with http:// or https://, got {self.events_via!r} "
                              f"{_where('events_via')}")
        if self.run_id is not None and not _is_printable_id(self.run_id, 256):
            raise ConfigError(
                f"run_id must be 1-256 printable characters, got {self.run_id!r} {_where('run_id')}"
            )
        if self.attempt_base < 0:
            raise ConfigError(f"attempt_base must be >= 0, got {self.attempt_base} {_where('attempt_base')}")
        if self.queue_capacity < 64:
            raise ConfigError(
                f"queue_capacity must be at least 64, got {self.queue_capacity} {_where('queue_capacity')}"
            )
        if self.spool_max_bytes < 64 * 1024:
            raise ConfigError(
                f"spool_max_bytes must be at least 65536, got {self.spool_max_bytes} "
                f"{_where('spool_max_bytes')}"
            )
        for name, low, high in (
            ("flush_interval_s", 0.01, 10.0),
            ("heartbeat_interval_s", 0.05, 3600.0),
            ("stats_interval_s", 0.05, 3600.0),
            ("http_timeout_s", 0.05, 300.0),
            ("exit_timeout_s", 0.0, 300.0),
            ("signal_poll_s", 0.0, 3600.0),
        ):
            value = getattr(self, name)
            if not low <= value <= high:
                raise ConfigError(f"{name} must be between {low} and {high}, got {value} {_where(name)}")
        if self.sigterm_reason not in SIGTERM_REASONS:
            raise ConfigError(
                f"sigterm_reason must be one of {', '.join(SIGTERM_REASONS)}, got "
                f"{self.sigterm_reason!r} {_where('sigterm_reason')}"
            )
        if self.step_clock not in STEP_CLOCKS:
            raise ConfigError(f"step_clock must be one of {', '.join(STEP_CLOCKS)}, got {self.step_clock!r} "
                              f"{_where('step_clock')}")
        if self.max_batch_events < 1 or self.max_batch_bytes < 1024:
            raise ConfigError(
                f"max_batch_events must be >= 1 and max_batch_bytes >= 1024, got "
                f"{self.max_batch_events} and {self.max_batch_bytes} (set by init(...))."
            )

    @property
    def polls_signals(self) -> bool:
        return self.mode is Mode.ONLINE and self.url is not None and self.signal_poll_s > 0

    @property
    def events_url(self) -> str | None:
        return None if self.url is None else self.url.rstrip("/") + "/v1/events"

    @property
    def send_url(self) -> str | None:
        """Where a worker's records go: the node relay when there is one, else the collector."""
        return self.events_via.rstrip("/") + "/v1/events" if self.events_via else self.events_url

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, /, **overrides: object) -> ClientConfig:
        """Resolve each field from ``overrides`` (not None), then ``GOODPUT_*``, then the default."""
        env = os.environ if environ is None else environ
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ConfigError(
                f"unknown init() argument(s): {', '.join(unknown)}; accepted: {', '.join(sorted(known))}.")
        values: dict[str, Any] = {}  # Any: each value is converted to its field's type by _convert
        for f in fields(cls):
            raw: object = overrides.get(f.name)
            if raw is None and f.name in ENV_VARS:
                text = env.get(ENV_VARS[f.name], "").strip()
                raw = text if text else None
            if raw is None:
                continue
            values[f.name] = _convert(f.name, raw, f.default)
        values.setdefault("spool_dir", DEFAULT_SPOOL_DIR.expanduser())
        if overrides.get("token") is None and (path := values.get("token_file")) is not None:
            if overrides.get("token_file") is None and "token" in values:
                raise ConfigError(f"token: both {ENV_VARS['token']} and {ENV_VARS['token_file']} are set; set one of "
                                  "them (or pass init(token=...) or init(token_file=...)).")
            values["token"] = read_token_file(path, "init(token_file=...) or GOODPUT_TOKEN_FILE")
        if "mode" not in values:
            values["mode"] = Mode.ONLINE if values.get("url") else Mode.OFFLINE
        return cls(**values)


MAX_TOKEN_FILE_BYTES = 64 * 1024


def token_from_env(env: Mapping[str, str]) -> str | None:
    """GOODPUT_TOKEN, else what GOODPUT_TOKEN_FILE holds; None when neither is set. Raises ConfigError when both
    are set or the file holds no token (as :meth:`ClientConfig.from_env` does)."""
    token = env.get(ENV_VARS["token"], "").strip()
    path = env.get(ENV_VARS["token_file"], "").strip()
    if token and path:
        raise ConfigError(f"both {ENV_VARS['token']} and {ENV_VARS['token_file']} are set; set one of them.")
    return token or (read_token_file(path, ENV_VARS["token_file"]) if path else None)


def token_in_argv_warning(option: str) -> str:
    """What a command says when given a token on its command line (it still uses it)."""
    return (f"{option} puts the token on the command line, where every user of this machine can read it (ps, "
            f"/proc/<pid>/cmdline) for as long as the command runs; use {option}-file FILE, or set GOODPUT_TOKEN_FILE "
            "or GOODPUT_TOKEN, instead")


def read_token_file(path: str | Path, set_by: str) -> str:
    """The token a token file holds: its first line, without surrounding blanks. Raises ConfigError naming the
    file and ``set_by`` (how the user named it) when it cannot be read or holds no token."""
    try:
        with open(Path(path).expanduser(), "rb") as f:
            text = f.read(MAX_TOKEN_FILE_BYTES).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the token file {str(path)!r} (set by {set_by}): {exc}") from None
    lines = text.strip().splitlines()
    token = lines[0].strip() if lines else ""
    if not token or not token.isprintable():
        raise ConfigError(f"the token file {str(path)!r} (set by {set_by}) holds no token: its first line must be "
                          "the token")
    return token


def _convert(name: str, raw: object, default: object) -> object:
    try:
        if name == "mode":
            return raw if isinstance(raw, Mode) else Mode(str(raw).strip().lower())
        if name in ("spool_dir", "token_file"):
            return Path(str(raw)).expanduser()
        if name == "step_clock":
            return str(raw).strip().lower()
        if isinstance(default, bool):
            if isinstance(raw, bool):
                return raw
            return str(raw).strip().lower() in ("1", "true", "yes", "on")
        if isinstance(default, int):
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError(raw)
            if not isinstance(raw, str | bytes | SupportsInt | SupportsIndex):
                raise TypeError(raw)
            return int(raw)
        if isinstance(default, float):
            if not isinstance(raw, str | bytes | SupportsFloat | SupportsIndex):
                raise TypeError(raw)
            return float(raw)
        return str(raw)
    except (TypeError, ValueError) as exc:
        accepted = {
            "mode": "one of online, offline, disabled",
        }.get(name, f"a value of type {type(default).__name__}")
        raise ConfigError(f"{name} must be {accepted}, got {raw!r} {_where(name)}") from exc


def _is_printable_id(value: object, max_len: int) -> bool:
    return isinstance(value, str) and 1 <= len(value) <= max_len and value.isprintable()
