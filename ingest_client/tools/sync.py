"""Replay spools left behind by dead processes and their quarantined batches: ``sync_directory`` and
``goodput sync DIR``."""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ingest_client.common.config import read_token_file, token_from_env, token_in_argv_warning
from ingest_client.common.errors import ConfigError
from ingest_client.transport.base import SendResult, SendStatus, Transport
from ingest_client.transport.http import FOREIGN_SUFFIX, HttpTransport
from ingest_client.worker.coalesce import coalesce
from ingest_client.worker.quarantine import AUTH_STATUSES, QuarantinedBatch, Refusal, advice
from ingest_client.worker.spool import OrphanSpool, Segment, claim_orphans, read_frames

logger = logging.getLogger(__name__)

MAX_ATTEMPTS = 5
MAX_WAIT_S = 10.0
BATCH_EVENTS = 500
BATCH_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncResult:
    sent: int  # records acknowledged by the collector now (accepted or duplicate), quarantined ones included
    from_quarantine: int  # of which, records that had been quarantined (their files are deleted)
    already_acknowledged: int  # records acknowledged before this sync
    failed: int  # records still unsent (collector unreachable); kept for the next sync
    rejected: int  # records refused for good (or not tried after a 401/403); kept on disk for the next sync
    live_processes: int  # spools skipped because their process is still running
    torn_bytes: int  # bytes of corrupt frames and torn tails, skipped
    not_sent: dict[str, int] = field(default_factory=dict)  # reason ("HTTP 401", "unreachable") -> records kept
    statuses: dict[str, int | None] = field(default_factory=dict)  # reason -> its HTTP status, for advice()
    corrupt_frames: int = 0  # frames whose CRC failed, skipped (the frames after them were sent)


