"""benchmarks/gilprobe.py, installed as a process's sitecustomize, reports the long C calls of the threads it is
told to watch, and only theirs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Two threads make the same long C call (sorting three million ints holds the GIL throughout); one is watched.
_SCRIPT = """
import threading, time
def sort_many():
    sorted(range(3_000_000, 0, -1))
for name in ("goodput-analysis", "goodput-writer-0"):
    thread = threading.Thread(target=sort_many, name=name)
    thread.start()
    thread.join()
time.sleep(1.5)
"""


def test_the_probe_reports_a_watched_thread_s_long_c_call_and_not_the_others(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    shutil.copy(REPO / "benchmarks" / "gilprobe.py", site / "sitecustomize.py")
    reports = tmp_path / "reports"
    reports.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site), "GILPROBE": str(reports), "GILPROBE_EVERY_S": "0.5"}
    # "serve" on the command line: the probe installs itself only in the collector's processes
    subprocess.run([sys.executable, "-c", _SCRIPT, "serve"], env=env, check=True, timeout=60)
    (report,) = reports.glob("gil-*.txt")
    lines = report.read_text().splitlines()
    assert lines[0].startswith("total ms")
    watched = [line for line in lines[1:] if "goodput-analysis" in line]
    assert len(watched) == 1 and " sorted @<string>:4" in watched[0]
    total_ms, calls, longest_ms = (float(v) for v in watched[0].split()[:3])
    assert calls == 1 and longest_ms >= 4.0 and total_ms == longest_ms
    assert not any("goodput-writer" in line for line in lines)


def test_without_serve_on_its_command_line_a_process_is_left_alone(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    shutil.copy(REPO / "benchmarks" / "gilprobe.py", site / "sitecustomize.py")
    env = {**os.environ, "PYTHONPATH": str(site), "GILPROBE": str(tmp_path), "GILPROBE_EVERY_S": "0.5"}
    subprocess.run([sys.executable, "-c", _SCRIPT], env=env, check=True, timeout=60)
    assert not list(tmp_path.glob("gil-*.txt"))
