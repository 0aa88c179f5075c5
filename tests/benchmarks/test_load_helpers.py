"""The fleet load generator's pieces (benchmarks/_http1.py, benchmarks/_fleet.py): fast, no server."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import random
import subprocess
import sys
import time

import pytest

from benchmarks._fleet import HEARTBEAT, OTHER, Histogram, ShardConfig, ShardResult, _Rank, _Sender, _sender_loop
from benchmarks._http1 import Pool, ProtocolError, build_request, parse_head
from benchmarks._procs import tree
from benchmarks.load import Samples, _pace_summary
from ingest_client.transport.base import encode_batch
from ingest_client.worker.coalesce import coalesce
from services.collector.batch import parse_batch


def test_response_head_is_parsed_into_status_and_lower_case_headers() -> None:
    status, headers = parse_head(b"HTTP/1.1 200 OK\r\ncontent-length: 29\r\nGoodput-Send-Interval: 2.56\r\n\r\n")
    assert status == 200
    assert headers == {"content-length": "29", "goodput-send-interval": "2.56"}


def test_a_head_that_is_not_http_is_refused() -> None:
    with pytest.raises(ProtocolError):
        parse_head(b"SSH-2.0-OpenSSH\r\n\r\n")


def test_request_carries_its_body_length_and_headers() -> None:
    raw = build_request("/v1/events", "127.0.0.1:8000", b"{}", {"Goodput-Sender": "abc"})
    assert raw == (b"POST /v1/events HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nContent-Length: 2\r\n"
                   b"Goodput-Sender: abc\r\n\r\n{}")


def test_histogram_quantiles_are_within_one_bin_and_merge() -> None:
    a, b = Histogram(0.01, 1000), Histogram(0.01, 1000)
    for i in range(1, 101):
        (a if i % 2 else b).add(i / 10)
    a.merge(b)
    assert a.n == 100 and a.max == pytest.approx(10.0)
    assert a.quantile(0.5) == pytest.approx(5.0, abs=0.011)
    assert a.quantile(0.99) == pytest.approx(9.9, abs=0.011)


def _config(hang_at: float) -> ShardConfig:
    return ShardConfig(host="127.0.0.1", port=1, senders=range(8), ranks_per_sender=1, ranks_per_run=4,
                       total_ranks=8, t0=1.8e9, ramp_s=0.0, stop=1.8e9 + 60, give_up=1.8e9 + 90, hang_run=1,
                       hang_rank=2,
                       hang_at=hang_at, connections=1, seed=1)


def test_simulated_records_are_valid_wire_records_one_step_each_with_unique_ids() -> None:
    cfg = _config(hang_at=1.8e9 + 1000)
    rank = _Rank(1, cfg, cfg.t0, random.Random(1), [])
    rank.attempt_start()
    rank.make_rows(cfg.t0 + 30, cfg)
    records = parse_batch(encode_batch([rec for rec, _ in rank.pending]), max_events=500, max_rows=10_000)
    kinds = [json.loads(rec)["kind"] for rec, _ in rank.pending]
    # a step ends every second from the second second on: the rank is heard from by its steps, no heartbeat
    assert kinds[0] == "attempt_start" and kinds.count("heartbeat") == 0 and kinds.count("steps") == 28
    assert len(records) == len(rank.pending)
    assert len({json.loads(rec)["event_id"] for rec, _ in rank.pending}) == len(rank.pending)
    steps = [json.loads(rec)["step"] for rec, end in rank.pending if end > 0]
    assert steps == [[s] for s in range(1, 29)]
    assert [end for _, end in rank.pending if end <= 0].count(HEARTBEAT) == 0
    assert [end for _, end in rank.pending if end <= 0].count(OTHER) == 1


def test_after_the_hang_no_rank_of_the_run_steps_and_only_the_stuck_rank_has_no_collective_started() -> None:
    cfg = _config(hang_at=1.8e9 + 10.5)
    ranks = [_Rank(g, cfg, cfg.t0, random.Random(g), []) for g in range(4, 8)]  # run 1, the hung run
    for rank in ranks:
        rank.make_rows(cfg.t0 + 40, cfg)
    for rank in ranks:
        records = [json.loads(rec) for rec, _ in rank.pending]
        assert max(r["step"][0] for r in records if r["kind"] == "steps") == 9
        late = [r for r in records if r["kind"] == "heartbeat" and r["time"] > cfg.hang_at]
        assert late and all(r["step"] == 10 for r in late)
        assert {r["collectives"] for r in late} == ({0} if rank.rank == 2 else {1})


def test_pace_summary_gives_quantiles_and_one_second_bins() -> None:
    summary = _pace_summary({"0.00": 10, "2.56": 80, "5.00": 10})
    assert summary.startswith("p10 0.00 s, p50 2.56 s, p90 2.56 s, max 5.00 s over 100 answers")
    assert "[2, 3) s: 80" in summary


def _relay_after_12_s() -> _Sender:
    """The second of two node relays of 4 ranks each, with the records its ranks made in their first 12 s."""
    cfg = ShardConfig(host="127.0.0.1", port=1, senders=range(2), ranks_per_sender=4, ranks_per_run=8,
                      total_ranks=8, t0=1.8e9, ramp_s=0.0, stop=1.8e9 + 60, give_up=1.8e9 + 90, hang_run=None,
                      hang_rank=None, hang_at=1.8e9 + 1000, connections=1, seed=1)
    sender = _Sender(1, cfg, {0: cfg.t0}, random.Random(3))
    sender.make_rows(cfg.t0 + 12.0, cfg)
    return sender


def test_a_node_relay_sends_the_records_of_its_ranks_under_one_sender_name() -> None:
    sender = _relay_after_12_s()
    records = [json.loads(rec) for rec, _ in sender.pending]
    assert sender.proc_id.startswith("relay") and {r["rank"] for r in records} == {4, 5, 6, 7}
    assert sorted(r["step"][0] for r in records if r["kind"] == "steps") == sorted(list(range(1, 11)) * 4)
    assert sum(r["kind"] == "attempt_start" for r in records) == 4


def test_a_send_merges_each_rank_s_step_records_as_the_client_does() -> None:
    sender = _relay_after_12_s()
    sent = [json.loads(rec) for rec in coalesce([rec for rec, _ in sender.pending])]
    steps = {r["rank"]: r for r in sent if r["kind"] == "steps"}
    assert len(steps) == len([r for r in sent if r["kind"] == "steps"]) == 4, "one record a rank"
    assert all(r["step"] == list(range(1, 11)) and r["event_id"].endswith("+10") for r in steps.values())
    assert not any(r["kind"] == "heartbeat" for r in sent)  # ranks that step send none


def test_a_rank_resends_the_same_records_after_a_503_and_follows_the_pace_it_is_given() -> None:
    bodies: list[list[str]] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return
            _, headers = parse_head(b"HTTP/1.1 200 OK" + head[head.index(b"\r\n"):])
            body = await reader.readexactly(int(headers["content-length"]))
            if headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            bodies.append([e["event_id"] for e in json.loads(body)["events"]])
            if len(bodies) == 1:
                writer.write(b"HTTP/1.1 503 Busy\r\nRetry-After: 0.3\r\ncontent-length: 0\r\n\r\n")
            else:
                ack = b'{"accepted":1,"duplicates":0}'
                writer.write(b"HTTP/1.1 200 OK\r\nGoodput-Send-Interval: 1.00\r\ncontent-length: %d\r\n\r\n%s"
                             % (len(ack), ack))
            await writer.drain()

    async def main() -> ShardResult:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        now = time.time()
        cfg = ShardConfig(host="127.0.0.1", port=port, senders=range(1), ranks_per_sender=1, ranks_per_run=1,
                          total_ranks=1, t0=now, ramp_s=0.0, stop=now + 2.6, give_up=now + 10, hang_run=None,
                          hang_rank=None, hang_at=now + 100, connections=2, seed=1)
        sender = _Sender(0, cfg, {0: now - 1.0}, random.Random(5))  # started a second ago: one step made by now
        out = ShardResult()
        pool = Pool("127.0.0.1", port, 2)
        await asyncio.wait_for(_sender_loop(sender, pool, cfg, out), 10)
        pool.close()
        server.close()
        return out

    out = asyncio.run(main())
    assert bodies[1] == bodies[0]  # the refused records again as first sent, with their ids
    assert out.statuses[503] == 1 and out.resent_then_ok == 1
    assert out.steps_acked == sum(len(b) for b in bodies[1:]) - 1  # every step acknowledged once (+ attempt_start)
    assert 2 <= len(bodies) <= 4  # after the resend, at most one round per second (the pace) until the stop


_BUSY = ("import sys, time\nt = time.process_time()\nwhile time.process_time() - t < 0.3:\n    pass\n"
         "print('busy', flush=True)\nsys.stdin.read()")


def test_the_collector_s_cpu_is_split_by_process_role() -> None:
    """The fleet report's CPU by process: the command that was started is the supervisor, a `goodput analyst`
    process (its argv names it) the analyst, the rest workers; each counts only the CPU it spent while sampled."""
    root = os.getpid()
    procs = [subprocess.Popen([sys.executable, "-c", _BUSY, role], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
             for role in ("analyst", "serve-worker")]
    try:
        samples = Samples()
        samples.sample_collector(root, tree(root))
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline() == b"busy\n"
        samples.sample_collector(root, tree(root))
        roles = samples.collector_roles
        assert roles[root] == "supervisor"
        assert roles[procs[0].pid] == "analyst" and roles[procs[1].pid] == "workers"
        by_role = samples.collector_cpu.seconds_by(roles)
        assert by_role["analyst"] >= 0.2 and by_role["workers"] >= 0.2
        assert sum(by_role.values()) == pytest.approx(samples.collector_cpu.seconds)
    finally:
        for proc in procs:
            proc.communicate(timeout=30)
