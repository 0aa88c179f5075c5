"""Batches the collector refused for good, kept next to the spool until ``goodput sync`` delivers them.

One file per refused batch, in the run's spool directory, named after where its records were in the spool::

    <proc_id>.<seg>.<offset>.quarantine        frames, as in a spool segment (u32 length, u32 CRC32, payload)
    <proc_id>.<seg>.<offset>.quarantine.json   why: {"http_status", "message", "time", "records"}

``<seg>`` and ``<offset>`` (12 digits) are the segment and byte offset of the batch's first record, so names
sort in the order the records were written, and the same records are never quarantined under two names. The
frames file is written to a temporary name, fsynced and renamed before the spool acknowledges the records (a
crash in between leaves them in the spool, to be sent again: never in neither place).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

from ingest_client.worker.frames import encode_frame, read_frames

QUARANTINE_SUFFIX = ".quarantine"
REASON_SUFFIX = ".quarantine.json"
_QUARANTINE_RE = re.compile(r"^(?P<proc>[A-Za-z0-9_-]+)\.\d{6}\.\d{12}\.quarantine$")
AUTH_STATUSES = frozenset({401, 403})


@dataclass(frozen=True, slots=True, kw_only=True)
class Refusal:
    """The collector's answer to a batch it will not store."""

    http_status: int | None
    message: str
    time: float  # UTC epoch seconds of the answer
    records: int  # records in the quarantined file

    @property
    def reason(self) -> str:
        return f"HTTP {self.http_status}" if self.http_status else "refused"


def advice(http_status: int | None) -> str:
    """What the user should do about a refusal, as one sentence for a log line or the sync report."""
    if http_status in AUTH_STATUSES:
        return ("the token is wrong, revoked or not allowed to write this run: fix GOODPUT_TOKEN (or "
                "GOODPUT_TOKEN_FILE), then run `goodput sync <spool dir>`")
    if http_status == 413:
        return "a single record is larger than the collector accepts (GOODPUT_MAX_BODY_BYTES on the collector)"
    return ("the collector says the records are invalid: upgrade the client or the collector so they agree, "
            "then run `goodput sync <spool dir>`")


def proc_of(path: Path) -> str | None:
    """The process id a quarantine file belongs to, or None when ``path`` is not one."""
    match = _QUARANTINE_RE.match(path.name)
    return match.group("proc") if match else None


@dataclass(slots=True)
class QuarantinedBatch:
    path: Path
    size: int = 0  # bytes of the frames file (counted against the spool bound by its writer)
    records: int = 0

    @property
    def reason_path(self) -> Path:
        return self.path.with_name(self.path.name[: -len(QUARANTINE_SUFFIX)] + REASON_SUFFIX)

    def refusal(self) -> Refusal:
        """The stored reason; a missing or unreadable sidecar gives an unknown reason (the frames still count)."""
        try:
            meta = json.loads(self.reason_path.read_text())
            return Refusal(http_status=meta.get("http_status"), message=str(meta.get("message", "")),
                           time=float(meta.get("time", 0.0)), records=int(meta.get("records", 0)))
        except (OSError, ValueError, TypeError, AttributeError):
            return Refusal(http_status=None, message="(reason file missing)", time=0.0,
                           records=len(self.payloads()))

    def payloads(self) -> list[bytes]:
        try:
            return read_frames(self.path, 0, max_events=1 << 30, max_bytes=1 << 40).payloads
        except FileNotFoundError:
            return []

    def rewrite(self, payloads: list[bytes], refusal: Refusal) -> None:
        """Replace the content (what is still refused) and the reason, each atomically."""
        data = b"".join(encode_frame(p) for p in payloads)
        _write_atomically(self.path, data)
        _write_atomically(self.reason_path, _reason_bytes(replace(refusal, records=len(payloads))))
        self.size, self.records = len(data), len(payloads)

    def delete(self) -> None:
        for p in (self.path, self.reason_path):
            p.unlink(missing_ok=True)


def quarantine_batch(run_dir: Path, stem: str, offset: int, payloads: list[bytes],
                     refusal: Refusal) -> QuarantinedBatch:
    """Write ``payloads`` (the records at ``offset`` of spool segment ``stem``) to the quarantine; raises OSError."""
    batch = QuarantinedBatch(run_dir / f"{stem}.{offset:012d}{QUARANTINE_SUFFIX}")
    batch.rewrite(payloads, refusal)
    return batch


def quarantined_in(directory: Path, proc_id: str | None = None) -> list[QuarantinedBatch]:
    """Quarantine files in ``directory`` (of one process, or of all), oldest first."""
    try:
        names = sorted(p.name for p in directory.iterdir())
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        match = _QUARANTINE_RE.match(name)
        if match and (proc_id is None or match.group("proc") == proc_id):
            path = directory / name
            found.append(QuarantinedBatch(path, size=path.stat().st_size if path.exists() else 0))
    return found


def _reason_bytes(refusal: Refusal) -> bytes:
    return json.dumps({"http_status": refusal.http_status, "reason": refusal.reason, "message": refusal.message,
                       "time": refusal.time, "records": refusal.records, "advice": advice(refusal.http_status)},
                      indent=1).encode()


def _write_atomically(path: Path, data: bytes) -> None:
    staging = path.with_name(f".{path.name}.staging")
    fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        written = 0
        while written < len(data):
            written += os.write(fd, data[written:])
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(staging, path)
