"""`goodput serve` with its background analyst observed: `python -m tests.faults.analyst_probe PROBE_DIR serve ...`.

Runs the real command (services.cli.main) in this process (`--workers 1`: uvicorn serves the app here) after
wrapping two names of services.derive.analyst, without changing what they do:

- `try_process_lock` (the analyst's advisory lock, tried once per round): each attempt is appended to
  PROBE_DIR/<pid>.jsonl as {"lock": true|false};
- `WarmAnalyses._round` (runs only while the lock is held): {"round": "start"} and {"round": "end", "built": n}
  around it, and a mutual-exclusion check across processes: the round creates PROBE_DIR/round (O_EXCL) holding
  its pid and removes it at the end; finding it held by another live process is recorded as {"overlap": pid}.

One deliberate pause, for the test to kill a process while it holds the lock: when PROBE_DIR/hold exists, the
first round to rename it to hold.<pid> (atomic: one process wins) records {"holding": true} and waits, lock held,
until PROBE_DIR/release exists.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from services.cli.main import main
from services.derive import analyst

_WRITE = threading.Lock()


def _record(folder: Path, **fields: Any) -> None:
    line = json.dumps({"pid": os.getpid(), **fields}) + "\n"
    with _WRITE, open(folder / f"{os.getpid()}.jsonl", "a") as out:
        out.write(line)
        out.flush()


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie (a SIGKILLed collector not yet reaped by the test is dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _enter_round(folder: Path) -> None:
    marker = folder / "round"
    while True:
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                holder = int(marker.read_text())
            except (OSError, ValueError):  # being written or removed right now: look again
                time.sleep(0.005)
                continue
            if _alive(holder):
                _record(folder, overlap=holder)  # another process is inside a round: the lock failed
                return
            marker.unlink(missing_ok=True)  # left by a process killed inside its round
            continue
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        return


def install(folder: Path) -> None:
    names = vars(analyst)  # the analyst module's own names: what WarmAnalyses.run_once calls
    try_lock = names["try_process_lock"]
    round_ = analyst.WarmAnalyses._round

    def observed_try_lock(conn: Any, key: int) -> bool:
        taken = try_lock(conn, key)
        _record(folder, lock=taken)
        return taken

    def observed_round(self: analyst.WarmAnalyses) -> int:
        _enter_round(folder)
        _record(folder, round="start")
        try:
            try:
                os.rename(folder / "hold", folder / f"hold.{os.getpid()}")
            except FileNotFoundError:
                pass
            else:
                _record(folder, holding=True)
                while not (folder / "release").exists():
                    time.sleep(0.02)
            built = round_(self)
            _record(folder, round="end", built=built)
            return built
        finally:
            marker = folder / "round"
            try:
                if marker.read_text() == str(os.getpid()):
                    marker.unlink()
            except OSError:
                pass

    names["try_process_lock"] = observed_try_lock
    analyst.WarmAnalyses._round = observed_round  # type: ignore[method-assign]


def read_probe(folder: Path) -> dict[int, list[dict[str, Any]]]:
    """Every record of every probed process, by pid."""
    out: dict[int, list[dict[str, Any]]] = {}
    for path in sorted(folder.glob("*.jsonl")):
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]
        out[int(path.stem)] = lines
    return out


if __name__ == "__main__":
    install(Path(sys.argv[1]))
    raise SystemExit(main(sys.argv[2:]))
