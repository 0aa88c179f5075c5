"""Requests at the floor: `goodput serve` (PostgreSQL, one worker) against a bare FastAPI + uvicorn app parsing the
same bodies, under the same load, in one run.

    python -m benchmarks.requests [--connections 64] [--duration 20] [--rounds 2]

The load is Debian's `wrk` (C, one thread; `apt-get install wrk`) with benchmarks/wrk/steps_record.lua: every
request one compact `steps` record of 2 steps from one of 1,024 ranks (what one rank's client posts), with a new
event id and new steps each time, so every request is a real write. The two servers are measured in alternation
(bare, goodput, bare, goodput, ...) after a warm-up, so drift of this shared machine hits both alike. Printed: each
server's requests/s and p50/p99 latency as wrk saw them, the ratio of requests/s, and for goodput the proof that
every acknowledged request was stored (step rows in the database >= 2 x the requests wrk counted as answered 2xx).
Each round also prints the CPU its server used (/proc, over the round): for goodput its processes (the serving one's
event-loop thread apart from its other threads, the group-commit writer's among them) and the database's backends,
so that a round says whether goodput was short of CPU or waited (the machine's cores minus what was used).
Goal (issue 12): goodput >= 0.5 of the bare app's requests/s, p99 < 50 ms at 64 connections.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
from sqlalchemy import text
from sqlalchemy.engine import make_url

from benchmarks._common import REPO, collector_process, free_port, machine, postgres_database
from benchmarks._procs import CLOCK_TICKS, backends, cpu_ticks, total_ticks, tree
from services.storage.db import make_engine
from services.storage.step_columns import stored_step_count

SCRIPT = Path(__file__).with_name("wrk") / "steps_record.lua"
_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


@dataclass(frozen=True)
class WrkResult:
    requests: int
    non_2xx: int
    errors: int
    requests_per_s: float
    p50_s: float
    p99_s: float

    def line(self) -> str:
        return (f"{self.requests_per_s:8.0f} req/s  p50 {self.p50_s * 1e3:6.1f} ms  p99 {self.p99_s * 1e3:6.1f} ms  "
                f"({self.requests} requests, {self.non_2xx} non-2xx, {self.errors} socket errors)")


def run_wrk(url: str, *, connections: int, duration_s: int, run_id: str) -> WrkResult:
    env = {**os.environ, "RUN_ID": run_id, "T0": f"{time.time() - 3600:.3f}", "RANKS": "1024"}
    out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{duration_s}s", "--latency", "-s", str(SCRIPT), url],
                         env=env, capture_output=True, text=True, check=True).stdout
    return parse_wrk(out)


@dataclass(frozen=True)
class RoundCpu:
    """CPU seconds a server used during one round: its processes, its serving process's event-loop (main) thread,
    and the database's backends (0 for the bare app)."""

    seconds: float
    server: float
    event_loop: float
    database: float

    def line(self, requests: int) -> str:
        per = 1e6 / max(1, requests)
        text = (f"cpu {self.server / self.seconds:.2f} cores ({self.server * per:.0f} us a request; event loop "
                f"{self.event_loop / self.seconds:.2f}, other threads and processes "
                f"{(self.server - self.event_loop) / self.seconds:.2f})")
        if self.database:
            text += f", PostgreSQL {self.database / self.seconds:.2f} cores ({self.database * per:.0f} us a request)"
        return text


class CpuWindow:
    """Measures `RoundCpu` between `start` and `stop`: `server` is the root pid of the server's processes,
    `database` the database whose backends count."""

    def __init__(self, server: int, database: str | None = None) -> None:
        self._server = server
        self._database = database

    def _read(self) -> tuple[float, int, int, int]:
        event_loop = cpu_ticks(self._server, thread=self._server) or 0
        database = total_ticks(backends(self._database)) if self._database else 0
        return time.monotonic(), total_ticks(tree(self._server)), event_loop, database

    def start(self) -> None:
        self._begin = self._read()

    def stop(self) -> RoundCpu:
        end = self._read()
        begin = self._begin
        return RoundCpu(seconds=end[0] - begin[0], server=(end[1] - begin[1]) / CLOCK_TICKS,
                        event_loop=(end[2] - begin[2]) / CLOCK_TICKS, database=(end[3] - begin[3]) / CLOCK_TICKS)


