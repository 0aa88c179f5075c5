"""Hang-detection latency on a real torchrun job: one rank SIGSTOPped at a known time.

    python -m benchmarks.hang_detection [--repeats 3] [--floor 30] [--nproc 2] [--postgres]

Each repetition starts examples/train_ddp.py under torchrun (CPU, gloo, collective timeout 120 s) reporting to
a real `goodput serve`, waits until it trains steadily, SIGSTOPs rank 1, and polls `/v1/runs/{id}/live` every
0.2 s until the run is flagged hung. Latency = time flagged - time of the SIGSTOP; next to it the threshold
(latency - threshold is what detection adds: the poll interval, the request, the client's flush) and the gloo
timeout a job without goodput would wait for before anything noticed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from benchmarks._common import REPO, collector, machine, postgres_database

EXAMPLE = REPO / "examples" / "train_ddp.py"
GLOO_TIMEOUT_S = 120.0
POLL_S = 0.2


def start_job(workdir: Path, url: str, run_id: str, nproc: int) -> tuple[subprocess.Popen[bytes], Path]:
    log_dir = workdir / "logs"
    env = {**os.environ, "GOODPUT_URL": url, "GOODPUT_RUN_ID": run_id, "GOODPUT_SPOOL_DIR": str(workdir / "spool"),
           "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
               "--max-restarts", "0", str(EXAMPLE), "--steps", "1000000", "--checkpoint-every", "0",
               "--step-sleep", "0.05", "--timeout-s", str(GLOO_TIMEOUT_S), "--ckpt-dir", str(workdir / "ckpt"),
               "--log-dir", str(log_dir)]
    out = open(workdir / "torchrun.out", "wb")  # noqa: SIM115 (closed when the job ends)
    proc = subprocess.Popen(command, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)
    return proc, log_dir


def rank_log(log_dir: Path, rank: int) -> list[dict[str, Any]]:
    path = log_dir / f"rank{rank}.jsonl"
    if not path.exists():
        return []
    lines = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            lines.append(json.loads(line))
    return lines


def live(url: str, run_id: str) -> dict[str, Any] | None:
    try:
        response = httpx.get(f"{url}/v1/runs/{run_id}/live", timeout=10)
    except httpx.HTTPError:
        return None
    return response.json() if response.status_code == 200 else None


def wait(predicate: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {what}")


def one(url: str, workdir: Path, run_id: str, nproc: int) -> dict[str, Any]:
    proc, log_dir = start_job(workdir, url, run_id, nproc)
    try:
        wait(lambda: sum(1 for e in rank_log(log_dir, 1) if e["event"] == "step") >= 30, 120, "30 steps")
        wait(lambda: (lv := live(url, run_id)) and lv["median_step_seconds"], 30, "step times at the collector")
        (start,) = [e for e in rank_log(log_dir, 1) if e["event"] == "start"]
        stopped_at = time.time()
        os.kill(int(start["pid"]), signal.SIGSTOP)
        polls = 0
        while time.time() - stopped_at < GLOO_TIMEOUT_S:
            answer = live(url, run_id)
            polls += 1
            if answer and answer["hung"]:
                flagged = time.time()
                last_step_end = max(e["end"] for e in rank_log(log_dir, 0) if e["event"] == "step")
                return {"latency_s": flagged - stopped_at, "threshold_s": answer["threshold_seconds"],
                        "since_progress_s": answer["seconds_since_progress"],
                        "stop_after_last_step_s": stopped_at - last_step_end,
                        "suspects": answer["suspect_ranks"], "polls": polls,
                        "median_step_s": answer["median_step_seconds"]}
            time.sleep(POLL_S)
        raise RuntimeError("not flagged hung before the gloo timeout")
    finally:
        # torchrun starts each worker in a session of its own: kill them by pid, not only torchrun's group
        worker_pids = [int(e["pid"]) for r in range(nproc) for e in rank_log(log_dir, r) if e["event"] == "start"]
        for pid in worker_pids:
            with contextlib.suppress(OSError):
                if b"train_ddp.py" in Path(f"/proc/{pid}/cmdline").read_bytes():  # not a reused pid
                    os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


@contextlib.contextmanager
def database(postgres: bool, folder: Path) -> Iterator[str]:
    if postgres:
        with postgres_database() as url:
            yield url
    else:
        yield f"sqlite:///{folder / 'goodput.db'}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--floor", type=float, default=30.0, help="GOODPUT_HANG_FLOOR_S of the collector")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--postgres", action="store_true", help="the collector on PostgreSQL instead of SQLite")
    args = p.parse_args(argv)
    os.environ["GOODPUT_HANG_FLOOR_S"] = str(args.floor)  # read by the collector process
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                            check=False).stdout
    print(f"hang detection latency: {args.nproc} ranks, rank 1 SIGSTOPped; {machine()}; commit {commit.strip()}")
    print(f"collector on {'PostgreSQL' if args.postgres else 'SQLite'}, hang floor {args.floor:.0f} s, "
          f"gloo timeout {GLOO_TIMEOUT_S:.0f} s, polled every {POLL_S} s")
    rows = []
    with tempfile.TemporaryDirectory() as tmp, database(args.postgres, Path(tmp)) as db, collector(db) as url:
        for i in range(args.repeats):
            workdir = Path(tmp) / f"job{i}"
            workdir.mkdir()
            row = one(url, workdir, f"hang-bench-{i}", args.nproc)
            rows.append(row)
            print(f"  run {i + 1}: flagged {row['latency_s']:6.2f} s after the SIGSTOP; threshold "
                  f"{row['threshold_s']:.1f} s; latency - threshold {row['latency_s'] - row['threshold_s']:+6.2f} s; "
                  f"suspects {row['suspects']}; median step {row['median_step_s']:.3f} s")
    latencies = [r["latency_s"] for r in rows]
    extra = [r["latency_s"] - r["threshold_s"] for r in rows]
    print(f"latency: median {statistics.median(latencies):.2f} s, max {max(latencies):.2f} s; "
          f"latency - threshold: median {statistics.median(extra):+.2f} s, max {max(extra):+.2f} s; "
          f"gloo timeout {GLOO_TIMEOUT_S:.0f} s; rank 1 named in {sum(r['suspects'] == [1] for r in rows)}/{len(rows)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
