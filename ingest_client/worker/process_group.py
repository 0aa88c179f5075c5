"""Mark the time a worker spends inside ``torch.distributed.init_process_group`` (phase ``init_process_group``).

Inside it a worker waits for its peers: a few seconds when they all come; until the timeout (30 minutes by default
for gloo) when one never does. Startup ends where that wait begins, and a round that failed in it spent the wait
waiting for a failure to be detected, as in a hang (docs/ledger.md, "Painting wall time"). The phase's start is
durable, so a worker killed while waiting still left it.

:func:`install` wraps ``init_process_group`` in ``torch.distributed.distributed_c10d`` (and its re-export in
``torch.distributed``), now if torch.distributed is imported, else as soon as it is: a finder on ``sys.meta_path``
patches the module right after it has run, before ``torch.distributed`` copies its names. Nothing else of torch is
imported or changed. The wrapper records through the process's running tracker at the time of the call (asked of
the ``current_tracker`` that :func:`install` was given; none: it only calls through) and never changes what
``init_process_group`` does or raises.

``init()`` installs it (the bootstrap of ``goodput launch`` calls ``init()`` as a worker's interpreter starts, so
the wait is seen even before the script's own ``init()``).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ingest_client.common.events import Phase

if TYPE_CHECKING:
    from ingest_client.worker.tracker import Tracker

MODULE = "torch.distributed.distributed_c10d"
_MARK = "_goodput_phase"


def _no_tracker() -> Tracker | None:
    return None


_current_tracker: Callable[[], Tracker | None] = _no_tracker


def install(current_tracker: Callable[[], Tracker | None]) -> None:
    """Wrap ``init_process_group``, now or when ``torch.distributed`` is imported; idempotent. The wrapper records
    through ``current_tracker()`` at each call."""
    global _current_tracker
    _current_tracker = current_tracker
    module = sys.modules.get(MODULE)
    if module is not None:
        _patch(module)
        package = sys.modules.get("torch.distributed")
        if package is not None and getattr(package, "init_process_group", None) is not None:
            setattr(package, "init_process_group", getattr(module, "init_process_group"))  # noqa: B009, B010
        return
    if not any(isinstance(finder, _PatchOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())


def _patch(module: ModuleType) -> None:
    original = getattr(module, "init_process_group", None)
    if original is None or getattr(original, _MARK, False):
        return
    setattr(module, "init_process_group", _wrapped(original))  # noqa: B010  # a module's attribute, typed as Any


def _wrapped(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        tracker = _current_tracker()
        if tracker is None or not tracker.records_in_this_process:
            return original(*args, **kwargs)
        with tracker.phase(Phase.INIT_PROCESS_GROUP):
            return original(*args, **kwargs)

    setattr(init_process_group, _MARK, True)
    return init_process_group


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for ``MODULE`` it asks the finders after it and makes the loader patch the module
    once it has run (the loader is this import's own instance; only its ``exec_module`` is wrapped)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != MODULE:
            return None
        spec = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        loader = spec.loader if spec is not None else None
        exec_module = getattr(loader, "exec_module", None)
        if loader is None or exec_module is None:
            return spec

        def exec_and_patch(module: ModuleType) -> None:
            exec_module(module)
            _patch(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)  # done: the module is imported once

        loader.exec_module = exec_and_patch  # this import's loader instance only
        return spec
