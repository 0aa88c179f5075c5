"""Two `goodput serve` processes (own ports, as on two hosts) on one PostgreSQL database, one SIGKILLed mid-stream.

One simulated run's events go to both at once: some batches to one collector or the other, some to both at the
same moment (what a client's retry after a failover or a timeout does), through the real client's transport and
its retry rule (an unacknowledged batch is sent again; here, to the other collector). The collector holding the
background analyst's lock is killed while its writer has a transaction open. Then:

- every event, step row and collective row is stored exactly once (counted in the database against what was sent);
- one background analyst at a time across the processes (tests/faults/analyst_probe.py records every lock
  attempt and round and checks mutual exclusion with a file only one round can create), and the killed
  process's session lock is gone with its connection: the survivor's analyst takes over;
- both collectors give equal answers, also after the killed one is restarted.

Both start together on a new database: their migrations wait for each other (services.storage.migrate).
"""

from __future__ import annotations

import json
import queue
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, LiteralString

import httpx
import psycopg
import pytest

from ingest_client.transport.base import SendResult, SendStatus
from ingest_client.transport.http import HttpTransport
from services.derive.analyst import ROUND_LOCK
from services.simulate import SimConfig, simulate
from services.storage.db import make_engine
from services.storage.step_columns import stored_step_keys
from tests.faults.analyst_probe import read_probe
from tests.faults.conftest import Collector

pytestmark = pytest.mark.postgres

RUN_ID = "two-collectors"
BATCH_EVENTS = 8
WAIT_S = 120.0  # generous: the machine is shared; every wait is on a condition, never a fixed sleep
WRITER_STATEMENTS = ("INSERT INTO events%", "COPY steps%", "INSERT INTO collectives%", "UPDATE runs%")


