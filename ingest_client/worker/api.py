"""``init()``: build the one Tracker of this process from arguments, environment and defaults."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import fields, replace
from pathlib import Path

from ingest_client.common.config import ClientConfig, Mode
from ingest_client.transport.base import Transport
from ingest_client.worker import process_group
from ingest_client.worker.context import context_from_env
from ingest_client.worker.generation import (
    claim_generation,
    claim_launch_attempt,
    inherited_generation,
    is_torchrun_worker,
    launch_name,
)
from ingest_client.worker.signals import ExitHooks
from ingest_client.worker.spool import run_dir_name
from ingest_client.worker.tracker import Tracker

logger = logging.getLogger("ingest_client")

_lock = threading.Lock()
_tracker: Tracker | None = None
_hooks: ExitHooks | None = None
_joinable = False  # the running tracker was started by the bootstrap and no init() of the script joined it yet


def init(
    run_id: str | None = None,
    url: str | None = None,
    token: str | None = None,
    mode: str | None = None,
    spool_dir: str | Path | None = None,
    *,
    transport: Transport | None = None,
    **options: object,
) -> Tracker:
    """Create, start and return this process's Tracker; raises ConfigError on bad configuration.

    Each argument falls back to its ``GOODPUT_*`` variable, then to its default (see
    :mod:`ingest_client.common.config`); ``options`` are the other ClientConfig fields
    (``queue_capacity``, ``spool_max_bytes``, ``sigterm_reason``, ``install_handlers``, ...).
    A second call in the same process returns the running tracker. Under ``goodput launch`` the bootstrap
    started the tracker as the interpreter started (:mod:`ingest_client.worker.bootstrap`): the script's first call
    joins it without a warning, unless its arguments contradict the running configuration.
    """
    global _joinable
    with _lock:
        running = _tracker
        if running is not None and running.records_in_this_process:
            if _joinable:
                wanted = ClientConfig.from_env(
                    run_id=run_id, url=url, token=token, mode=mode, spool_dir=spool_dir, **options
                )
                _joinable = False
                _join_bootstrapped(running, wanted, transport)
            else:
                logger.warning("goodput.init() called again; returning the running tracker")
            return running
        config = ClientConfig.from_env(
            run_id=run_id, url=url, token=token, mode=mode, spool_dir=spool_dir, **options
        )
        return _start(config, transport)


def init_from_bootstrap() -> Tracker:
    """``init()`` as the interpreter starts (:mod:`ingest_client.worker.bootstrap`); the script's ``init()`` joins
    it."""
    global _joinable
    with _lock:
        if _tracker is not None and _tracker.records_in_this_process:
            return _tracker
        tracker = _start(ClientConfig.from_env(), None)
        _joinable = tracker.enabled
        return tracker


def _start(config: ClientConfig, transport: Transport | None) -> Tracker:
    global _tracker, _hooks
    launch = None if config.mode is Mode.DISABLED else launch_name(
        os.environ, torchrun_worker=is_torchrun_worker(os.environ))
    context = context_from_env(run_id=config.run_id, attempt_base=config.attempt_base,
                               generation_of=_generation_counter(config), attempt_of=_launch_counter(config),
                               launch=launch)
    tracker = Tracker(config, context, transport=transport).start()
    if config.install_handlers and tracker.enabled:
        _hooks = ExitHooks(tracker)
        _hooks.install()
    if tracker.enabled:
        process_group.install(get_tracker)
    _tracker = tracker
    return tracker


def _generation_counter(config: ClientConfig) -> Callable[[str], int | None]:
    """This worker's generation (ingest_client.worker.generation): inherited, else claimed once per worker process."""

    def generation_of(run_id: str) -> int | None:
        inherited = inherited_generation(os.environ)
        if inherited is not None or config.mode is Mode.DISABLED or not is_torchrun_worker(os.environ):
            return inherited
        try:
            return claim_generation(config.spool_dir / run_dir_name(run_id), os.environ)
        except OSError as exc:
            logger.warning("goodput: cannot count worker generations in %s (%s); the attempt number is "
                           "torchrun's restart count, which is per node", config.spool_dir, exc)
            return None

    return generation_of


def _launch_counter(config: ClientConfig) -> Callable[[str, int], int]:
    """The attempt of a round of this launch, its base counted across launches of the run (generation.py)."""

    def attempt_of(run_id: str, launch_round: int) -> int:
        if config.mode is Mode.DISABLED:
            return config.attempt_base + launch_round
        try:
            return claim_launch_attempt(config.spool_dir / run_dir_name(run_id), os.environ,
                                        torchrun_worker=is_torchrun_worker(os.environ),
                                        attempt_base=config.attempt_base, offset=launch_round)
        except OSError as exc:
            logger.warning("goodput: cannot count launches of run %s in %s (%s); a relaunch of this run id reuses "
                           "its attempt numbers unless GOODPUT_ATTEMPT_BASE is set", run_id, config.spool_dir, exc)
            return config.attempt_base + launch_round

    return attempt_of


# Settings the running tracker reads when it uses them: the script's init() may change them after the bootstrap.
_ADOPTABLE = ("sigterm_reason", "exit_timeout_s", "install_handlers")


def _join_bootstrapped(tracker: Tracker, wanted: ClientConfig, transport: Transport | None) -> None:
    global _hooks
    running = tracker.config
    differing = [f.name for f in fields(ClientConfig) if getattr(wanted, f.name) != getattr(running, f.name)]
    adopted = {name: getattr(wanted, name) for name in differing if name in _ADOPTABLE}
    if adopted:
        tracker.config = replace(running, **adopted)
        if not tracker.config.install_handlers and _hooks is not None:
            _hooks.uninstall()
            _hooks = None
        elif tracker.config.install_handlers and _hooks is None:
            _hooks = ExitHooks(tracker)
            _hooks.install()
    ignored = [f"{name}={getattr(wanted, name)!r} (running: {getattr(running, name)!r})" if name != "token"
               else "token=... (running: another)" for name in differing if name not in _ADOPTABLE]
    if transport is not None:
        ignored.append("transport=... (running: its own)")
    if ignored:
        logger.warning(
            "goodput.init(): %s contradict the tracker that goodput launch started as this worker's interpreter "
            "started (attempt %d, whose attempt_start is recorded); keeping the running one. Give goodput launch "
            "the same settings (GOODPUT_* variables or its options), or set GOODPUT_BOOTSTRAP=0 to let init() "
            "decide.", ", ".join(ignored), tracker.context.attempt)


def get_tracker() -> Tracker | None:
    """The tracker made by ``init()`` in this process, if any."""
    return _tracker


def reset_for_tests(timeout_s: float = 1.0) -> None:
    """Shut the global tracker down and uninstall its hooks (test isolation)."""
    global _tracker, _hooks, _joinable
    with _lock:
        _joinable = False
        if _hooks is not None:
            _hooks.uninstall()
            _hooks = None
        if _tracker is not None:
            _tracker.shutdown(timeout_s)
            _tracker = None
