"""Load: a fleet of simulated ranks streaming into `goodput serve` on PostgreSQL, then the proof that nothing was lost.

    python -m benchmarks.load [--ranks 10240] [--duration 600] [--workers 2] [--generators 1]

Every rank does one training step a second and posts exactly as ingest_client does under `goodput launch`, through
one node relay per `--ranks-per-sender` ranks (8 by default; 1: each rank its own sender) (benchmarks/_fleet.py: one
request per send round with every record not acknowledged yet, compact `steps` records with `comm`, heartbeats
once a rank has ended no step for 5 s, following the collector's `Goodput-Send-Interval`, Retry-After and backoff).
Ranks are grouped into runs of `--ranks-per-run` (a fleet of jobs), started over `--ramp` seconds. The load generator
is hand-written HTTP/1.1 over asyncio streams with a bounded pool of keep-alive connections (benchmarks/_http1.py)
in `--generators` processes; its own CPU is measured and printed. Only loopback addresses are used.

At `--hang-at` seconds one rank of one run stops stepping while every process stays alive and heart-beats (the
others wait for it in the step's collective); the benchmark polls `GET /v1/runs/{id}/live` every second and
reports when the run is flagged against its threshold, and whom it names.

Reported: throughput (step rows/s, requests/s), request latency p50/p99 (generator's view, same machine),
rejections by status, end-to-end delay from each step's end to the acknowledgement of the request that committed
it (p50/p99/max), the pace the collector asked (Goodput-Send-Interval values), collector RSS over time (all its
processes, /proc: start, end, max, slope), CPU seconds per request and per step row of the collector processes
(in all and by process: workers, analyst, supervisor) and of the database's backends, the generator's CPU,
database bytes per step, hang detection, and the check: every (rank, step) made is in `steps` exactly once and each
run's ledger counts every step. Results go to
benchmarks/results/ as markdown (and `--json`).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import multiprocessing
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text

from benchmarks._common import REPO, free_port, machine, postgres_database
from benchmarks._fleet import ShardConfig, ShardResult, drive_shard, run_id_of
from benchmarks._procs import CpuMeter, backends, tree
from services.storage.db import make_engine
from services.storage.step_columns import stored_step_keys

SAMPLE_EVERY_S = 5.0
CACHE_SAMPLE_EVERY = 6  # samples: the step-block cache gauge is scraped every 30 s


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def collector_role(pid: int, root: int) -> str:
    """What a process of `goodput serve`'s tree does: "supervisor" (the command itself, which starts and watches the
    others), "analyst" (`goodput analyst`: the background analyses and retention) or "workers" (the HTTP workers,
    which ingest; their helpers too, such as multiprocessing's resource tracker)."""
    if pid == root:
        return "supervisor"
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "workers"
    return "analyst" if b"analyst" in argv else "workers"


@dataclass
class Samples:
    rss: list[tuple[float, float]] = field(default_factory=list)  # (s since start, MiB), collector processes
    rss_by_pid: list[dict[int, float]] = field(default_factory=list)  # MiB of each collector process, per sample
    collector_cpu: CpuMeter = field(default_factory=CpuMeter)
    database_cpu: CpuMeter = field(default_factory=CpuMeter)
    loadavg: list[tuple[float, float]] = field(default_factory=list)
    # (s since start, MiB of decoded step blocks the workers keep, RSS of the collector processes at that moment)
    analysis_cache: list[tuple[float, float, float]] = field(default_factory=list)
    # (s since start, {reason: requests refused for load so far}): goodput_collector_overloaded_requests_total
    overloaded: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    # goodput_collector_analysis_cpu_seconds_total when the collector's CPU was last sampled: its analyses' share
    analysis_cpu_s: float | None = None
    collector_roles: dict[int, str] = field(default_factory=dict)  # pid -> collector_role

    def sample_collector(self, root: int, pids: list[int]) -> None:
        """Sample the CPU of `goodput serve`'s tree (`pids`, from `tree(root)`), each process's role noted once."""
        for pid in pids:
            if pid not in self.collector_roles:
                self.collector_roles[pid] = collector_role(pid, root)
        self.collector_cpu.sample(pids)


_CACHE_GAUGE = re.compile(r"^goodput_collector_analysis_cache_bytes ([0-9.e+]+)$", re.M)
_ANALYSIS_CPU = re.compile(r"^goodput_collector_analysis_cpu_seconds_total ([0-9.e+]+)$", re.M)
_OVERLOADED = re.compile(r'^goodput_collector_overloaded_requests_total\{reason="(\w+)"\} ([0-9.e+]+)$', re.M)


def _sampler(root: int, database: str, url: str, began: float, samples: Samples, stop: threading.Event) -> None:
    n = 0
    while True:
        pids = tree(root)
        by_pid = {p: _rss_kib(p) / 1024 for p in pids}
        samples.rss.append((time.time() - began, sum(by_pid.values())))
        samples.rss_by_pid.append(by_pid)
        samples.sample_collector(root, pids)
        samples.database_cpu.sample(backends(database))
        samples.loadavg.append((time.time() - began, os.getloadavg()[0]))
        if n % CACHE_SAMPLE_EVERY == 0:  # a scrape sums every worker's gauge
            with contextlib.suppress(httpx.HTTPError):
                scraped = httpx.get(f"{url}/metrics", timeout=10).text
                found = _CACHE_GAUGE.search(scraped)
                if found:
                    samples.analysis_cache.append((time.time() - began, float(found.group(1)) / 2**20,
                                                   samples.rss[-1][1]))
                samples.overloaded.append((time.time() - began, {
                    reason: int(float(count)) for reason, count in _OVERLOADED.findall(scraped)}))
        n += 1
        if stop.wait(SAMPLE_EVERY_S):
            return


@dataclass
class HangWatch:
    run_id: str
    rank: int
    hang_at: float  # wall clock
    polls: int = 0
    poll_latency_s: list[float] = field(default_factory=list)
    flagged_at: float | None = None
    answer: dict[str, Any] = field(default_factory=dict)
    fleet_answer: dict[str, Any] = field(default_factory=dict)
    fleet_latency_s: float | None = None
    errors: int = 0


def _watch_hang(url: str, watch: HangWatch, until: float, stop: threading.Event) -> None:
    with httpx.Client(timeout=30) as client:
        while time.time() < watch.hang_at - 2 and not stop.wait(0.5):
            pass
        while time.time() < until and not stop.is_set():
            asked = time.perf_counter()
            try:
                answer = client.get(f"{url}/v1/runs/{watch.run_id}/live").json()
            except (httpx.HTTPError, ValueError):
                watch.errors += 1
                stop.wait(1.0)
                continue
            watch.poll_latency_s.append(time.perf_counter() - asked)
            watch.polls += 1
            if answer.get("hung"):
                watch.flagged_at = time.time()
                watch.answer = {k: answer.get(k) for k in (
                    "hung", "threshold_seconds", "threshold_basis", "last_progress_time", "seconds_since_progress",
                    "hung_for_seconds", "last_step", "pending_step", "median_step_seconds", "suspect_ranks",
                    "suspects_total", "server_time")}
                watch.answer["first_suspects"] = answer.get("suspects", [])[:2]
                asked = time.perf_counter()
                try:
                    fleet = client.get(f"{url}/v1/live").json()
                except (httpx.HTTPError, ValueError) as exc:  # an overloaded collector: say so, keep the run's figure
                    watch.fleet_latency_s = time.perf_counter() - asked
                    watch.fleet_answer = {"error": f"{type(exc).__name__} after {watch.fleet_latency_s:.0f} s"}
                    return
                watch.fleet_latency_s = time.perf_counter() - asked
                watch.fleet_answer = {"runs": len(fleet.get("runs", [])), "hung": fleet.get("hung"),
                                      "hung_runs": [r["run_id"] for r in fleet.get("runs", []) if r.get("hung")]}
                return
            stop.wait(max(0.0, 1.0 - (time.perf_counter() - asked)))


def _first_suspects(hang: dict[str, Any]) -> str:
    return "; ".join(f"rank {s['rank']} ({', '.join(s['reasons'])})" for s in hang.get("first_suspects") or []) or "-"


def _fleet_live(hang: dict[str, Any]) -> str:
    """What `/v1/live` said when the run was flagged (or that it did not answer)."""
    fleet = hang.get("fleet") or {}
    if "hung" not in fleet:
        return f"no answer ({fleet.get('error', 'the watcher stopped')})"
    return (f"{fleet['hung']} of {fleet['runs']} runs hung ({fleet['hung_runs'][:3]}), "
            f"{hang.get('fleet_live_ms')} ms")


def _start_collector(db_url: str, workers: int, extra_env: dict[str, str], log: str | None = None
                     ) -> tuple[subprocess.Popen[bytes], str, int]:
    port = free_port()
    env = {**os.environ, **extra_env, "GOODPUT_DATABASE_URL": db_url, "PYTHONPATH": str(REPO)}
    with open(log or os.devnull, "wb") as out:  # the child keeps its own descriptor
        proc = subprocess.Popen([sys.executable, "-m", "services.cli", "serve", "--host", "127.0.0.1", "--port",
                                 str(port), "--workers", str(workers), "--no-dashboard"], env=env,
                                stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return proc, url, port
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    proc.terminate()
    raise SystemExit("the collector did not start")


def _database_bytes(db_url: str) -> int:
    engine = make_engine(db_url)
    with engine.connect() as conn:
        size = int(conn.execute(text("SELECT pg_database_size(current_database())")).scalar_one())
    engine.dispose()
    return size


_SERVER_SETTINGS = ("autovacuum", "fsync", "synchronous_commit", "shared_buffers")


def _server_settings(db_url: str) -> str:
    """The database server's version and the settings that move its cost per row most (autovacuum off leaves the
    rows that moved into block rows as dead tuples, and the tables and indexes grow and slow for the whole run)."""
    engine = make_engine(db_url)
    with engine.connect() as conn:
        version = conn.execute(text("SHOW server_version")).scalar_one().split()[0]
        settings = [f"{name} {conn.execute(text(f'SHOW {name}')).scalar_one()}" for name in _SERVER_SETTINGS]
    engine.dispose()
    return f"PostgreSQL {version} ({', '.join(settings)})"


def _verify(db_url: str, made: dict[int, int], ranks_per_run: int, empty_bytes: int) -> dict[str, Any]:
    """Every (run, rank, step) made stored exactly once; database bytes beyond `empty_bytes` (after migrations)."""
    engine = make_engine(db_url)
    with engine.connect() as conn:
        run_ids = {int(pk): str(run_id) for pk, run_id in conn.execute(text("SELECT id, run_id FROM runs"))}
        keys = stored_step_keys(conn)  # in `steps` and in block rows
        sizes = {
            name: int(conn.execute(text(
                "SELECT pg_total_relation_size(CAST(:t AS regclass)) + coalesce((SELECT sum(pg_total_relation_size("
                "inhrelid)) FROM pg_inherits WHERE inhparent = CAST(:t AS regclass)), 0)"), {"t": name}).scalar_one())
            for name in ("steps", "step_columns", "events")}
        database_bytes = int(conn.execute(text("SELECT pg_database_size(current_database())")).scalar_one())
    engine.dispose()
    per_rank = keys.groupby(["run_pk", "rank"])["step"].agg(["count", "nunique", "min", "max"])
    stored = {(str(run_ids[pk]), int(rank)): (int(v[0]), int(v[1]), int(v[2]), int(v[3]))
              for (pk, rank), v in zip(per_rank.index, per_rank.to_numpy(), strict=True)}
    wrong = []
    for g, n in made.items():
        run, rank = divmod(g, ranks_per_run)
        got = stored.get((run_id_of(run), rank))
        if (n and got != (n, n, 1, n)) or (not n and got is not None):
            wrong.append((run_id_of(run), rank, n, got))
    return {"steps_made": sum(made.values()), "rows_stored": sum(v[0] for v in stored.values()),
            "ranks_wrong": wrong[:20], "ranks_wrong_total": len(wrong),
            "steps_table_bytes": sizes["steps"] + sizes["step_columns"],
            "events_table_bytes": sizes["events"], "database_bytes": database_bytes - empty_bytes}


def _ledger_check(url: str, made: dict[int, int], ranks_per_run: int) -> dict[str, Any]:
    """Each run's ledger counts every step: its `steps.computed` = the furthest rank's steps."""
    expected: dict[str, int] = {}
    for g, n in made.items():
        run_id = run_id_of(g // ranks_per_run)
        expected[run_id] = max(expected.get(run_id, 0), n)
    wrong = {}
    took = []
    with httpx.Client(timeout=600) as client:
        for run_id, n in sorted(expected.items()):
            asked = time.perf_counter()
            ledger = client.get(f"{url}/v1/runs/{run_id}/waste").json()
            took.append(time.perf_counter() - asked)
            computed = (ledger.get("steps") or {}).get("computed")
            if computed != n:
                wrong[run_id] = (n, computed)
    return {"runs": len(expected), "runs_wrong": wrong, "ledger_s_median": round(statistics.median(took), 2),
            "ledger_s_max": round(max(took), 2)}


def _slope_mib_per_min(points: list[tuple[float, float]]) -> float | None:
    if len(points) < 3:
        return None
    xs = [t / 60 for t, _ in points]
    ys = [m for _, m in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(1000 * seconds, 1)


def _stop(proc: subprocess.Popen[bytes]) -> float | None:
    """Seconds `goodput serve` took to exit after SIGTERM; None when it had not after 60 s (then SIGKILLed)."""
    started = time.monotonic()
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)
        return None
    return round(time.monotonic() - started, 2)


def _default_hang_at(duration_s: float, ramp_s: float) -> float:
    return max(ramp_s + 20.0, min(duration_s / 2, duration_s - 60.0))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=10240)
    p.add_argument("--duration", type=float, default=600.0, help="seconds of stepping (default 600)")
    p.add_argument("--workers", type=int, default=2, help="collector processes (goodput serve --workers)")
    p.add_argument("--generators", type=int, default=1, help="load generator processes")
    p.add_argument("--connections", type=int, default=256, help="keep-alive connections per generator process")
    p.add_argument("--ranks-per-run", type=int, default=256, help="ranks of one simulated job (default 256)")
    p.add_argument("--ranks-per-sender", type=int, default=8, help="8 (default): one node relay per 8 ranks posts "
                   "for them, as under goodput launch; 1: every rank posts itself (goodput launch --no-node-relay)")
    p.add_argument("--ramp", type=float, default=10.0, help="jobs start uniformly over this many seconds")
    p.add_argument("--hang-at", type=float, help="seconds after the start at which one rank hangs "
                   "(default: half the duration, at least 60 s before the end)")
    p.add_argument("--hang-rank", type=int, default=3, help="the rank of the middle run that hangs (default 3)")
    p.add_argument("--no-hang", action="store_true", help="no rank hangs")
    p.add_argument("--no-coalesce", action="store_true", help="send every step record as built, as clients before "
                   "ingest_client.worker.coalesce did (one record a step at a step a second): the baseline")
    p.add_argument("--drain", type=float, default=120.0, help="seconds after the stop allowed for resends")
    p.add_argument("--out", help="markdown report (default benchmarks/results/fleet-load-<ranks>_2core-vm_<yyyymm>.md)")
    p.add_argument("--json", help="also write the results as JSON to this file")
    p.add_argument("--collector-env", action="append", default=[], metavar="NAME=VALUE",
                   help="a setting for the collector, e.g. GOODPUT_MAX_SEND_INTERVAL_S=4 (repeatable)")
    p.add_argument("--collector-log", metavar="PATH", help="write the collector's log there (default: discarded)")
    p.add_argument("--render", metavar="JSON", help="only write the markdown report of an earlier run's --json file")
    p.add_argument("--project-gpus", type=int, default=100_000, help="fleet size for the printed projection")
    ns = p.parse_args(argv)
    if ns.render:
        report = _markdown(json.loads(Path(ns.render).read_text()))
        print(report)
        if ns.out:
            Path(ns.out).write_text(report)
        return 0
    if not 1 <= ns.ranks <= 1_000_000 or not 10 <= ns.duration <= 24 * 3600:
        p.error("--ranks must be 1-1000000 and --duration 10-86400 seconds")
    if not 1 <= ns.generators <= 64 or not 1 <= ns.ranks_per_run <= 65536 or ns.connections < 1:
        p.error("--generators must be 1-64, --ranks-per-run 1-65536, --connections >= 1")
    if ns.ranks_per_sender < 1 or ns.ranks_per_run % ns.ranks_per_sender:
        p.error(f"--ranks-per-sender must divide --ranks-per-run ({ns.ranks_per_run}), got {ns.ranks_per_sender}")
    collector_env = dict(item.split("=", 1) for item in ns.collector_env if "=" in item)
    if len(collector_env) != len(ns.collector_env) or not all(k.startswith("GOODPUT_") for k in collector_env):
        p.error(f"--collector-env takes GOODPUT_NAME=VALUE, got {ns.collector_env}")
    hang_at_s = ns.hang_at if ns.hang_at is not None else _default_hang_at(ns.duration, ns.ramp)
    runs = -(-ns.ranks // ns.ranks_per_run)
    hang_run = None if ns.no_hang else runs // 2
    hang_world = min(ns.ranks_per_run, ns.ranks - (hang_run or 0) * ns.ranks_per_run)
    hang_rank = min(max(ns.hang_rank, 0), hang_world - 1)
    load_before = os.getloadavg()

    with postgres_database() as db_url:
        database = db_url.rsplit("/", 1)[1]
        proc, url, port = _start_collector(db_url, ns.workers, collector_env, ns.collector_log)
        empty_bytes = _database_bytes(db_url)
        server = _server_settings(db_url)
        samples = Samples()
        stop_sampling = threading.Event()
        try:
            t0 = time.time() + 1.0
            stop = t0 + ns.duration
            give_up = stop + ns.drain
            sampler = threading.Thread(target=_sampler, args=(proc.pid, database, url, t0, samples, stop_sampling),
                                       daemon=True)
            sampler.start()
            watch = None
            watcher = None
            if hang_run is not None:
                watch = HangWatch(run_id_of(hang_run), hang_rank, t0 + hang_at_s)
                watcher = threading.Thread(target=_watch_hang, args=(url, watch, give_up, stop_sampling), daemon=True)
                watcher.start()
            senders = -(-ns.ranks // ns.ranks_per_sender)
            shards = [ShardConfig(host="127.0.0.1", port=port, senders=range(i, senders, ns.generators),
                                  ranks_per_sender=ns.ranks_per_sender, ranks_per_run=ns.ranks_per_run,
                                  total_ranks=ns.ranks, t0=t0, ramp_s=ns.ramp,
                                  stop=stop, give_up=give_up, hang_run=hang_run, hang_rank=hang_rank,
                                  hang_at=t0 + hang_at_s, connections=ns.connections, seed=1000 + i,
                                  coalesce=not ns.no_coalesce)
                      for i in range(ns.generators)]
            print(f"driving {ns.ranks} ranks ({runs} runs of up to {ns.ranks_per_run}) for {ns.duration:.0f} s "
                  f"against {url} ({ns.workers} worker(s), {ns.generators} generator process(es), "
                  f"{ns.connections} connections each); load average {load_before[0]:.2f} ...", flush=True)
            with concurrent.futures.ProcessPoolExecutor(ns.generators,
                                                        mp_context=multiprocessing.get_context("fork")) as pool:
                results = list(pool.map(drive_shard, shards))
            ended = time.time()
            samples.sample_collector(proc.pid, tree(proc.pid))
            with contextlib.suppress(httpx.HTTPError):
                found = _ANALYSIS_CPU.search(httpx.get(f"{url}/metrics", timeout=30).text)
                samples.analysis_cpu_s = float(found.group(1)) if found else None
            samples.database_cpu.sample(backends(database))
            stop_sampling.set()
            sampler.join(10)
            if watcher is not None:
                watcher.join(5)
            fleet = results[0]
            for other in results[1:]:
                fleet.merge(other)
            ledger = _ledger_check(url, fleet.steps_made, ns.ranks_per_run)
            check = _verify(db_url, fleet.steps_made, ns.ranks_per_run, empty_bytes)
        finally:
            stop_sampling.set()
            shutdown_s = _stop(proc)
    load_after = os.getloadavg()
    result = _result(ns, fleet, samples, watch, check, ledger, t0, stop, ended, load_before[0], load_after[0], server,
                     hang_at_s, runs)
    ok = (not check["ranks_wrong_total"] and check["rows_stored"] == check["steps_made"] and not ledger["runs_wrong"]
          and not fleet.unacked_records)
    result["exactly_once"] = ok
    result["collector_shutdown_s"] = shutdown_s
    if ns.json:  # first: a report that fails to render leaves the figures (render again with --render)
        Path(ns.json).write_text(json.dumps(result, indent=2, default=str))
    text_report = _markdown(result)
    print(text_report)
    out = Path(ns.out) if ns.out else REPO / "benchmarks" / "results" / (
        f"fleet-load-{ns.ranks}_2core-vm_{time.strftime('%Y%m')}.md")
    out.write_text(text_report)
    print(f"written to {out}")
    return 0 if ok else 1


def _result(ns: argparse.Namespace, fleet: ShardResult, samples: Samples, watch: HangWatch | None,
            check: dict[str, Any], ledger: dict[str, Any], t0: float, stop: float, ended: float,
            load_before: float, load_after: float, server: str, hang_at_s: float, runs: int) -> dict[str, Any]:
    wall_s = ended - t0
    requests = sum(fleet.statuses.values())
    rss = samples.rss
    steady = [(t, m) for t, m in rss if ns.ramp + 30 <= t <= stop - t0]
    collector_cpu = samples.collector_cpu.seconds
    database_cpu = samples.database_cpu.seconds
    by_role = samples.collector_cpu.seconds_by(samples.collector_roles)
    paces = sorted(fleet.paces.items(), key=lambda kv: float(kv[0] or 0))
    hang: dict[str, Any] | None = None
    if watch is not None:
        a = watch.answer
        progress = a.get("last_progress_time")
        hang = {"run_id": watch.run_id, "rank": watch.rank, "hang_at_s": hang_at_s, "flagged": bool(a),
                "polls": watch.polls, "poll_errors": watch.errors,
                "poll_p50_ms": _ms(statistics.median(watch.poll_latency_s)) if watch.poll_latency_s else None,
                "poll_max_ms": _ms(max(watch.poll_latency_s)) if watch.poll_latency_s else None, **a}
        if a and watch.flagged_at is not None:
            hang["flagged_after_hang_s"] = round(watch.flagged_at - watch.hang_at, 1)
            if progress is not None:
                hang["flagged_after_progress_s"] = round(watch.flagged_at - progress, 1)
                hang["late_vs_threshold_s"] = round(watch.flagged_at - progress - a["threshold_seconds"], 2)
            hang["suspect_is_stuck_rank"] = a.get("suspect_ranks") == [watch.rank]
            hang["stuck_rank_listed_first"] = (a.get("suspect_ranks") or [None])[0] == watch.rank
            hang["fleet"] = watch.fleet_answer
            hang["fleet_live_ms"] = _ms(watch.fleet_latency_s)
    return {
        "machine": machine(), "database_server": server,
        "commit": _commit(), "command": "python -m benchmarks.load " + " ".join(sys.argv[1:]),
        "ranks": ns.ranks, "runs": runs, "ranks_per_run": ns.ranks_per_run, "ranks_per_sender": ns.ranks_per_sender,
        "duration_s": ns.duration,
        "wall_s": round(wall_s, 1), "workers": ns.workers, "generators": ns.generators,
        "connections": ns.connections, "load_average_before": round(load_before, 2),
        "load_average_after": round(load_after, 2),
        "load_average_max": round(max((v for _, v in samples.loadavg), default=0.0), 2),
        "requests": requests, "requests_ok": fleet.requests_ok, "requests_per_s": round(requests / wall_s, 1),
        "step_rows_acked": fleet.steps_acked, "step_rows_per_s": round(fleet.steps_acked / wall_s, 1),
        "heartbeats_acked": fleet.heartbeats_acked, "records_per_ok_request": round(
            fleet.records_acked / max(1, fleet.requests_ok), 2),
        "coalesced": not ns.no_coalesce,  # records as sent: a rank's consecutive step records merged
        "sent_records_per_ok_request": round((fleet.accepted + fleet.duplicates) / max(1, fleet.requests_ok), 2),
        "body_bytes_per_request": round(fleet.body_bytes / max(1, requests)),
        "accepted": fleet.accepted, "duplicates": fleet.duplicates,
        "requests_by_10s": [fleet.requests_by_10s.get(i, 0) for i in range(int(wall_s // 10) + 1)],
        "latency_p50_ms": _ms(fleet.request_latency_s.quantile(0.5)),
        "latency_p99_ms": _ms(fleet.request_latency_s.quantile(0.99)),
        "latency_max_ms": _ms(fleet.request_latency_s.max),
        "statuses": dict(fleet.statuses), "transport_errors": dict(fleet.errors),
        "overloaded_by_reason": samples.overloaded[-1][1] if samples.overloaded else {},
        "overloaded_by_reason_over_time": [(round(t), counts) for t, counts in samples.overloaded],
        "resent_then_acknowledged": fleet.resent_then_ok, "connections_opened": fleet.connections_opened,
        "unacked_records_at_give_up": fleet.unacked_records,
        "delay_p50_s": _round(fleet.step_delay_s.quantile(0.5), 2),
        "delay_p99_s": _round(fleet.step_delay_s.quantile(0.99), 2),
        "delay_max_s": round(fleet.step_delay_s.max, 2),
        "pace_s": {k or "(none)": v for k, v in paces},
        "rss_mib": [(round(t), round(m, 1)) for t, m in rss],
        "rss_start_mib": round(rss[0][1], 1) if rss else None, "rss_end_mib": round(rss[-1][1], 1) if rss else None,
        "rss_max_mib": round(max(m for _, m in rss), 1) if rss else None,
        "rss_slope_mib_per_min": _round(_slope_mib_per_min(steady), 3),
        # once every run is long (its closed blocks sketched, docs/ledger.md "Long runs"): the second half
        "rss_slope_second_half_mib_per_min": _round(_slope_mib_per_min(
            [(t, m) for t, m in steady if t >= (stop - t0) / 2]), 3),
        # what grows by design (the step-block cache, bounded by GOODPUT_ANALYSIS_CACHE_MB per worker) taken out
        "analysis_cache_mib": [(round(t), round(c, 1)) for t, c, _ in samples.analysis_cache],
        "rss_less_cache_mib": [(round(t), round(m - c, 1)) for t, c, m in samples.analysis_cache],
        "rss_less_cache_slope_mib_per_min": _round(_slope_mib_per_min(
            [(t, m - c) for t, c, m in samples.analysis_cache if ns.ramp + 30 <= t <= stop - t0]), 3),
        "rss_by_process_mib": {str(pid): (round(samples.rss_by_pid[0].get(pid, 0.0), 1), round(mib, 1))
                               for pid, mib in samples.rss_by_pid[-1].items()} if samples.rss_by_pid else {},
        "collector_env": dict(item.split("=", 1) for item in ns.collector_env),
        "collector_cpu_s": round(collector_cpu, 1), "database_cpu_s": round(database_cpu, 1),
        "generator_cpu_s": round(fleet.cpu_s, 1),
        "collector_cpu_us_per_request": round(1e6 * collector_cpu / max(1, requests)),
        "collector_cpu_us_per_step": round(1e6 * collector_cpu / max(1, fleet.steps_acked), 1),
        # apart: the analyses' builds (the background analyst keeps the runs' views fresh within a share of its
        # interval, whatever the ingest rate) and what is left, ingestion
        "analysis_cpu_s": _round(samples.analysis_cpu_s, 1),
        "ingest_cpu_us_per_step": None if samples.analysis_cpu_s is None else round(
            1e6 * (collector_cpu - samples.analysis_cpu_s) / max(1, fleet.steps_acked), 1),
        # by process: the workers ingest (and answer the pages and polls); the analyst builds and retention runs
        "collector_cpu_by_role_s": {role: round(seconds, 1) for role, seconds in sorted(by_role.items())},
        "workers_cpu_us_per_step": round(1e6 * by_role.get("workers", 0.0) / max(1, fleet.steps_acked), 1),
        "database_cpu_us_per_step": round(1e6 * database_cpu / max(1, fleet.steps_acked), 1),
        "generator_cpu_us_per_request": round(1e6 * fleet.cpu_s / max(1, requests)),
        "hang": hang, "ledger": ledger, **check,
        "database_bytes_per_step": round(check["database_bytes"] / max(1, check["rows_stored"])),
        "steps_and_events_bytes_per_step": round(
            (check["steps_table_bytes"] + check["events_table_bytes"]) / max(1, check["rows_stored"])),
        "project_gpus": ns.project_gpus,
    }


def _pace_summary(answers: dict[str, int]) -> str:
    """Quantiles of the Goodput-Send-Interval values answered, and how many fell in each 1 s bin."""
    values = sorted((float(k), n) for k, n in answers.items() if k != "(none)")
    total = sum(n for _, n in values)
    if not total:
        return "none"

    def quantile(q: float) -> float:
        seen = 0
        for value, n in values:
            seen += n
            if seen >= q * total:
                return value
        return values[-1][0]

    bins: dict[int, int] = {}
    for value, n in values:
        bins[int(value)] = bins.get(int(value), 0) + n
    spread = ", ".join(f"[{b}, {b + 1}) s: {n:,}" for b, n in sorted(bins.items()))
    return (f"p10 {quantile(0.1):.2f} s, p50 {quantile(0.5):.2f} s, p90 {quantile(0.9):.2f} s, max {values[-1][0]:.2f}"
            f" s over {total:,} answers ({spread})")


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _commit() -> str:
    out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         check=False)
    return out.stdout.strip() or "?"


def _markdown(r: dict[str, Any]) -> str:
    hang = r["hang"]
    if hang is None:
        hang_line = "not simulated (--no-hang)"
    elif not hang["flagged"]:
        hang_line = (f"rank {hang['rank']} of {hang['run_id']} stopped at {hang['hang_at_s']:.0f} s: **not flagged** "
                     f"before the end ({hang['polls']} polls)")
    else:
        hang_line = (
            f"rank {hang['rank']} of {hang['run_id']} stopped at {hang['hang_at_s']:.0f} s (the run's other ranks "
            f"wait in the step's collective, all heart-beat): flagged {hang.get('flagged_after_progress_s')} s after "
            f"the run's last progress, threshold {hang['threshold_seconds']} s ({hang['threshold_basis']}), i.e. "
            f"{hang.get('late_vs_threshold_s')} s after the threshold (polled every 1 s); suspects "
            f"{hang['suspect_ranks']} of {hang.get('suspects_total')} (the stuck rank alone: "
            f"{hang.get('suspect_is_stuck_rank')}; listed first: {hang.get('stuck_rank_listed_first')}); "
            f"first listed: {_first_suspects(hang)}; `/v1/live` then: "
            f"{_fleet_live(hang)}; `/v1/runs/{{id}}/live` p50 {hang['poll_p50_ms']} ms, "
            f"max {hang['poll_max_ms']} ms")
    rss = r["rss_mib"]
    rss_line = ", ".join(f"{t}s {m}" for t, m in rss[:: max(1, len(rss) // 12)])
    paces = _pace_summary(r["pace_s"])
    gpus = r["project_gpus"]
    per_sender = r.get("ranks_per_sender", 1)
    # the pace's 5 s cap: with this many senders every collector process asks for it
    req_s = gpus / per_sender / 5.0
    per_req = r["collector_cpu_us_per_request"] * 1e-6
    rows = [
        ("fleet", f"{r['ranks']:,} ranks in {r['runs']} runs of up to {r['ranks_per_run']}, one step a second each, "
                  f"heartbeats after 5 s without a step, for {r['duration_s']:.0f} s "
                  f"(wall {r['wall_s']} s with the drain); "
                  + ("every rank posts its own records" if per_sender == 1 else
                     f"one node relay per {per_sender} ranks posts theirs")),
        ("throughput", f"{r['step_rows_acked']:,} step rows ({r['step_rows_per_s']:,}/s), {r['heartbeats_acked']:,} "
                       f"heartbeats; {r['requests']:,} requests ({r['requests_per_s']}/s), "
                       f"{r['records_per_ok_request']} records and {r['body_bytes_per_request']} body bytes each"
                       + (f", sent as {r['sent_records_per_ok_request']} (a rank's consecutive step records merged)"
                          if r.get("coalesced") else ", each step record sent as built (--no-coalesce)")),
        ("requests per 10 s", str(r["requests_by_10s"])),
        ("request latency (generator's view)",
         f"p50 {r['latency_p50_ms']} ms, p99 {r['latency_p99_ms']} ms, max {r['latency_max_ms']} ms"),
        ("statuses", f"{r['statuses']}; 503s by reason {r.get('overloaded_by_reason', {})} (the collector's count, "
                     f"as of its last scrape); transport errors {r['transport_errors']}; "
                     f"{r['resent_then_acknowledged']} resends then acknowledged; {r['duplicates']} duplicate "
                     "records absorbed"),
        ("step end -> committed (acknowledged)",
         f"**p50 {r['delay_p50_s']} s, p99 {r['delay_p99_s']} s, max {r['delay_max_s']} s** (10 ms bins)"),
        ("pace asked (Goodput-Send-Interval: answers)", paces),
        ("collector RSS (all processes, MiB)",
         f"start {r['rss_start_mib']}, end {r['rss_end_mib']}, max {r['rss_max_mib']}; slope "
         f"{r['rss_slope_mib_per_min']} MiB/min (steady part), "
         f"{r.get('rss_slope_second_half_mib_per_min')} MiB/min (its second half); by process (start, end): "
         f"{list(r['rss_by_process_mib'].values())}; samples: {rss_line}"),
        ("RSS less the step-block cache (MiB)",
         f"slope **{r.get('rss_less_cache_slope_mib_per_min')} MiB/min** (steady part); the cache "
         f"(`goodput_collector_analysis_cache_bytes`, all workers): "
         f"{', '.join(f'{t}s {c}' for t, c in r.get('analysis_cache_mib', []))}; RSS less it: "
         f"{', '.join(f'{t}s {m}' for t, m in r.get('rss_less_cache_mib', []))}"),
        ("CPU", f"collector {r['collector_cpu_s']} s = **{r['collector_cpu_us_per_request']} us per request**, "
                f"{r['collector_cpu_us_per_step']} us per step row"
                + ("" if r.get("ingest_cpu_us_per_step") is None else
                   f" (of which building analyses {r['analysis_cpu_s']} s; ingestion **{r['ingest_cpu_us_per_step']} us"
                   " per step row**)")
                + ("" if not r.get("collector_cpu_by_role_s") else
                   "; by process: " + ", ".join(f"{role} {seconds} s" for role, seconds in
                                                r["collector_cpu_by_role_s"].items())
                   + f" (the workers {r['workers_cpu_us_per_step']} us per step row)")
                + f"; PostgreSQL backends {r['database_cpu_s']} s = "
                f"{r['database_cpu_us_per_step']} us per step row; load generator {r['generator_cpu_s']} s "
                f"({r['generator_cpu_us_per_request']} us per request)"),
        ("database", f"{r['database_bytes']:,} bytes beyond the empty schema, {r['database_bytes_per_step']} per "
                     f"step row (steps + events tables: {r['steps_and_events_bytes_per_step']})"),
        ("live hang detection", hang_line),
        ("exactly once", f"{r['steps_made']:,} steps made, {r['rows_stored']:,} rows stored (`steps` and block "
                         "rows), ranks wrong: "
                         f"{r['ranks_wrong_total']}; every run's ledger counts every step: "
                         f"{not r['ledger']['runs_wrong']} ({r['ledger']['runs']} runs, ledger p50 "
                         f"{r['ledger']['ledger_s_median']} s); unacknowledged at give-up: "
                         f"{r['unacked_records_at_give_up']} -> "
                         f"**{'nothing lost or duplicated' if r['exactly_once'] else 'MISMATCH'}**"),
        ("shutdown", "SIGTERM -> exit: " + ("**not within 60 s** (SIGKILLed)" if r.get("collector_shutdown_s") is None
                                             else f"{r['collector_shutdown_s']} s")),
    ]
    table = "| | measured |\n|---|---|\n" + "\n".join(f"| {label} | {value} |" for label, value in rows)
    return f"""# Fleet load: {r['ranks']:,} simulated ranks into `goodput serve` ({r['workers']} workers, PostgreSQL)

Command: `{r['command']}` (collector settings: {r['collector_env'] or 'defaults'}).
Commit {r['commit']}; {r['machine']}. One throwaway database on {r.get('database_server', 'PostgreSQL')}; the load
generator ({r['generators']} process(es), hand-written HTTP/1.1 keep-alive over asyncio, {r['connections']}
connections each) on the same machine; loopback only. Load average {r['load_average_before']} before,
{r['load_average_max']} max while running, {r['load_average_after']} after.

{table}

Projection for {gpus:,} GPUs at one step a second each, {'each rank its own sender' if per_sender == 1 else
f'one sender per {per_sender} ranks'} (every collector process then asks the 5 s cap of every sender):
{req_s:,.0f} requests/s, {gpus:,} step rows/s; at the measured {r['collector_cpu_us_per_request']} us of collector
CPU per request (of this run's shape, {r['records_per_ok_request']} records each): {req_s * per_req:,.1f} cores of
collector processes; PostgreSQL backends at {r['database_cpu_us_per_step']} us per row:
{gpus * r['database_cpu_us_per_step'] * 1e-6:,.1f} cores; storage at {r['database_bytes_per_step']} B per step:
{gpus * r['database_bytes_per_step'] * 86400 / 1e12:,.2f} TB a day.
"""


if __name__ == "__main__":
    raise SystemExit(main())
