"""Replay spools left behind by dead processes: ``sync_directory`` and ``goodput sync DIR``."""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ingest_client.spool import OrphanSpool, Segment, claim_orphans, read_frames
from ingest_client.transport.base import SendStatus, Transport
from ingest_client.transport.http import HttpTransport

logger = logging.getLogger(__name__)

MAX_ATTEMPTS = 5
MAX_WAIT_S = 10.0
BATCH_EVENTS = 500
BATCH_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncResult:
    sent: int  # records acknowledged by the collector now (accepted or duplicate)
    already_acknowledged: int  # records acknowledged before this sync
    failed: int  # records still unsent (collector unreachable); kept for the next sync
    rejected: int  # records refused for good (4xx); not resent
    live_processes: int  # spools skipped because their process is still running
    torn_bytes: int  # bytes after a torn or corrupt frame, skipped


def sync_directory(
    path: str | Path,
    url: str | None = None,
    token: str | None = None,
    *,
    transport: Transport | None = None,
    timeout_s: float = 10.0,
    max_attempts: int = MAX_ATTEMPTS,
) -> SyncResult:
    """Send every unacknowledged record under ``path`` (a spool root or one run's directory).

    Spools of live processes are skipped. Fully acknowledged spools are deleted afterwards, so
    a second sync sends nothing again.
    """
    if transport is None:
        if not url:
            raise ValueError("sync_directory needs url= (or GOODPUT_URL) or transport=")
        transport = HttpTransport(url.rstrip("/") + "/v1/events", token=token, timeout_s=timeout_s)
    totals = {"sent": 0, "already_acknowledged": 0, "failed": 0, "rejected": 0, "live": 0, "torn": 0}
    for directory, _dirs, _files in os.walk(path):
        orphans, alive = claim_orphans(Path(directory))
        totals["live"] += alive
        for orphan in orphans:
            _sync_orphan(orphan, transport, max_attempts, totals)
    transport.close()
    return SyncResult(
        sent=totals["sent"], already_acknowledged=totals["already_acknowledged"], failed=totals["failed"],
        rejected=totals["rejected"], live_processes=totals["live"], torn_bytes=totals["torn"],
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


def _sync_orphan(orphan: OrphanSpool, transport: Transport, max_attempts: int, totals: dict[str, int]) -> None:
    try:
        for segment in orphan.segments:
            totals["already_acknowledged"] += _count_frames(segment, 0, segment.ack_offset)
            attempts = 0
            while segment.has_pending:
                batch = segment.read_batch(max_events=BATCH_EVENTS, max_bytes=BATCH_BYTES)
                if not batch.payloads:
                    continue
                result = transport.send(batch.payloads)
                n = len(batch.payloads)
                if result.status is SendStatus.RETRY:
                    attempts += 1
                    if attempts >= max_attempts:
                        totals["failed"] += _count_frames(segment, segment.ack_offset, segment.size)
                        logger.warning("goodput sync: giving up on %s (%s %s)", segment.path,
                                       result.http_status or "unreachable", result.message)
                        break
                    wait = result.retry_after_s
                    if wait is None:
                        wait = random.uniform(0.25, 0.5) * 2 ** (attempts - 1)
                    time.sleep(min(wait, MAX_WAIT_S))
                    continue
                attempts = 0
                if result.status is SendStatus.OK:
                    totals["sent"] += n
                else:
                    totals["rejected"] += n
                    logger.warning("goodput sync: the collector rejected %d events with HTTP %s: %s",
                                   n, result.http_status, result.message)
                orphan.record_ack(segment, batch.end_offset, n)
            totals["torn"] += segment.torn_bytes
    finally:
        orphan.release()


def sync_main(argv: list[str]) -> int:
    """``goodput sync DIR [--url URL] [--token T]``; exit status 1 if anything is left unsent."""
    parser = argparse.ArgumentParser(prog="goodput sync", description="Send spooled events to the collector.")
    parser.add_argument("directory", help="spool directory (e.g. ~/.cache/goodput/spool or one run's folder)")
    parser.add_argument("--url", default=os.environ.get("GOODPUT_URL"), help="collector URL (GOODPUT_URL)")
    parser.add_argument("--token", default=os.environ.get("GOODPUT_TOKEN"), help="bearer token (GOODPUT_TOKEN)")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per request")
    parser.add_argument("--attempts", type=int, default=MAX_ATTEMPTS, help="tries per batch before giving up")
    args = parser.parse_args(argv)
    if not args.url:
        print("goodput sync: no collector URL; pass --url or set GOODPUT_URL", file=sys.stderr)
        return 2
    if not Path(args.directory).is_dir():
        print(f"goodput sync: {args.directory} is not a directory", file=sys.stderr)
        return 2
    result = sync_directory(args.directory, args.url, args.token, timeout_s=args.timeout,
                            max_attempts=max(1, args.attempts))
    print(
        f"sent {result.sent} records, {result.already_acknowledged} already acknowledged, "
        f"{result.failed} failed, {result.rejected} rejected; "
        f"skipped {result.live_processes} live process(es)"
        + (f"; skipped {result.torn_bytes} bytes of torn frames" if result.torn_bytes else "")
    )
    return 0 if result.failed == 0 else 1