def wait_for(condition: Callable[[], object], what: str, timeout_s: float = WAIT_S,
             explain: Callable[[], str] = str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {explain()}"
        time.sleep(0.02)


@dataclass
class Sender:
    """Batches of one run posted to two collectors by worker threads with the client's own transport.

    A "single" batch goes to one collector (alternating); a "mirror" batch to both at the same moment (two
    threads released together). An unacknowledged send (connection refused or reset, timeout, 5xx) is sent
    again to the other collector, until acknowledged; a rejection (4xx) is a failure of the test.

    Phases: batches [0, phase2) go at once; [phase2, phase3) after `go_phase2` is set, and again (as retries)
    for as long as `killed` is not set, so the stream is still flowing whenever the test looks for its moment to
    kill; [phase3, end) after `killed`.
    """

    urls: tuple[str, str]
    batches: list[list[bytes]]
    phase2: int
    phase3: int
    threads: int = 6
    go_phase2: threading.Event = field(default_factory=threading.Event)
    killed: threading.Event = field(default_factory=threading.Event)
    acks: list[tuple[int, int, int, int]] = field(default_factory=list)  # (batch, collector, accepted, duplicates)
    failovers: int = 0
    cycles: int = 0
    failures: list[str] = field(default_factory=list)
    reasons: Counter[str] = field(default_factory=Counter)  # why sends were not acknowledged
    raised: list[str] = field(default_factory=list)  # sends that raised instead of answering (none so far)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> list[threading.Thread]:
        work: queue.Queue[int | None] = queue.Queue(maxsize=self.threads)
        workers = [threading.Thread(target=self._work, args=(work,), daemon=True) for _ in range(self.threads)]
        feeder = threading.Thread(target=self._feed, args=(work,), daemon=True)
        for thread in [*workers, feeder]:
            thread.start()
        return [feeder, *workers]

    def progress(self) -> str:
        with self._lock:
            by_collector = Counter(target for _, target, _, _ in self.acks)
            with_duplicates = sum(1 for ack in self.acks if ack[3])
            return (f"{len(self.acks)} acknowledged sends ({dict(sorted(by_collector.items()))} by collector, "
                    f"{with_duplicates} with duplicates), {self.failovers} failovers, {self.cycles} repeats of "
                    f"phase 2, failures {self.failures[:3]}, raised {self.raised[:3]}, not acknowledged: "
                    f"{dict(self.reasons)}")

    def acknowledged(self) -> set[int]:
        with self._lock:
            return {b for b, _, _, _ in self.acks}

    def _feed(self, work: queue.Queue[int | None]) -> None:
        for b in range(self.phase2):
            work.put(b)
        self.go_phase2.wait()
        for b in range(self.phase2, self.phase3):
            work.put(b)
        while not self.killed.is_set():
            self.cycles += 1
            for b in range(self.phase2, self.phase3):
                if self.killed.is_set():
                    break
                work.put(b)
        for b in range(self.phase3, len(self.batches)):
            work.put(b)
        for _ in range(self.threads):
            work.put(None)

    def _work(self, work: queue.Queue[int | None]) -> None:
        transports = [HttpTransport(f"{url}/v1/events") for url in self.urls]  # the client's 2 s timeout
        while (b := work.get()) is not None:
            if b % 3 == 0:  # mirror: the same batch to both collectors at once
                together = threading.Barrier(2)
                other = threading.Thread(target=self._deliver, args=(transports, b, 1, together))
                other.start()
                self._deliver(transports, b, 0, together)
                other.join()
            else:
                self._deliver(transports, b, b % 2, None)

    def _deliver(self, transports: list[HttpTransport], b: int, target: int,
                 together: threading.Barrier | None) -> None:
        if together is not None:
            together.wait()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                result = transports[target].send(self.batches[b])
            except Exception as exc:  # the flusher takes a send that raised as not acknowledged, too
                with self._lock:
                    self.raised.append(repr(exc))
                result = SendResult(status=SendStatus.RETRY, message=repr(exc))
            if result.status is SendStatus.OK:
                with self._lock:
                    self.acks.append((b, target, result.accepted, result.duplicates))
                return
            if result.status is SendStatus.REJECTED:
                with self._lock:
                    self.failures.append(f"batch {b} rejected by {self.urls[target]}: {result.message}")
                return
            with self._lock:
                self.failovers += 1
                self.reasons[("after" if self.killed.is_set() else "before") + " the kill: " +
                             (str(result.http_status) if result.http_status else result.message[:40])] += 1
            target = 1 - target  # not acknowledged: send it again, to the other collector
            time.sleep(min(result.retry_after_s or 0.05, 0.5))
        with self._lock:
            self.failures.append(f"batch {b} never acknowledged")


class Database:
    """The test's own look at the database (autocommit: every query sees what is committed now)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.conn = psycopg.connect(url, autocommit=True)

    def one(self, sql: LiteralString, *params: object) -> Any:
        row = self.conn.execute(sql, params).fetchone()
        return None if row is None else row[0]

    def rows(self, sql: LiteralString, *params: object) -> list[tuple[Any, ...]]:
        return self.conn.execute(sql, params).fetchall()

    def step_keys(self, run_id: str) -> Counter[tuple[int, int, int]]:
        """(attempt, rank, step) of every stored step row of the run, in `steps` or in a block row."""
        engine = make_engine(self.url)
        try:
            with engine.connect() as conn:
                keys = stored_step_keys(conn, run_id)
        finally:
            engine.dispose()
        return Counter(zip(keys["attempt"].tolist(), keys["rank"].tolist(), keys["step"].tolist(), strict=True))

    def writer_transaction_open(self, app: str) -> bool:
        """A session of this collector is inside a transaction that has written or is running a write of the
        writer (events, steps, collectives, runs)."""
        return bool(self.one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND xact_start IS NOT NULL "
            "AND state IN ('active', 'idle in transaction') AND (backend_xid IS NOT NULL OR query ILIKE ANY(%s))",
            app, list(WRITER_STATEMENTS)))

    def round_lock_holders(self) -> list[str]:
        """application_name of every session holding the analyst's advisory lock (a bigint key below 2^31)."""
        return [r[0] for r in self.rows(
            "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.granted AND l.classid = 0 AND l.objid = %s AND l.objsubid = 1",
            ROUND_LOCK)]

    def activity(self) -> list[tuple[Any, ...]]:
        return self.rows("SELECT application_name, state, backend_xid::text, left(query, 60) FROM pg_stat_activity "
                         "WHERE application_name LIKE 'goodput-%%'")

    def sessions(self, app: str) -> int:
        return int(self.one("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", app))


@pytest.fixture
def two_collectors(pg_url: str, tmp_path: Path) -> Iterator[tuple[Collector, Collector, Path]]:
    probe = tmp_path / "probe"
    probe.mkdir()
    command = [sys.executable, "-m", "tests.faults.analyst_probe", str(probe)]
    # a background round every 0.2 s in each process, in the serving process the probe wraps (on PostgreSQL the
    # default is a process of its own: tests/test_analyst_process.py)
    env = {"GOODPUT_WARM_ANALYSES_S": "0.2", "GOODPUT_ANALYST": "thread"}
    pair = tuple(Collector(f"{pg_url}?application_name=goodput-{name}", tmp_path, extra_env=env, command=command,
                           name=name) for name in ("a", "b"))
    try:
        yield pair[0], pair[1], probe
    finally:
        (probe / "release").touch()  # a round still paused by the probe ends, so the processes stop
        for c in pair:
            c.stop()


@pytest.fixture
def db(pg_url: str) -> Iterator[Database]:
    database = Database(pg_url)
    yield database
    database.conn.close()


def _records(probe: Path, pid: int) -> list[dict[str, Any]]:
    return read_probe(probe).get(pid, [])


def _count(probe: Path, pid: int, key: str, value: object) -> int:
    return sum(1 for r in _records(probe, pid) if r.get(key) == value)


@dataclass(frozen=True)
class Instant:
    """A time computed from the server's clock and a duration: equal to another within a millisecond (the
    subtraction's rounding at 1.8e9 s is ~1e-7 s)."""

    time: float

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Instant) and abs(self.time - other.time) < 1e-3

    def __hash__(self) -> int:
        return 0


