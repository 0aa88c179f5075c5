"""What `goodput launch`'s node relay costs and saves: one node's ranks sending straight to the collector
(the baseline) against the same ranks sending through the relay, in one run.

    python -m benchmarks.node_relay [--ranks 8] [--steps 300] [--period 0.02] [--rounds 2] [--paces 0,3]

Each rank is a real client process (tests/faults/worker.py: a step every PERIOD seconds, then a flush until
everything is acknowledged); the relay is a real `NodeRelay` in a process of its own, as in `goodput launch`; the
collector is the in-process fake of the client tests (it counts requests and records, and answers at once,
asking each sender for the pace given: 0 is a small fleet's, 3 s about what a collector process asks of 1,280
senders at its default 400 requests/s).
Every process reports its own CPU time (user + system, all threads) and how many fsync(2) calls it made; the
variants alternate round by round so that a busy machine hits both alike. Printed per variant: collector
requests per 100 rank-steps, node CPU per rank-step (ranks, relay and both together), fsyncs and bytes written to
disk on the node per rank-step, each with its ratio to sending directly.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from benchmarks._common import REPO, machine

if TYPE_CHECKING:
    from http.server import BaseHTTPRequestHandler

    from _typeshed import HasFileno

    from tests.ingest_client.fake_collector import FakeCollector

WORKER = REPO / "tests" / "faults" / "worker.py"


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _own_usage(cpu_at_start_s: float, fsyncs: int, extra: dict[str, object]) -> str:
    """This process's CPU seconds (all threads) since ``cpu_at_start_s`` (its imports are not the client's work),
    fsync calls and bytes it sent to the disk (/proc/self/io)."""
    io = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return json.dumps({"cpu_s": _cpu_s() - cpu_at_start_s, "fsyncs": fsyncs, "disk_bytes": int(io["write_bytes"]),
                       **extra})


def _count_fsyncs() -> list[int]:
    """Wrap os.fsync in this process so that every call through it is counted (the spool calls os.fsync)."""
    calls = [0]
    real = os.fsync

    def counted(fd: int | HasFileno) -> None:
        calls[0] += 1
        real(fd)

    os.fsync = counted
    return calls


def run_rank(argv: list[str]) -> int:
    """One rank: the fault tests' worker, with its CPU and fsyncs reported on stderr as the last line."""
    calls = _count_fsyncs()
    sys.argv = [str(WORKER), *argv]
    sys.path.insert(0, str(REPO))
    from tests.faults.worker import main

    start = _cpu_s()
    code = main()
    sys.stderr.write("\n" + _own_usage(start, calls[0], {}) + "\n")
    return code


def run_relay(url: str, spool_dir: str, run_id: str) -> int:
    """A node relay until stdin closes; then it sends what it holds and reports on stdout."""
    calls = _count_fsyncs()
    from ingest_client.common.config import ClientConfig
    from ingest_client.launcher.relay import NodeRelay

    start = _cpu_s()
    config = ClientConfig.from_env({"GOODPUT_URL": url, "GOODPUT_SPOOL_DIR": spool_dir}, install_handlers=False)
    relay = NodeRelay(config, run_id).start()
    print(relay.url, flush=True)
    sys.stdin.read()
    acknowledged = relay.close(60.0)
    print(_own_usage(start, calls[0], {"acknowledged": acknowledged, "received": relay.received_events}),
          flush=True)
    return 0


@dataclass
class Figures:
    requests: list[float] = field(default_factory=list)  # collector requests per 100 rank-steps
    rank_cpu_us: list[float] = field(default_factory=list)  # per rank-step
    relay_cpu_us: list[float] = field(default_factory=list)
    fsyncs: list[float] = field(default_factory=list)  # per rank-step, ranks and relay
    disk_bytes: list[float] = field(default_factory=list)  # per rank-step, ranks and relay

    @property
    def node_cpu_us(self) -> list[float]:
        return [a + b for a, b in zip(self.rank_cpu_us, self.relay_cpu_us, strict=True)]


def paced_collector(pace_s: float) -> FakeCollector:
    """The fake collector, whose acknowledgements ask for ``pace_s`` between two sends of a sender."""
    from tests.ingest_client.fake_collector import FakeCollector, Reply

    class Paced(FakeCollector):
        def _reply(self, h: BaseHTTPRequestHandler, reply: Reply) -> None:
            if reply.status == 200 and pace_s:
                reply = Reply(200, reply.body, {**reply.headers, "Goodput-Send-Interval": f"{pace_s:g}"})
            super()._reply(h, reply)

    return Paced()


