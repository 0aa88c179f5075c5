"""`make demo`: a collector with real and simulated runs in it, in about a minute.

1. starts `goodput serve` (collector + dashboard) on SQLite in the demo folder (default `.demo/`);
2. runs examples/train_ddp.py under `goodput launch -- torchrun` (2 ranks, CPU, gloo) and SIGKILLs one
   worker mid-run: torchrun restarts the group, which resumes from its last checkpoint (restart, rework);
3. runs a second short job with a straggling rank and a rank that hangs until the gloo timeout (hang);
4. sends three bigger simulated runs with `goodput simulate`, for a fuller fleet view;
5. prints `goodput runs` and where to look, then keeps the collector running until Ctrl-C
   (`--exit-after-seed` stops after step 4, for tests and CI).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "train_ddp.py"
GOODPUT = [sys.executable, "-m", "services.cli"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]

SIMULATED = [
    ("sim-llm-64gpu", ["--ranks", "64", "--hours", "2", "--mtbf", "1800", "--checkpoint-every", "200", "--seed", "1"]),
    ("sim-straggler-16gpu", ["--ranks", "16", "--hours", "1", "--mtbf", "0", "--straggler-rank", "3",
                             "--straggler-factor", "1.4", "--seed", "2"]),
    ("sim-hang-32gpu", ["--ranks", "32", "--hours", "1", "--mtbf", "0", "--hang-at-step", "900",
                        "--hang-seconds", "600", "--seed", "3"]),
]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Start a goodput collector and feed it real and simulated runs.")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--dir", type=Path, default=REPO / ".demo", help="demo folder (database, jobs, spool)")
    p.add_argument("--exit-after-seed", action="store_true", help="stop the collector once the runs are in")
    p.add_argument("--fresh", action="store_true", help="delete the previous demo's database first (make demo FRESH=1)")
    args = p.parse_args(argv)
    url = f"http://127.0.0.1:{args.port}"
    if _port_in_use(args.port):
        print(f"demo: port {args.port} is already in use; pick another with `make demo PORT=8001` "
              f"(or scripts/demo.py --port 8001)", file=sys.stderr)
        return 1

    demo_dir = keep_or_clear(args.dir.resolve(), fresh=args.fresh)
    env = dict(os.environ, PYTHONPATH=str(REPO), GOODPUT_URL=url, GOODPUT_SPOOL_DIR=str(demo_dir / "spool"),
               OMP_NUM_THREADS="1")
    env.pop("GOODPUT_RUN_ID", None)
    env.pop("GOODPUT_DATABASE_URL", None)

    _section("1/4  collector")
    server_log = open(demo_dir / "collector.log", "wb")  # noqa: SIM115 - open while the collector runs
    server = subprocess.Popen([*GOODPUT, "serve", "--port", str(args.port)], cwd=demo_dir, env=env,
                              stdout=server_log, stderr=subprocess.STDOUT)
    try:
        _wait_healthy(url, server, demo_dir / "collector.log")
        print(f"collector   {url}  (API docs {url}/docs; database {demo_dir / 'goodput.db'})")
        print(f"dashboard   {url}/dashboard/")
        stamp = time.strftime("%Y%m%d-%H%M%S")
        runs = seed(demo_dir, env, url, stamp)
        _section("summary: goodput runs")
        subprocess.run([*GOODPUT, "runs", "--url", url], env=env, check=False)
        print()
        print(f"Open {url}/dashboard/ for the fleet view and each run's timeline.")
        print("Per run, in the terminal:   " + "   ".join(
            f"goodput ledger {run} --url {url}" for run in runs[:1]))
        print(f"The API:                    curl {url}/v1/runs/{runs[0]}/waste")
        print(f"The jobs' own logs:         {demo_dir / 'jobs'}/<job>/logs/rank<R>.jsonl")
        if args.exit_after_seed:
            return 0
        print(f"\nThe collector keeps running on {url}; Ctrl-C to stop.", flush=True)
        try:
            server.wait()
        except KeyboardInterrupt:
            print("\ndemo: stopping the collector")
        return 0
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGINT)
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                server.kill()
        server_log.close()


def keep_or_clear(demo_dir: Path, *, fresh: bool) -> Path:
    """The demo folder, ready: the previous demo's database kept (its runs stay listed beside the new ones) unless
    `fresh`, saying which; the previous jobs' folders and client spool always cleared (their logs and unsent
    records belong to runs that are over)."""
    database = demo_dir / "goodput.db"
    if fresh and demo_dir.exists():
        print(f"demo: --fresh: deleting the previous demo in {demo_dir}")
        shutil.rmtree(demo_dir)
    elif database.exists():
        print(f"demo: keeping the previous demo's runs in {database}; this demo adds its own beside them "
              "(`make demo FRESH=1` or scripts/demo.py --fresh starts from an empty database)")
    for scratch in ("jobs", "spool"):
        shutil.rmtree(demo_dir / scratch, ignore_errors=True)
    demo_dir.mkdir(parents=True, exist_ok=True)
    return demo_dir


def seed(demo_dir: Path, env: dict[str, str], url: str, stamp: str) -> list[str]:
    """Run the two real jobs and send the simulated runs; returns the run ids."""
    runs: list[str] = []

    _section("2/4  a real torchrun job (2 ranks); one worker is SIGKILLed mid-run")
    run_id = f"ddp-restart-{stamp}"
    job = _start_job(demo_dir / "jobs" / "restart", env, run_id, max_restarts=2, args=[
        "--steps", "60", "--checkpoint-every", "20", "--step-sleep", "0.05"])
    victim = _wait_log(job, lambda e: e["event"] == "step" and e["rank"] == 1 and e["step"] >= 30, 120)
    pid = _pid(job, rank=1, attempt=0)
    os.kill(pid, signal.SIGKILL)
    print(f"killed rank 1 (pid {pid}) after step {victim['step']}; torchrun restarts the group")
    _finish_job(job)
    runs.append(run_id)
    resumed = [e for e in _logs(job) if e["event"] == "resumed" and e["attempt"] == 1 and e["rank"] == 0]
    if resumed:
        print(f"attempt 1 resumed from step {resumed[0]['step']} ({resumed[0]['checkpoint']}); "
              f"steps {resumed[0]['step'] + 1}-{victim['step']} were computed twice")

    _section("3/4  a second job: rank 1 straggles in every step, then rank 0 hangs at step 30")
    run_id = f"ddp-straggler-hang-{stamp}"
    job = _start_job(demo_dir / "jobs" / "straggler-hang", env, run_id, max_restarts=1, args=[
        "--steps", "40", "--checkpoint-every", "20", "--step-sleep", "0.02", "--straggler-rank", "1",
        "--straggler-sleep", "0.05", "--hang-at-step", "30", "--hang-rank", "0", "--hang-mode", "sleep",
        "--timeout-s", "4"])
    print("rank 0 sleeps forever at step 30; rank 1 gives up after the 4 s gloo timeout and torchrun restarts")
    _finish_job(job)
    runs.append(run_id)

    _section("4/4  three bigger simulated runs (goodput simulate)")
    for sim_id, sim_args in SIMULATED:
        run_id = f"{sim_id}-{stamp}"
        subprocess.run([*GOODPUT, "simulate", "--url", url, "--run-id", run_id, *sim_args], env=env, check=True)
        runs.append(run_id)
    _wait_until_in(url, runs)
    return runs


class _Job:
    def __init__(self, workdir: Path, proc: subprocess.Popen[bytes], output: Path, run_id: str) -> None:
        self.workdir, self.proc, self.output, self.run_id = workdir, proc, output, run_id


def _start_job(workdir: Path, env: dict[str, str], run_id: str, *, max_restarts: int, args: list[str]) -> _Job:
    workdir.mkdir(parents=True)
    command = [*GOODPUT, "launch", "--run-id", run_id, "--", *TORCHRUN, "--standalone", "--nproc-per-node", "2",
               "--max-restarts", str(max_restarts), "--monitor-interval", "0.1", str(EXAMPLE),
               "--ckpt-dir", str(workdir / "ckpt"), "--log-dir", str(workdir / "logs"), *args]
    print(f"run {run_id}:\n  goodput launch --run-id {run_id} -- torchrun --standalone --nproc-per-node 2 "
          f"--max-restarts {max_restarts} examples/train_ddp.py {' '.join(args)}")
    output = workdir / "torchrun.out"
    with open(output, "wb") as out:
        proc = subprocess.Popen(command, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    return _Job(workdir, proc, output, run_id)


def _finish_job(job: _Job, timeout_s: float = 180.0) -> None:
    try:
        code = job.proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(job.proc.pid, signal.SIGKILL)
        job.proc.wait()
        raise SystemExit(f"demo: job {job.run_id} did not finish in {timeout_s:.0f} s; see {job.output}") from None
    if code != 0:
        raise SystemExit(f"demo: job {job.run_id} exited with {code}; see {job.output}")
    done = [e for e in _logs(job) if e["event"] == "done"]
    digest = done[0]["digest"][:12] if done else "?"
    print(f"  finished: step {done[0]['final_step'] if done else '?'}, model digest {digest}")


def _logs(job: _Job) -> list[dict[str, Any]]:
    out = []
    for path in sorted((job.workdir / "logs").glob("rank*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def _pid(job: _Job, *, rank: int, attempt: int) -> int:
    return next(int(e["pid"]) for e in _logs(job)
                if e["event"] == "start" and e["rank"] == rank and e["attempt"] == attempt)


def _wait_log(job: _Job, predicate: Any, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for event in _logs(job):
            if predicate(event):
                return event
        if job.proc.poll() is not None:
            break
        time.sleep(0.05)
    os.killpg(job.proc.pid, signal.SIGKILL)
    raise SystemExit(f"demo: job {job.run_id} did not get that far; see {job.output}")


def _wait_until_in(url: str, runs: list[str], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        listed = {r["run_id"] for r in httpx.get(f"{url}/v1/runs", timeout=60).json()["runs"]}
        if set(runs) <= listed:
            return
        time.sleep(0.5)
    print(f"demo: some runs are not in the collector yet: {sorted(set(runs) - listed)}", file=sys.stderr)


def _wait_healthy(url: str, server: subprocess.Popen[bytes], log: Path, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"demo: goodput serve exited with {server.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"demo: goodput serve did not become healthy in {timeout_s:.0f} s; see {log}")


def _port_in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _section(title: str) -> None:
    print(f"\n== {title}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