def _clock_free(doc: Any) -> Any:
    """An answer without the server's clock: each `live` block's `seconds_since_*` become the times they count
    from (server_time - seconds), its `server_time` goes; the report's `generated_at` goes (checked against the
    test's clock instead). Two collectors asked one after the other differ only there."""
    if isinstance(doc, list):
        return [_clock_free(x) for x in doc]
    if not isinstance(doc, dict):
        return doc
    out = {k: _clock_free(v) for k, v in doc.items() if k not in ("server_time", "generated_at")}
    if isinstance(doc.get("server_time"), float):
        for key, value in doc.items():
            if key.startswith("seconds_since_") and value is not None:
                out[key] = Instant(doc["server_time"] - value)
    return out


def _answers(url: str) -> dict[str, Any]:
    """What a collector answers about the run (every read endpoint of one run, and the run list)."""
    out: dict[str, Any] = {}
    asked = time.time()
    with httpx.Client(base_url=url, timeout=120) as client:
        for path in ("/v1/runs", f"/v1/runs/{RUN_ID}", f"/v1/runs/{RUN_ID}/waste", f"/v1/runs/{RUN_ID}/view",
                     f"/v1/runs/{RUN_ID}/timeline", f"/v1/runs/{RUN_ID}/ranks", f"/v1/runs/{RUN_ID}/checkpoints",
                     f"/v1/runs/{RUN_ID}/restarts", f"/v1/runs/{RUN_ID}/stragglers",
                     f"/v1/runs/{RUN_ID}/resume-check", f"/v1/runs/{RUN_ID}/advice", f"/v1/runs/{RUN_ID}/live",
                     f"/v1/runs/{RUN_ID}/report?format=json"):
            response = client.get(path)
            assert response.status_code == 200, f"{url}{path}: {response.status_code} {response.text[:300]}"
            out[path] = response.json()
    assert asked <= out[f"/v1/runs/{RUN_ID}/report?format=json"]["generated_at"] <= time.time()
    return _clock_free(out)


def _differences(left: Any, right: Any, path: str = "") -> list[str]:
    """The paths at which two JSON documents differ (for a readable failure)."""
    if isinstance(left, dict) and isinstance(right, dict):
        return [d for k in sorted(left.keys() | right.keys(), key=str)
                for d in _differences(left.get(k), right.get(k), f"{path}/{k}")]
    if isinstance(left, list) and isinstance(right, list) and len(left) == len(right):
        return [d for i, (x, y) in enumerate(zip(left, right, strict=True)) for d in _differences(x, y, f"{path}[{i}]")]
    return [] if left == right else [f"{path}: {str(left)[:80]} != {str(right)[:80]}"]