def one_round(relayed: bool, pace_s: float, args: argparse.Namespace, root: Path, figures: Figures) -> None:
    collector = paced_collector(pace_s)
    run_id = f"bench-{'relay' if relayed else 'direct'}-{time.monotonic_ns()}"
    spool = root / run_id
    env = {**os.environ, "GOODPUT_URL": collector.url, "GOODPUT_SPOOL_DIR": str(spool), "GOODPUT_RUN_ID": run_id,
           "TORCHELASTIC_RESTART_COUNT": "0", "WORLD_SIZE": str(args.ranks), "PYTHONPATH": str(REPO)}
    relay = None
    if relayed:
        relay = subprocess.Popen([sys.executable, "-m", "benchmarks.node_relay", "--relay-process", collector.url,
                                  str(spool), run_id], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                 cwd=REPO, env=env)
        assert relay.stdout is not None and relay.stdin is not None
        env["GOODPUT_EVENTS_VIA"] = relay.stdout.readline().strip()
    ranks = [subprocess.Popen([sys.executable, "-m", "benchmarks.node_relay", "--rank-process", str(args.steps),
                               str(args.period), "60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=REPO, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)})
             for r in range(args.ranks)]
    rank_cpu = rank_fsyncs = rank_disk = 0.0
    for rank in ranks:
        out, err = rank.communicate(timeout=600)
        result = json.loads(out.strip().splitlines()[-1])
        if rank.returncode != 0 or not result["acknowledged"]:
            raise SystemExit(f"a rank did not get everything acknowledged: {out}\n{err[-2000:]}")
        usage = json.loads(err.strip().splitlines()[-1])
        rank_cpu += usage["cpu_s"]
        rank_fsyncs += usage["fsyncs"]
        rank_disk += usage["disk_bytes"]
    relay_cpu = relay_fsyncs = relay_disk = 0.0
    if relay is not None:
        assert relay.stdin is not None and relay.stdout is not None
        relay.stdin.close()
        usage = json.loads(relay.stdout.readline())
        relay.wait(120)
        if not usage["acknowledged"]:
            raise SystemExit(f"the relay did not get everything acknowledged: {usage}")
        relay_cpu, relay_fsyncs, relay_disk = usage["cpu_s"], usage["fsyncs"], usage["disk_bytes"]
    rank_steps = args.ranks * args.steps
    got = collector.step_numbers()
    collector.stop()
    if len(got) != rank_steps or collector.problems:
        raise SystemExit(f"the collector holds {len(got)} steps of {rank_steps} ({collector.problems[:3]})")
    figures.requests.append(100 * sum(1 for r in collector.requests if r["path"] == "/v1/events") / rank_steps)
    figures.rank_cpu_us.append(1e6 * rank_cpu / rank_steps)
    figures.relay_cpu_us.append(1e6 * relay_cpu / rank_steps)
    figures.fsyncs.append((rank_fsyncs + relay_fsyncs) / rank_steps)
    figures.disk_bytes.append((rank_disk + relay_disk) / rank_steps)


def _row(name: str, values: list[float], baseline: list[float], unit: str) -> str:
    value, base = statistics.median(values), statistics.median(baseline)
    ratio = f"{value / base:.2f}" if base else "-"
    return f"| {name} | {statistics.median(baseline):.3g} | {value:.3g} | {ratio} | {unit} |"


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--rank-process":
        return run_rank(sys.argv[2:])
    if len(sys.argv) > 1 and sys.argv[1] == "--relay-process":
        return run_relay(*sys.argv[2:5])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--period", type=float, default=0.02, help="seconds per step")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--paces", default="0,3",
                        help="the collector's Goodput-Send-Interval (seconds), comma-separated")
    parser.add_argument("--spool-root", type=Path, default=None, help="where the spools go (default: a temp dir)")
    args = parser.parse_args()
    print(f"# node relay: {args.ranks} ranks x {args.steps} steps of {args.period * 1000:.0f} ms, "
          f"{args.rounds} rounds (medians); {machine()}")
    for pace_s in (float(p) for p in args.paces.split(",")):
        direct, relayed = Figures(), Figures()
        with tempfile.TemporaryDirectory(dir=args.spool_root) as tmp:
            for i in range(args.rounds):
                for is_relayed in ((False, True) if i % 2 == 0 else (True, False)):
                    one_round(is_relayed, pace_s, args, Path(tmp), relayed if is_relayed else direct)
        _table(pace_s, direct, relayed)
    return 0


def _table(pace_s: float, direct: Figures, relayed: Figures) -> None:
    print(f"\n## the collector's pace: {pace_s:g} s\n")
    print("| per rank-step | direct (baseline) | through the relay | ratio | unit |")
    print("|---|---|---|---|---|")
    print(_row("collector requests", relayed.requests, direct.requests, "per 100 rank-steps"))
    print(_row("ranks' CPU", relayed.rank_cpu_us, direct.rank_cpu_us, "µs"))
    print(_row("relay's CPU", relayed.relay_cpu_us, direct.relay_cpu_us, "µs"))
    print(_row("node CPU (ranks + relay)", relayed.node_cpu_us, direct.node_cpu_us, "µs"))
    print(_row("fsyncs on the node", relayed.fsyncs, direct.fsyncs, "per rank-step"))
    print(_row("bytes written to disk on the node", relayed.disk_bytes, direct.disk_bytes, "bytes"))


if __name__ == "__main__":
    raise SystemExit(main())
