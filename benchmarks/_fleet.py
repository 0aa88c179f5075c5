"""A simulated fleet of training ranks that post to a collector the way ingest_client does (benchmarks/load.py).

Each rank is one coroutine standing for one rank's flusher thread. Rows are made lazily, from the clock: step k
of a rank ends at `base + k` (one step a second, steps of one run a few ms apart, as DDP keeps them); a
`heartbeat` carrying the step in progress comes once a rank has ended no step for 5 s, and every 5 s after that
(as ingest_client sends them: none while it steps). At a send round every row made since the last round becomes
a wire record exactly as ingest_client.common.events.RecordBuilder builds it at a 0.2 s flush interval (one `steps`
record per step, ids `<process id>-<seq>`), and ONE request carries every record not acknowledged yet, oldest
first, up to 500 (max_batch_events), gzip-compressed above 1 KiB, with `Goodput-Sender: <process id>`.

Pace and failures as in ingest_client.worker.flusher: a round at most every 0.2 s and only with rows to send; after a
200, none before `Goodput-Send-Interval` seconds since the round began; 429/503 wait Retry-After x U(1, 1.1);
a connection error or a request slower than 2 s (GOODPUT_HTTP_TIMEOUT_S) backs off U(c/2, c),
c = 0.5 s x 2^(failures-1) up to 30 s. Records are resent with their ids; the collector absorbs duplicates.

A hang: from `hang_at` on, no rank of the chosen run ends a step (the chosen rank is stuck, the others wait for
it in the step's collective, as NCCL does); every process stays alive and heart-beats, the others having
started 1 collective in the pending step, the stuck rank 0 (docs/ledger.md, "Live hang detection").
Simplification: the simulated client aggregates collective time into `comm` but sends no `collectives` records.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import math
import random
import time
from collections import Counter
from dataclasses import dataclass, field

from benchmarks._http1 import Pool, ProtocolError
from ingest_client.transport.base import encode_batch
from ingest_client.worker.coalesce import coalesce

FLUSH_INTERVAL_S = 0.2
HEARTBEAT_INTERVAL_S = 5.0
HTTP_TIMEOUT_S = 2.0
MAX_BATCH_EVENTS = 500
GZIP_MIN_BYTES = 1024
BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 30.0
RELAY_INTERVAL_S = 0.5
RELAY_MAX_BATCH_EVENTS = 5000
HEARTBEAT = -1.0  # a pending record that is not a step: its kind instead of a step end
OTHER = -2.0


class Histogram:
    """Fixed-width bins from 0 (the last bin takes everything beyond), exact count, sum and max; mergeable."""

    def __init__(self, width: float, bins: int) -> None:
        self.width = width
        self.counts = [0] * bins
        self.n = 0
        self.total = 0.0
        self.max = 0.0

    def add(self, value: float) -> None:
        i = int(value / self.width)
        self.counts[i if 0 <= i < len(self.counts) else (0 if i < 0 else -1)] += 1
        self.n += 1
        self.total += value
        if value > self.max:
            self.max = value

    def merge(self, other: Histogram) -> None:
        self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        self.n += other.n
        self.total += other.total
        self.max = max(self.max, other.max)

    def quantile(self, q: float) -> float | None:
        """Upper edge of the bin holding the q-quantile (at most one bin width high), capped at the max."""
        if not self.n:
            return None
        rank = q * self.n
        seen = 0
        for i, c in enumerate(self.counts):
            seen += c
            if seen >= rank and c:
                return min((i + 1) * self.width, self.max)
        return self.max


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardConfig:
    host: str
    port: int
    senders: range  # sender indexes this generator process simulates; sender i = ranks i*k .. i*k+k-1
    ranks_per_sender: int  # 1: every rank posts (its own client); 8: a node relay (goodput launch --node-relay)
    ranks_per_run: int
    total_ranks: int
    t0: float  # wall clock: the fleet's start
    ramp_s: float  # runs start uniformly over this
    stop: float  # wall clock: no steps or heartbeats after it
    give_up: float  # wall clock: ranks stop resending at it
    hang_run: int | None
    hang_rank: int | None
    hang_at: float  # wall clock
    connections: int
    seed: int
    coalesce: bool = True  # a send merges a rank's consecutive step records (ingest_client.worker.coalesce)


@dataclass
class ShardResult:
    request_latency_s: Histogram = field(default_factory=lambda: Histogram(0.0005, 60_000))
    pool_wait_s: Histogram = field(default_factory=lambda: Histogram(0.0005, 60_000))
    step_delay_s: Histogram = field(default_factory=lambda: Histogram(0.01, 60_000))
    statuses: Counter[int] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    paces: Counter[str] = field(default_factory=Counter)
    requests_by_10s: Counter[int] = field(default_factory=Counter)
    requests_ok: int = 0
    resent_then_ok: int = 0
    records_acked: int = 0
    steps_acked: int = 0
    heartbeats_acked: int = 0
    accepted: int = 0
    duplicates: int = 0
    body_bytes: int = 0
    connections_opened: int = 0
    cpu_s: float = 0.0
    wall_s: float = 0.0
    steps_made: dict[int, int] = field(default_factory=dict)  # global rank -> steps made (1..n)
    unacked_records: int = 0  # left when giving up

    def merge(self, other: ShardResult) -> None:
        for name in ("request_latency_s", "pool_wait_s", "step_delay_s"):
            getattr(self, name).merge(getattr(other, name))
        for name in ("statuses", "errors", "paces", "requests_by_10s"):
            getattr(self, name).update(getattr(other, name))
        for name in ("requests_ok", "resent_then_ok", "records_acked", "steps_acked", "heartbeats_acked",
                     "accepted", "duplicates", "body_bytes", "connections_opened", "cpu_s", "unacked_records"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.wall_s = max(self.wall_s, other.wall_s)
        self.steps_made.update(other.steps_made)


def run_id_of(run: int) -> str:
    return f"load-{run:04d}"


class _Rank:
    __slots__ = ("g", "run", "rank", "world", "run_id", "proc_id", "seq", "base", "next_step", "hb_next",
                 "start_at", "pending", "hung_run", "stuck", "rng")

    def __init__(self, g: int, cfg: ShardConfig, run_start: float, rng: random.Random,
                 pending: list[tuple[bytes, float]]) -> None:
        self.g = g
        self.run, self.rank = divmod(g, cfg.ranks_per_run)
        self.world = min(cfg.ranks_per_run, cfg.total_ranks - self.run * cfg.ranks_per_run)
        self.run_id = run_id_of(self.run)
        self.proc_id = f"{rng.getrandbits(64):016x}"
        self.seq = 0
        self.rng = rng
        self.start_at = run_start + rng.uniform(0.0, 0.5)  # the ranks of one job start within half a second
        self.base = run_start + 1.0 + rng.uniform(0.0, 0.02)  # step k ends at base + k
        self.next_step = 1  # the step in progress
        self.hb_next = self.start_at + HEARTBEAT_INTERVAL_S
        # its sender's unacknowledged records: (record, its step's end) for steps; (record, HEARTBEAT), (record, OTHER)
        self.pending = pending
        self.hung_run = self.run == cfg.hang_run
        self.stuck = self.hung_run and self.rank == cfg.hang_rank

    def _id(self) -> str:
        self.seq += 1
        return f"{self.proc_id}-{self.seq}"

    def attempt_start(self) -> None:
        self.pending.append((
            f'{{"event_id":"{self._id()}","run_id":"{self.run_id}","kind":"attempt_start","time":{self.start_at!r},'
            f'"attempt":0,"rank":{self.rank},"world_size":{self.world},"host":"node{self.g // 8}",'
            f'"local_rank":{self.rank % 8},"pid":{100000 + self.g}}}'.encode(), OTHER))

    def make_rows(self, now: float, cfg: ShardConfig) -> None:
        """Append the records of every step and heartbeat up to `now` (none after the stop), in time order."""
        limit = min(now, cfg.stop)
        step_limit = min(limit, cfg.hang_at) if self.hung_run else limit
        while True:
            step_end = self.base + self.next_step
            if step_end <= step_limit and step_end <= self.hb_next:
                s = self.next_step
                comm = self.rng.uniform(0.05, 0.2)
                self.pending.append((
                    f'{{"event_id":"{self._id()}","run_id":"{self.run_id}","kind":"steps","time":{step_end!r},'
                    f'"attempt":0,"rank":{self.rank},"step":[{s}],"start":[{step_end - 1.0!r}],'
                    f'"end":[{step_end!r}],"comm":[{comm:.4f}]}}'.encode(), step_end))
                self.next_step += 1
                self.hb_next = step_end + HEARTBEAT_INTERVAL_S  # the step record said it lives
            elif self.hb_next <= limit:
                collectives = (0 if self.stuck else 1) if self.hung_run and self.hb_next > cfg.hang_at else 0
                self.pending.append((
                    f'{{"event_id":"{self._id()}","run_id":"{self.run_id}","kind":"heartbeat",'
                    f'"time":{self.hb_next!r},"attempt":0,"rank":{self.rank},"step":{self.next_step},'
                    f'"collectives":{collectives}}}'.encode(), HEARTBEAT))
                self.hb_next += HEARTBEAT_INTERVAL_S
            else:
                return

    def next_row_at(self, cfg: ShardConfig) -> float:
        step_end = self.base + self.next_step
        if self.hung_run and step_end > cfg.hang_at:
            step_end = math.inf
        return min(step_end, self.hb_next)


class _Sender:
    """One rank's own flusher (ranks_per_sender 1), or a node relay sending for its node's ranks."""

    __slots__ = ("proc_id", "ranks", "pending", "start_at", "tick0", "interval_s", "lag_s", "max_batch", "rng",
                 "in_flight")

    def __init__(self, index: int, cfg: ShardConfig, run_start: dict[int, float], rng: random.Random) -> None:
        self.rng = rng
        self.pending: list[tuple[bytes, float]] = []
        first = index * cfg.ranks_per_sender
        self.ranks = [_Rank(g, cfg, run_start[g // cfg.ranks_per_run], random.Random(rng.getrandbits(64)),
                            self.pending) for g in range(first, min(first + cfg.ranks_per_sender, cfg.total_ranks))]
        relay = cfg.ranks_per_sender > 1
        self.proc_id = f"relay{rng.getrandbits(64):016x}" if relay else self.ranks[0].proc_id
        self.start_at = min(r.start_at for r in self.ranks)
        # a relay flushes every 0.5 s (ingest_client.launcher.relay.MIN_SEND_INTERVAL_S) and takes up to 5,000 records
        # a batch; a rank's record reaches it up to one rank flush interval (0.2 s) after it was made
        self.interval_s = RELAY_INTERVAL_S if relay else FLUSH_INTERVAL_S
        self.lag_s = FLUSH_INTERVAL_S if relay else 0.0
        self.max_batch = RELAY_MAX_BATCH_EVENTS if relay else MAX_BATCH_EVENTS
        self.tick0 = self.start_at + rng.uniform(0.0, self.interval_s)  # the flusher's tick grid
        self.in_flight = 0  # records of a send that failed, sent again alone (so they merge as they did)

    def make_rows(self, now: float, cfg: ShardConfig) -> None:
        for r in self.ranks:
            if r.seq == 0 and now - self.lag_s >= r.start_at:
                r.attempt_start()
            if r.seq:
                r.make_rows(now - self.lag_s, cfg)

    def next_row_at(self, cfg: ShardConfig) -> float:
        return min((r.next_row_at(cfg) if r.seq else r.start_at) for r in self.ranks) + self.lag_s

    def on_tick(self, t: float) -> float:
        """The first flusher tick at or after t."""
        return self.tick0 + math.ceil(max(0.0, t - self.tick0) / self.interval_s - 1e-9) * self.interval_s


async def _sleep_until(wall: float) -> None:
    delay = wall - time.time()
    if delay > 0:
        await asyncio.sleep(delay)


async def _send(r: _Sender, pool: Pool, cfg: ShardConfig, out: ShardResult, resend: bool
                ) -> tuple[str, float]:
    """One request with r's oldest unacknowledged records: ("ok", pace) | ("retry_after", s) | ("error", 0)."""
    batch = r.pending[:r.in_flight or r.max_batch]
    records = [rec for rec, _ in batch]
    body = encode_batch(coalesce(records) if cfg.coalesce else records)
    r.in_flight = len(batch)
    headers = {"Content-Type": "application/json", "User-Agent": "goodput-load/1", "Goodput-Sender": r.proc_id}
    if len(body) > GZIP_MIN_BYTES:
        body = gzip.compress(body, compresslevel=5)
        headers["Content-Encoding"] = "gzip"
    out.body_bytes += len(body)
    asked = time.perf_counter()
    try:
        response = await pool.post("/v1/events", body, headers, HTTP_TIMEOUT_S)
    except (OSError, TimeoutError, ProtocolError, asyncio.IncompleteReadError) as exc:
        out.errors[type(exc).__name__] += 1
        return "error", 0.0
    done = time.time()
    out.request_latency_s.add(time.perf_counter() - asked)
    out.statuses[response.status] += 1
    out.requests_by_10s[int((done - cfg.t0) // 10)] += 1
    if response.status == 200:
        pace = response.headers.get("goodput-send-interval", "")
        out.paces[pace] += 1
        ack = json.loads(response.body)
        out.accepted += int(ack["accepted"])
        out.duplicates += int(ack["duplicates"])
        out.requests_ok += 1
        out.resent_then_ok += resend
        out.records_acked += len(batch)
        delays = out.step_delay_s
        for _, end in batch:
            if end > 0:
                out.steps_acked += 1
                delays.add(done - end)
            elif end == HEARTBEAT:
                out.heartbeats_acked += 1
        del r.pending[:len(batch)]
        r.in_flight = 0
        try:
            return "ok", float(pace)
        except ValueError:
            return "ok", 0.0
    if response.status in (429, 503):
        try:
            return "retry_after", float(response.headers.get("retry-after", ""))
        except ValueError:
            return "error", 0.0
    raise RuntimeError(f"the collector refused a batch for good: {response.status} {response.body[:300]!r}")


async def _sender_loop(r: _Sender, pool: Pool, cfg: ShardConfig, out: ShardResult) -> None:
    await _sleep_until(r.start_at + r.lag_s)
    failures = 0
    resend = False
    next_round = r.start_at
    while True:
        await _sleep_until(next_round)
        now = time.time()
        r.make_rows(now, cfg)
        if not r.pending:
            if now - r.lag_s >= cfg.stop:
                return
            next_round = r.on_tick(r.next_row_at(cfg))
            continue
        if now >= cfg.give_up:
            out.unacked_records += len(r.pending)
            return
        outcome, seconds = await _send(r, pool, cfg, out, resend)
        if outcome == "ok":
            failures = 0
            resend = False
            after = time.time()
            next_round = max(now + seconds, after)
            if not r.pending:
                if now - r.lag_s >= cfg.stop:
                    return
                next_round = max(next_round, r.next_row_at(cfg))
            next_round = r.on_tick(next_round)
        elif outcome == "retry_after":
            resend = True
            next_round = time.time() + seconds * r.rng.uniform(1.0, 1.1)
        else:
            resend = True
            failures += 1
            ceiling = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** min(failures - 1, 16))
            next_round = time.time() + r.rng.uniform(ceiling / 2, ceiling)


async def _drive(cfg: ShardConfig) -> ShardResult:
    out = ShardResult()
    rng = random.Random(cfg.seed)
    runs = range(-(-cfg.total_ranks // cfg.ranks_per_run))
    run_start = {run: cfg.t0 + random.Random(run * 7919 + 17).uniform(0.0, cfg.ramp_s) for run in runs}
    senders = [_Sender(i, cfg, run_start, random.Random(rng.getrandbits(64))) for i in cfg.senders]
    pool = Pool(cfg.host, cfg.port, cfg.connections)
    cpu0 = time.process_time()
    began = time.monotonic()
    try:
        await asyncio.gather(*(_sender_loop(r, pool, cfg, out) for r in senders))
    finally:
        pool.close()
    out.wall_s = time.monotonic() - began
    out.cpu_s = time.process_time() - cpu0
    out.connections_opened = pool.opened
    out.steps_made = {r.g: r.next_step - 1 for s in senders for r in s.ranks}
    return out


def drive_shard(cfg: ShardConfig) -> ShardResult:
    """Run one generator process's share of the fleet to the end (the entry point of a worker process)."""
    return asyncio.run(_drive(cfg))
