"""What processes cost, read from /proc: a process's tree, its CPU (and its threads'), PostgreSQL's backends."""

from __future__ import annotations

import os
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            out += [int(p) for p in (task / "children").read_text().split()]
    except OSError:
        pass
    return out


def tree(root: int) -> list[int]:
    """`root` and every process it started, theirs too."""
    pids = [root]
    i = 0
    while i < len(pids):
        pids += _children(pids[i])
        i += 1
    return pids


def cpu_ticks(pid: int, thread: int | None = None) -> int | None:
    """User + system CPU of a process (all its threads), or of one of its threads; None when it is gone."""
    path = f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat"
    try:
        fields = Path(path).read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])


def total_ticks(pids: list[int]) -> int:
    """The CPU ticks of the processes of `pids` still alive."""
    return sum(t for pid in pids if (t := cpu_ticks(pid)) is not None)


def backends(database: str) -> list[int]:
    """PostgreSQL backends connected to `database` (their title names it)."""
    needle = f" {database} ".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "cmdline").read_bytes().replace(b"\0", b" "):
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


class CpuMeter:
    """CPU seconds of a changing set of processes: the sum of each one's growth while it was seen, in all and per
    process."""

    def __init__(self) -> None:
        self._last: dict[int, int] = {}
        self.ticks = 0
        self.ticks_by_pid: dict[int, int] = {}

    def sample(self, pids: list[int]) -> None:
        for pid in pids:
            ticks = cpu_ticks(pid)
            if ticks is None:
                continue
            grown = ticks - self._last.get(pid, ticks)
            self.ticks += grown
            self.ticks_by_pid[pid] = self.ticks_by_pid.get(pid, 0) + grown
            self._last[pid] = ticks

    @property
    def seconds(self) -> float:
        return self.ticks / CLOCK_TICKS

    def seconds_by(self, role_of: dict[int, str]) -> dict[str, float]:
        """CPU seconds per role (`role_of`: pid -> role; a pid without one counts as "other")."""
        out: dict[str, float] = {}
        for pid, ticks in self.ticks_by_pid.items():
            role = role_of.get(pid, "other")
            out[role] = out.get(role, 0.0) + ticks / CLOCK_TICKS
        return out
