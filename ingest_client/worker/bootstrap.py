"""Start a torchrun worker's tracker as its interpreter starts, before the training script runs.

``goodput launch`` prepends ``ingest_client/_bootstrap`` to the command's ``PYTHONPATH``; the ``sitecustomize``
there calls :func:`start_worker` in torchrun workers only (``RANK`` and ``TORCHELASTIC_RESTART_COUNT`` set, and
not a process that inherited a worker's environment). It runs the normal ``init()`` path: the worker claims its
generation (:mod:`ingest_client.worker.generation`), ``attempt_start`` is recorded and the exit hooks are installed, so
an attempt that dies in rendezvous, ``init_process_group`` or an import is counted and ends ``failed`` on an
exception or SIGTERM. The script's own ``goodput.init()`` later joins this tracker.

It never breaks the worker: an error is swallowed and reported once on stderr (logging is not configured yet at
interpreter start). ``GOODPUT_BOOTSTRAP=0`` or ``goodput launch --no-bootstrap`` turns it off.
"""

from __future__ import annotations

import os
import sys

from ingest_client.worker.generation import WORKER_PID_ENV


def start_worker() -> None:
    """``init()`` for this worker; errors are reported once and swallowed."""
    # Subprocesses of this worker skip the bootstrap even if no generation gets claimed (GOODPUT_MODE=disabled).
    os.environ.setdefault(WORKER_PID_ENV, str(os.getpid()))
    try:
        from ingest_client.worker.api import init_from_bootstrap

        init_from_bootstrap()
    except Exception as exc:
        sys.stderr.write(
            "goodput: the bootstrap could not start this worker's tracker, so an attempt that fails before the "
            f"script calls goodput.init() is not recorded ({type(exc).__name__}: {exc})\n"
        )
