"""Append-only spool on local disk: every record is written here before it is sent.

Layout, one directory per run (``<spool_dir>/<run dir>/``) and per process ``<pid>``::

    <proc_id>.lock              flock()ed by the live process; JSON metadata (pid, host, rank)
    <proc_id>.<seg>.spool       frames: u32 length, u32 CRC32(payload), payload (one JSON record)
    <proc_id>.<seg>.ack         u64 offset of the first unacknowledged byte, u32 CRC32 of it
    <proc_id>.<seg>.<offset>.quarantine        frames of one batch the collector refused for good
    <proc_id>.<seg>.<offset>.quarantine.json   why: HTTP status, the collector's message, time, records

Records before the ack offset were acknowledged by the collector, or moved to the quarantine (written and
fsynced there first); the rest is replayed, by the next process of the same run or by ``goodput sync``.
Quarantined batches (:mod:`ingest_client.worker.quarantine`) are resent by ``goodput sync`` and deleted once the
collector accepts them; the next process of the run tries them once (until one is refused again), its own
process never (the cause, a token or a version, does not change while it runs). A corrupt frame is skipped and
counted, and the frames after it are read (:mod:`ingest_client.worker.frames`); a torn tail (a write cut short) ends the
segment. Segments rotate at a quarter of the
per-process bound; the bound counts the process's segments and quarantine together: past it, the oldest
quarantined batch is deleted first (it is the oldest data, already refused once), then the oldest segment, and
their unsent records are counted as ``spool_dropped_events``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ingest_client.common.events import Record
from ingest_client.worker.frames import FRAME_HEADER, MAX_FRAME_BYTES, FrameBatch, encode_frame, read_frames
from ingest_client.worker.quarantine import QuarantinedBatch, Refusal, proc_of, quarantine_batch, quarantined_in

__all__ = ["FRAME_HEADER", "MAX_FRAME_BYTES", "FrameBatch", "encode_frame", "read_frames"]  # re-exported

logger = logging.getLogger(__name__)

ACK_FORMAT = struct.Struct("<QI")
SEGMENT_SUFFIX = ".spool"
ACK_SUFFIX = ".ack"
LOCK_SUFFIX = ".lock"
_SEGMENT_RE = re.compile(r"^(?P<proc>[A-Za-z0-9_-]+)\.(?P<seg>\d{6})\.spool$")


def run_dir_name(run_id: str) -> str:
    """A file-system-safe, collision-free directory name for a run id."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", run_id)[:100]
    digest = hashlib.sha1(run_id.encode()).hexdigest()[:8]
    return f"{safe}-{digest}"


def encode_record(record: Record) -> bytes:
    return json.dumps(record, separators=(",", ":"), allow_nan=False).encode()