def measured_round(url: str, cpu: CpuWindow, *, connections: int, duration_s: int,
                   run_id: str) -> tuple[WrkResult, RoundCpu]:
    cpu.start()
    result = run_wrk(url, connections=connections, duration_s=duration_s, run_id=run_id)
    return result, cpu.stop()


def parse_wrk(out: str) -> WrkResult:
    def duration(label: str) -> float:
        match = re.search(rf"^\s*{label}\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        if match is None:
            raise ValueError(f"wrk printed no {label} latency:\n{out}")
        return float(match.group(1)) * _UNITS[match.group(2)]

    total = re.search(r"(\d+) requests in", out)
    rate = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if total is None or rate is None:
        raise ValueError(f"unexpected wrk output:\n{out}")
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    return WrkResult(requests=int(total.group(1)), non_2xx=int(non_2xx.group(1)) if non_2xx else 0,
                     errors=sum(int(g) for g in errors.groups()) if errors else 0,
                     requests_per_s=float(rate.group(1)), p50_s=duration("50%"), p99_s=duration("99%"))


@contextlib.contextmanager
def bare_app() -> Iterator[tuple[str, int]]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "benchmarks.bare_app:app", "--port", str(port),
                             "--log-level", "warning"], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{url}/docs", timeout=1)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the bare app did not start") from None
                time.sleep(0.2)
        yield url, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--duration", type=int, default=20, help="seconds per measured round and server")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        print("benchmarks.requests needs wrk: apt-get install wrk", file=sys.stderr)
        return 2
    print(f"machine: {machine()}; {args.connections} connections, {args.rounds} rounds of {args.duration} s each")
    bare: list[WrkResult] = []
    ours: list[WrkResult] = []
    used: list[RoundCpu] = []
    with (postgres_database() as database_url, collector_process(database_url) as (goodput_url, goodput_pid),
          bare_app() as (bare_url, bare_pid)):
        bare_cpu = CpuWindow(bare_pid)
        goodput_cpu = CpuWindow(goodput_pid, make_url(database_url).database)
        for url, tag in ((bare_url, "warm-bare"), (goodput_url, "warm")):
            run_wrk(url, connections=args.connections, duration_s=5, run_id=tag)
        for round_ in range(args.rounds):
            result, cpu = measured_round(bare_url, bare_cpu, connections=args.connections,
                                         duration_s=args.duration, run_id="bare")
            bare.append(result)
            print(f"round {round_ + 1} bare FastAPI  {result.line()}\n    {cpu.line(result.requests)}", flush=True)
            result, cpu = measured_round(goodput_url, goodput_cpu, connections=args.connections,
                                         duration_s=args.duration, run_id=f"r{round_}")
            ours.append(result)
            used.append(cpu)
            print(f"round {round_ + 1} goodput serve {result.line()}\n    {cpu.line(result.requests)}", flush=True)
        engine = make_engine(database_url)
        with engine.connect() as conn:
            # step rows, in `steps` or in block rows: a step record's event row goes once its rows moved
            stored = sum(stored_step_count(conn, pk) for (pk,) in conn.execute(
                text("SELECT id FROM runs WHERE run_id NOT LIKE 'warm%'")).all())
        engine.dispose()
    answered = sum(r.requests - r.non_2xx for r in ours)
    ratio = statistics.mean(r.requests_per_s for r in ours) / statistics.mean(r.requests_per_s for r in bare)
    p99 = max(r.p99_s for r in ours)
    print(f"goodput / bare requests/s: {ratio:.2f} (goal >= 0.5); goodput p99 (worst round) {p99 * 1e3:.1f} ms "
          f"(goal < 50 ms)")
    busy = statistics.mean((c.server + c.database) / c.seconds for c in used)
    print(f"goodput and PostgreSQL used {busy:.2f} of the machine's {os.cpu_count()} cores in its rounds (wrk "
          "besides)")
    ok = stored >= 2 * answered  # two steps a request
    print(f"stored step rows {stored} for {answered} requests answered 2xx, two steps each "
          f"({'ok' if ok else 'MISSING STEPS'}); non-2xx {sum(r.non_2xx for r in ours)}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