@dataclass(slots=True)
class _Sync:
    """One sync's transport, limits and running totals."""

    transport: Transport
    max_attempts: int
    batch_cap: int = BATCH_EVENTS  # halved by every 413 of a batch of more than one record
    stopped_by: Refusal | None = None  # a 401/403: nothing more is sent in this sync
    totals: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("sent", "from_quarantine", "already_acknowledged", "failed", "rejected", "live", "torn", "corrupt"), 0))
    not_sent: dict[str, int] = field(default_factory=dict)
    statuses: dict[str, int | None] = field(default_factory=dict)

    def keep(self, reason: str, status: int | None, n: int, *, failed: bool) -> None:
        if n <= 0:
            return
        self.totals["failed" if failed else "rejected"] += n
        self.not_sent[reason] = self.not_sent.get(reason, 0) + n
        self.statuses[reason] = status

    def send(self, payloads: list[bytes]) -> SendResult:
        """One batch, retried on transient failures (up to ``max_attempts``); the last answer."""
        attempts = 0
        records = coalesce(payloads)
        while True:
            result = self.transport.send(records)
            if result.status is not SendStatus.RETRY or result.foreign_answer:  # a wrong URL stays wrong
                return result
            attempts += 1
            if attempts >= self.max_attempts:
                return result
            wait = result.retry_after_s
            if wait is None:
                wait = random.uniform(0.25, 0.5) * 2 ** (attempts - 1)
            time.sleep(min(wait, MAX_WAIT_S))

    def split_after(self, result: SendResult, n: int) -> bool:
        if result.http_status != 413 or n <= 1:
            return False
        self.batch_cap = max(1, n // 2)
        return True


def sync_directory(
    path: str | Path,
    url: str | None = None,
    token: str | None = None,
    *,
    transport: Transport | None = None,
    timeout_s: float = 10.0,
    max_attempts: int = MAX_ATTEMPTS,
) -> SyncResult:
    """Send every unacknowledged and every quarantined record under ``path`` (a spool root or one run's directory).

    Spools of live processes are skipped. Fully acknowledged spools and accepted quarantined batches are deleted
    afterwards, so a second sync sends nothing again. What the collector refuses stays on disk (in the
    quarantine), counted per reason in ``not_sent``; a 401 or 403 stops the sync (every batch would be refused).
    """
    if transport is None:
        if not url:
            raise ValueError("sync_directory needs url= (or GOODPUT_URL) or transport=")
        transport = HttpTransport(url.rstrip("/") + "/v1/events", token=token, timeout_s=timeout_s)
    state = _Sync(transport=transport, max_attempts=max_attempts)
    for directory, _dirs, _files in os.walk(path):
        orphans, alive = claim_orphans(Path(directory))
        state.totals["live"] += alive
        for orphan in orphans:
            _sync_orphan(orphan, state)
    transport.close()
    t = state.totals
    return SyncResult(
        sent=t["sent"], from_quarantine=t["from_quarantine"], already_acknowledged=t["already_acknowledged"],
        failed=t["failed"], rejected=t["rejected"], live_processes=t["live"], torn_bytes=t["torn"],
        not_sent=dict(state.not_sent), statuses=dict(state.statuses), corrupt_frames=t["corrupt"],
    )


def _count_frames(segment: Segment, start: int, stop: int) -> int:
    count = 0
    while start < stop:
        batch = read_frames(segment.path, start, max_events=10_000, max_bytes=64 * 1024 * 1024, stop_at=stop)
        if not batch.payloads:
            break
        count += len(batch.payloads)
        start = batch.end_offset
    return count


def _transient(result: SendResult) -> str:
    """The reason records stay unsent after a transient failure (retried ``max_attempts`` times), or after an
    answer that was not the collector's (what answered)."""
    if result.foreign_answer:
        return result.message
    return f"HTTP {result.http_status}, transient" if result.http_status else "unreachable"


FOREIGN_ADVICE = ("something other than the collector answered: check --url (GOODPUT_URL): it must be the "
                  "collector's base URL (the address `goodput serve` prints), reached without a login page or a "
                  "redirect; then run goodput sync again")


def _sync_orphan(orphan: OrphanSpool, state: _Sync) -> None:
    quarantined = list(orphan.quarantined)  # batches refused in this sync are not sent twice in it
    try:
        for segment in orphan.segments:
            state.totals["already_acknowledged"] += _count_frames(segment, 0, segment.ack_offset)
            _sync_segment(orphan, segment, state)
            state.totals["torn"] += segment.torn_bytes
            state.totals["corrupt"] += segment.corrupt_frames
            if segment.corrupt_frames:
                logger.warning("goodput sync: skipped %d corrupt frame(s) in %s; the records after them were read",
                               segment.corrupt_frames, segment.path)
        for batch in quarantined:
            _sync_quarantined(batch, state)
    finally:
        orphan.release()


def _sync_segment(orphan: OrphanSpool, segment: Segment, state: _Sync) -> None:
    while segment.has_pending:
        if state.stopped_by is not None:
            state.keep(state.stopped_by.reason, state.stopped_by.http_status,
                       _count_frames(segment, segment.ack_offset, segment.size), failed=False)
            return
        start = segment.ack_offset
        batch = segment.read_batch(max_events=state.batch_cap, max_bytes=BATCH_BYTES)
        if not batch.payloads:
            continue
        n = len(batch.payloads)
        result = state.send(batch.payloads)
        if result.status is SendStatus.OK:
            state.totals["sent"] += n
            orphan.record_ack(segment, batch.end_offset, n)
            continue
        if result.status is SendStatus.RETRY:
            state.keep(_transient(result), result.http_status, _count_frames(segment, start, segment.size), failed=True)
            logger.warning("goodput sync: giving up on %s (%s %s)", segment.path, _transient(result), result.message)
            return
        if state.split_after(result, n):
            continue
        refusal = Refusal(http_status=result.http_status, message=result.message, time=time.time(), records=n)
        if result.http_status in AUTH_STATUSES:  # left in the spool as it is
            state.stopped_by = refusal
            continue
        orphan.quarantine(segment, start, batch.payloads, refusal)
        orphan.record_ack(segment, batch.end_offset, n)
        state.keep(refusal.reason, refusal.http_status, n, failed=False)


def _sync_quarantined(batch: QuarantinedBatch, state: _Sync) -> None:
    payloads = batch.payloads()
    kept: list[bytes] = []
    last: Refusal | None = None
    done = 0
    while done < len(payloads):
        if state.stopped_by is not None:  # not tried: the file keeps its reason unless a chunk of it was refused
            state.keep(state.stopped_by.reason, state.stopped_by.http_status, len(payloads) - done, failed=False)
            kept.extend(payloads[done:])
            break
        chunk = payloads[done:done + state.batch_cap]
        result = state.send(chunk)
        if result.status is SendStatus.OK:
            state.totals["sent"] += len(chunk)
            state.totals["from_quarantine"] += len(chunk)
            done += len(chunk)
            continue
        if result.status is SendStatus.RETRY:
            state.keep(_transient(result), result.http_status, len(payloads) - done, failed=True)
            kept.extend(payloads[done:])
            break
        if state.split_after(result, len(chunk)):
            continue
        refusal = Refusal(http_status=result.http_status, message=result.message, time=time.time(),
                          records=len(chunk))
        last = refusal
        if result.http_status in AUTH_STATUSES:
            state.stopped_by = refusal
            continue
        state.keep(refusal.reason, refusal.http_status, len(chunk), failed=False)
        kept.extend(chunk)
        done += len(chunk)
    if not kept:
        batch.delete()
    elif len(kept) < len(payloads) or last is not None:
        batch.rewrite(kept, last or batch.refusal())


def sync_main(argv: list[str]) -> int:
    """``goodput sync DIR [--url URL] [--token-file F]``; exit status 1 if anything is left unsent (kept on disk)."""
    parser = argparse.ArgumentParser(prog="goodput sync", description="Send spooled events to the collector.")
    parser.add_argument("directory", help="spool directory (e.g. ~/.cache/goodput/spool or one run's folder)")
    parser.add_argument("--url", default=os.environ.get("GOODPUT_URL"), help="collector URL (GOODPUT_URL)")
    tokens = parser.add_mutually_exclusive_group()
    tokens.add_argument("--token-file", help="a file whose first line is the write token (default: GOODPUT_TOKEN, "
                                             "else GOODPUT_TOKEN_FILE)")
    tokens.add_argument("--token", help="the write token; readable by every user of the machine while sync runs "
                                        "(ps): prefer --token-file or the variables")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per request (the whole request)")
    parser.add_argument("--attempts", type=int, default=MAX_ATTEMPTS, help="tries per batch before giving up")
    args = parser.parse_args(argv)
    if not args.url:
        print("goodput sync: no collector URL; pass --url or set GOODPUT_URL", file=sys.stderr)
        return 2
    if args.token:
        print(f"goodput sync: warning: {token_in_argv_warning('--token')}", file=sys.stderr)
    try:
        token = args.token or (read_token_file(args.token_file, "--token-file") if args.token_file
                               else token_from_env(os.environ))
    except ConfigError as exc:
        print(f"goodput sync: {exc}", file=sys.stderr)
        return 2
    if not Path(args.directory).is_dir():
        print(f"goodput sync: {args.directory} is not a directory", file=sys.stderr)
        return 2
    result = sync_directory(args.directory, args.url, token, timeout_s=args.timeout,
                            max_attempts=max(1, args.attempts))
    print(
        f"sent {result.sent} records, {result.already_acknowledged} already acknowledged, "
        f"{result.failed} failed, {result.rejected} rejected; "
        f"skipped {result.live_processes} live process(es)"
        + (f"; {result.from_quarantine} of the sent records came from the quarantine" if result.from_quarantine
           else "")
        + (f"; skipped {result.corrupt_frames} corrupt frame(s)" if result.corrupt_frames else "")
        + (f"; skipped {result.torn_bytes} bytes of torn or corrupt frames" if result.torn_bytes else "")
    )
    for reason, n in sorted(result.not_sent.items()):
        transient = reason == "unreachable" or reason.endswith("transient")
        what = ("the collector was unreachable or busy: run goodput sync again later" if transient
                else FOREIGN_ADVICE if reason.endswith(FOREIGN_SUFFIX) else advice(result.statuses.get(reason)))
        print(f"not sent: {n} records ({reason}); kept in {args.directory}: {what}")
    return 0 if not result.not_sent else 1