def test_two_collectors_on_one_database_one_killed_store_every_event_exactly_once(
        two_collectors: tuple[Collector, Collector, Path], db: Database) -> None:
    a, b, probe = two_collectors
    events = simulate(SimConfig(run_id=RUN_ID, ranks=8, hours=0.25, mtbf_s=300.0, seed=7, records_per_rank=15,
                                comm_inline=False, checkpoint_every=50,
                                start_time=float(int(time.time()) - 7200))).events
    batches = [[json.dumps(e).encode() for e in events[i:i + BATCH_EVENTS]]
               for i in range(0, len(events), BATCH_EVENTS)]
    n = len(batches)

    # Both start at once on a database no migration has touched.
    with ThreadPoolExecutor(2) as pool:
        for started in [pool.submit(c.start, WAIT_S) for c in (a, b)]:
            started.result()  # raises the collector's log if it exited
    assert a.proc is not None and b.proc is not None
    by_pid = {a.proc.pid: a, b.proc.pid: b}

    sender = Sender((a.url, b.url), batches, phase2=n // 2, phase3=n * 4 // 5)
    threads = sender.start()

    # Both processes run analyst rounds (each when it gets the lock), and build while the run changes.
    wait_for(lambda: all(_count(probe, pid, "round", "end") for pid in by_pid), "a round in each collector")
    # Pause the next round inside the lock; the other collector's rounds are then refused the lock.
    (probe / "hold").touch()
    wait_for(lambda: any(r.get("holding") for pid in by_pid for r in _records(probe, pid)), "a round to hold")
    holder_pid = next(pid for pid in by_pid if any(r.get("holding") for r in _records(probe, pid)))
    victim, survivor = by_pid[holder_pid], next(c for pid, c in by_pid.items() if pid != holder_pid)
    assert survivor.proc is not None
    survivor_pid = survivor.proc.pid
    victim_app = f"goodput-{victim.name}"
    assert db.round_lock_holders() == [victim_app]  # PostgreSQL's view: the holder's session has the lock
    refused = _count(probe, survivor_pid, "lock", False)
    wait_for(lambda: _count(probe, survivor_pid, "lock", False) > refused, "the other analyst to be refused")

    # Kill the holder mid-stream (the first half acknowledged, by both), while its writer is in a transaction.
    wait_for(lambda: len(sender.acknowledged()) == sender.phase2, "the first half of the stream")
    sender.go_phase2.set()
    wait_for(lambda: db.writer_transaction_open(victim_app), "the victim's writer to be in a transaction",
             explain=lambda: f"sender: {sender.progress()}; sessions: {db.activity()}; victim's log: "
                             f"{victim.log_path.read_text()[-2000:]}")
    sender.killed.set()  # (first, so the sends the kill breaks are counted after it)
    victim.kill()
    (probe / "release").touch()  # (only the dead process was paused: the hold was taken once)
    survivor_rounds = _count(probe, survivor_pid, "round", "end")
    wait_for(lambda: db.sessions(victim_app) == 0, "PostgreSQL to end the killed collector's sessions")
    wait_for(lambda: _count(probe, survivor_pid, "round", "end") > survivor_rounds,
             "the survivor's analyst to take the lock over")
    assert victim_app not in db.round_lock_holders()

    for thread in threads:
        thread.join(WAIT_S * 3)
        assert not thread.is_alive(), "the sender did not finish"
    assert not sender.failures, sender.failures
    assert sender.acknowledged() == set(range(n))
    for batch, _, accepted_events, duplicate_events in sender.acks:  # every acknowledgement accounts for its batch
        assert accepted_events + duplicate_events == len(batches[batch])

    # Exactly once: what the database holds against what was sent.
    sent_ids = Counter(e["event_id"] for e in events)
    sent_steps = Counter((e["attempt"], e["rank"], s) for e in events if e["kind"] == "steps" for s in e["step"])
    sent_collectives = Counter((e["attempt"], e["rank"], s, op) for e in events if e["kind"] == "collectives"
                               for s, op in zip(e["step"], e["op"], strict=True))
    run_pks = db.rows("SELECT id FROM runs WHERE run_id = %s", RUN_ID)
    assert len(run_pks) == 1, run_pks  # one runs row, though both collectors created it at the same moment
    run_pk = run_pks[0][0]
    stored_ids = Counter(r[0] for r in db.rows("SELECT event_id FROM events WHERE run_pk = %s", run_pk))
    stored_steps = db.step_keys(RUN_ID)
    stored_collectives = Counter(db.rows("SELECT attempt, rank, step, op FROM collectives WHERE run_pk = %s",
                                         run_pk))
    accepted = sum(acc for _, _, acc, _ in sender.acks)
    detail = (f"{len(events)} events in {n} batches; {sender.progress()}; {len(events) - accepted} events "
              "committed by a collector that was killed before it acknowledged them")
    print(detail)
    assert len(sent_ids) == len(events) and max(sent_steps.values()) == 1  # the run's own ids and steps are unique
    # every event stored once; a step record's id goes once its rows moved into block rows and heartbeats are
    # thinned to each rank's extremes (services.storage.moved_repeats): their rows are checked below
    thinned = {e["event_id"] for e in events if e["kind"] in ("steps", "heartbeat")}
    assert max(stored_ids.values()) == 1 and set(stored_ids) <= set(sent_ids), detail
    assert set(sent_ids) - set(stored_ids) <= thinned, detail
    assert stored_steps == sent_steps, detail
    assert stored_collectives == sent_collectives, detail
    assert accepted <= len(events)  # no event was new to two collectors
    assert sender.failovers > 0, "the kill was noticed by the sender and its batches went to the survivor"

    # One analyst at a time, over the whole test; and the analysts did work.
    records = read_probe(probe)
    assert not [r for rs in records.values() for r in rs if "overlap" in r]
    assert sum(r.get("built", 0) for rs in records.values() for r in rs) > 0

    # Equal answers from both, also once the killed one is back (its analyst takes turns with the survivor's).
    victim.start(WAIT_S)
    assert victim.proc is not None
    back = victim.proc.pid
    wait_for(lambda: _count(probe, back, "round", "end"), "a round in the restarted collector")
    first = _answers(survivor.url)
    assert not _differences(first, _answers(victim.url))
    assert not _differences(first, _answers(survivor.url))
    assert first[f"/v1/runs/{RUN_ID}/waste"]["status"] == "finished"
    assert not [r for rs in read_probe(probe).values() for r in rs if "overlap" in r]