def read_ack(path: Path) -> int:
    """The acknowledged offset stored in ``path``; 0 when missing or torn (replay is idempotent)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return 0
    if len(data) != ACK_FORMAT.size:
        return 0
    offset, crc = ACK_FORMAT.unpack(data)
    return offset if zlib.crc32(data[:8]) == crc else 0


def write_ack(path: Path, offset: int) -> None:
    head = struct.pack("<Q", offset)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.pwrite(fd, head + struct.pack("<I", zlib.crc32(head)), 0)
    finally:
        os.close(fd)


@dataclass(slots=True)
class Segment:
    """One spool file and its ack offset. ``size`` is the end of the data that may be sent."""

    path: Path
    ack_offset: int
    size: int
    closed: bool
    records_written: int = 0
    records_acked: int = 0
    torn_bytes: int = 0  # skipped: bad frames, and a torn tail
    corrupt_frames: int = 0  # bad frames skipped (frames.read_frames), the tail not counted

    @property
    def ack_path(self) -> Path:
        return self.path.with_suffix(ACK_SUFFIX)

    @property
    def has_pending(self) -> bool:
        return self.ack_offset < self.size

    @property
    def is_done(self) -> bool:
        return self.closed and self.ack_offset >= self.size

    def read_batch(self, *, max_events: int, max_bytes: int, until: int | None = None) -> FrameBatch:
        """The frames from the ack offset on, up to the limits, and not past ``until`` (an offset) when given."""
        stop_at = self.size if until is None else min(self.size, until)
        batch = read_frames(self.path, self.ack_offset, max_events=max_events, max_bytes=max_bytes, stop_at=stop_at)
        self.corrupt_frames += batch.corrupt_frames
        self.torn_bytes += batch.skipped_bytes
        if batch.torn or (not batch.payloads and batch.end_offset < stop_at):
            # Everything after the last good frame is unreadable: end the segment there.
            self.torn_bytes += self.size - batch.end_offset
            self.size = batch.end_offset
            self.closed = True
        if not batch.payloads and batch.end_offset > self.ack_offset:  # only bad frames: nothing to send for them
            self.record_ack(batch.end_offset, 0)
        return batch

    def record_ack(self, end_offset: int, n_records: int) -> None:
        self.ack_offset = end_offset
        self.records_acked += n_records
        write_ack(self.ack_path, end_offset)

    def delete(self) -> None:
        for p in (self.path, self.ack_path):
            p.unlink(missing_ok=True)


def try_lock(lock_path: Path, *, create: bool) -> int | None:
    """flock() ``lock_path`` exclusively without waiting; the fd, or None if another process holds it."""
    flags = os.O_RDWR | (os.O_CREAT if create else 0)
    try:
        fd = os.open(lock_path, flags, 0o600)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        raise
    return fd


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class SpoolWriter:
    """This process's spool: append records, rotate segments, enforce the byte bound, track acks."""

    def __init__(self, run_dir: Path, proc_id: str, *, max_bytes: int, metadata: dict[str, object]) -> None:
        run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.run_dir = run_dir
        self.proc_id = proc_id
        self.max_bytes = max_bytes
        self.segment_max_bytes = max(16 * 1024, max_bytes // 4)
        self.lock_path = run_dir / f"{proc_id}{LOCK_SUFFIX}"
        # The lock file appears under its name already flock()ed and filled in (rename is atomic): a process of
        # the same run starting at the same moment must never see it unlocked, take this live process for a
        # dead one and replay (or delete) its spool.
        staging = run_dir / f".{proc_id}.lock-staging"
        lock_fd = try_lock(staging, create=True)
        if lock_fd is None:  # impossible for a fresh uuid, unless the file system lies
            raise OSError(f"spool lock {staging} is held by another process")
        self._lock_fd: int | None = lock_fd
        os.ftruncate(lock_fd, 0)
        os.write(lock_fd, json.dumps(metadata).encode())
        os.rename(staging, self.lock_path)
        self.segments: list[Segment] = []
        self.quarantined: list[QuarantinedBatch] = []  # this process's, oldest first
        self._fd: int | None = None
        self._seg_no = 0
        self._dirty = False
        self.dropped_records = 0  # unacknowledged records deleted to respect max_bytes
        self._open_segment()

    @property
    def total_bytes(self) -> int:
        return sum(s.size for s in self.segments) + sum(q.size for q in self.quarantined)

    def _open_segment(self) -> None:
        self._seg_no += 1
        path = self.run_dir / f"{self.proc_id}.{self._seg_no:06d}{SEGMENT_SUFFIX}"
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.segments.append(Segment(path=path, ack_offset=0, size=0, closed=False))

    def _close_current(self) -> None:
        if self._fd is not None:
            if self._dirty:
                os.fsync(self._fd)
                self._dirty = False
            os.close(self._fd)
            self._fd = None
        if self.segments:
            self.segments[-1].closed = True

    def append(self, payloads: Iterable[bytes]) -> None:
        """Frame and write encoded records (one write per call); rotate and trim as needed."""
        frames = [encode_frame(p) for p in payloads]
        if not frames or self._fd is None:
            return
        current = self.segments[-1]
        if current.size > 0 and current.size + sum(map(len, frames)) > self.segment_max_bytes:
            self._close_current()
            self._open_segment()
            current = self.segments[-1]
        data = b"".join(frames)
        assert self._fd is not None
        written = 0
        try:
            while written < len(data):
                written += os.write(self._fd, data[written:])
        except OSError:
            # Disk full mid-write: cut the partial frames off again, or every later frame of this segment would
            # sit behind a torn one and never be read (the caller counts these records as dropped).
            try:
                os.ftruncate(self._fd, current.size)
            except OSError:  # cannot even truncate: start a fresh segment for what comes next
                current.size += written
                self._close_current()
                self._open_segment()
            raise
        current.size += len(data)
        current.records_written += len(frames)
        self._dirty = True
        self._trim()

    def quarantine(self, segment: Segment, offset: int, payloads: list[bytes], refusal: Refusal) -> None:
        """Move refused records (at ``offset`` of ``segment``) to the quarantine; raises OSError (then the
        caller must not acknowledge them)."""
        self.quarantined.append(quarantine_batch(self.run_dir, segment.path.stem, offset, payloads, refusal))
        self._trim()

    def _trim(self) -> None:
        total = self.total_bytes
        while total > self.max_bytes and self.quarantined:
            oldest_q = self.quarantined.pop(0)
            self.dropped_records += oldest_q.records
            total -= oldest_q.size
            oldest_q.delete()
        while total > self.max_bytes and len(self.segments) > 1:
            oldest = self.segments.pop(0)
            self.dropped_records += max(0, oldest.records_written - oldest.records_acked)
            total -= oldest.size
            oldest.delete()

    def unsynced_fd(self) -> int | None:
        """A duplicate of the current segment's descriptor when something was written since the last call, for
        the caller to fsync and close (:func:`fsync_and_close`) after letting go of the spool lock: a disk that
        takes seconds to sync then holds up neither the flusher's appends nor a durable write."""
        if self._fd is None or not self._dirty:
            return None
        self._dirty = False
        return os.dup(self._fd)

    def record_ack(self, segment: Segment, end_offset: int, n_records: int) -> None:
        if segment not in self.segments:  # trimmed (deleted) while its batch was being sent: no ack file to write
            return
        segment.record_ack(end_offset, n_records)
        if segment.is_done and segment in self.segments and segment is not self.segments[-1]:
            self.segments.remove(segment)
            segment.delete()

    def close(self) -> None:
        """Close files; delete them when everything was acknowledged; release the lock."""
        self._close_current()
        if all(s.is_done for s in self.segments):
            for s in self.segments:
                s.delete()
            self.segments.clear()
            self.lock_path.unlink(missing_ok=True)
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock: replayable by the next process
            self._lock_fd = None

    def forget_after_fork(self) -> None:
        """In a forked child: close inherited fds without unlocking or writing anything."""
        for fd in (self._fd, self._lock_fd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._fd = None
        self._lock_fd = None


def fsync_and_close(fd: int) -> None:
    """fsync(2) a descriptor from :meth:`SpoolWriter.unsynced_fd` and close it; raises OSError (EIO: the disk)."""
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(slots=True)
class OrphanSpool:
    """Files of a process that is no longer alive, locked by us while we replay them."""

    lock_path: Path
    lock_fd: int | None
    segments: list[Segment] = field(default_factory=list)
    quarantined: list[QuarantinedBatch] = field(default_factory=list)

    @property
    def has_pending(self) -> bool:
        return any(s.has_pending for s in self.segments)

    def record_ack(self, segment: Segment, end_offset: int, n_records: int) -> None:
        segment.record_ack(end_offset, n_records)

    def quarantine(self, segment: Segment, offset: int, payloads: list[bytes], refusal: Refusal) -> None:
        """As :meth:`SpoolWriter.quarantine`, for the dead process's records (its bound was enforced when written)."""
        self.quarantined.append(quarantine_batch(segment.path.parent, segment.path.stem, offset, payloads, refusal))

    def release(self) -> None:
        """Delete the files if all was acknowledged, then drop the lock."""
        if all(s.is_done for s in self.segments):
            for s in self.segments:
                s.delete()
            self.lock_path.unlink(missing_ok=True)
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None


def process_ids_in(directory: Path) -> dict[str, list[Path]]:
    """Map each process id found in ``directory`` to its segment files, oldest first."""
    found: dict[str, list[Path]] = {}
    try:
        entries = sorted(directory.iterdir())
    except FileNotFoundError:
        return found
    for entry in entries:
        match = _SEGMENT_RE.match(entry.name)
        if match:
            found.setdefault(match.group("proc"), []).append(entry)
        elif entry.name.endswith(LOCK_SUFFIX):
            found.setdefault(entry.name[: -len(LOCK_SUFFIX)], [])
        elif (proc := proc_of(entry)) is not None:  # a process whose only files left are quarantined batches
            found.setdefault(proc, [])
    return found


def claim_orphans(directory: Path, *, exclude: frozenset[str] = frozenset()) -> tuple[list[OrphanSpool], int]:
    """Lock the spools of dead processes in ``directory``; also return how many are still alive."""
    orphans: list[OrphanSpool] = []
    alive = 0
    for proc_id, paths in process_ids_in(directory).items():
        if proc_id in exclude:
            continue
        lock_path = directory / f"{proc_id}{LOCK_SUFFIX}"
        try:
            fd = try_lock(lock_path, create=True)
        except OSError as exc:  # no flock here (some network file systems): fall back to the pid
            if _lock_owner_alive(lock_path):
                alive += 1
                continue
            logger.debug("flock unavailable on %s (%s); pid is gone, replaying", lock_path, exc)
            fd = None
        else:
            if fd is None:  # the owner holds its lock: alive
                alive += 1
                continue
        orphan = OrphanSpool(lock_path=lock_path, lock_fd=fd)
        for path in paths:
            size = path.stat().st_size if path.exists() else 0
            ack = min(read_ack(path.with_suffix(ACK_SUFFIX)), size)
            orphan.segments.append(Segment(path=path, ack_offset=ack, size=size, closed=True))
        orphan.quarantined = quarantined_in(directory, proc_id)
        orphans.append(orphan)
    return orphans, alive


def _lock_owner_alive(lock_path: Path) -> bool:
    try:
        meta = json.loads(lock_path.read_text() or "{}")
    except (OSError, ValueError):
        return False
    pid = meta.get("pid")
    return isinstance(pid, int) and _pid_alive(pid)
