"""What ``goodput launch`` learns from torchrun's output: which worker failed, and with what exit status.

torchrun's agent logs the first failure of its worker group as
``failed (exitcode: -9) local_rank: 1 (pid: 4242) of binary: /usr/bin/python3``
(``torch/distributed/elastic/multiprocessing/api.py``; a negative exit code is the signal that killed the worker).
The launcher passes torchrun's stderr on unchanged and reads each line as it goes by. The worker's attempt and rank
come from the launch's own file (:mod:`ingest_client.worker.generation`: every worker process of the launch wrote its
pid, attempt and rank there as it started), so the launcher sends, for that worker, the ``attempt_end`` its process
could not: ``reason: "failed"``, ``exit_code`` and torchrun's line in ``detail`` (docs/events.md, "What the launcher saw
of a worker"). A worker the file does not name (it died before the bootstrap counted it) is left out.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ingest_client.common.events import MAX_DETAIL_CHARS, EventKind
from ingest_client.worker.generation import COUNTER_DIR

logger = logging.getLogger(__name__)

_FAILURE = re.compile(rb"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)")


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerExit:
    exit_code: int  # negative: killed by that signal
    local_rank: int
    pid: int
    line: str  # torchrun's words, from "failed"


def parse_failure(line: bytes) -> WorkerExit | None:
    """torchrun's report of a failed worker in one line of its output, or None."""
    found = _FAILURE.search(line)
    if found is None:
        return None
    text = line[found.start():].decode("utf-8", "replace").strip()
    return WorkerExit(exit_code=int(found[1]), local_rank=int(found[2]), pid=int(found[3]), line=text)


def worker_of(launch_file: Path, pid: int) -> tuple[int, int] | None:
    """(attempt, rank) the worker process ``pid`` claimed in its launch's file (lines ``attempt A pid P time T
    rank R``), or None when the file does not name it with a rank."""
    try:
        lines = launch_file.read_text().splitlines()
    except OSError:
        return None
    for line in reversed(lines):  # the latest claim of a pid wins (pids are reused across rounds, rarely)
        parts = line.split()
        if (len(parts) >= 8 and parts[0] == "attempt" and parts[2] == "pid" and parts[3] == str(pid)
                and parts[6] == "rank" and parts[1].isdigit() and parts[7].isdigit()):
            return int(parts[1]), int(parts[7])
    return None


class WorkerExitReporter:
    """Reads torchrun's output lines; for each failed worker it can name, emits that worker's ``attempt_end``."""

    def __init__(self, emit: Callable[[EventKind, float, dict[str, Any]], None], *, run_dir: Path, launch_key: str,
                 launch_name: str) -> None:
        self._emit = emit
        self._launch_file = run_dir / COUNTER_DIR / f"{launch_key}.launch"
        self._launch_name = launch_name

    def on_line(self, line: bytes) -> None:
        failure = parse_failure(line)
        if failure is None:
            return
        worker = worker_of(self._launch_file, failure.pid)
        if worker is None:
            logger.info("torchrun reported pid %s failed, but this launch did not start it", failure.pid)
            return
        attempt, rank = worker
        self._emit(EventKind.ATTEMPT_END, time.time(), {
            "attempt": attempt, "rank": rank, "launch": self._launch_name, "reason": "failed",
            "exit_code": max(-255, min(255, failure.exit_code)),
            "detail": f"torchrun: {failure.line}"[:MAX_DETAIL_CHARS]})
