"""The spool after a failed write (disk full mid-frame): later records are still readable, none is lost."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from ingest_client.worker.spool import SpoolWriter


def test_a_write_cut_short_by_a_full_disk_leaves_no_torn_frame_behind(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    writer = SpoolWriter(tmp_path, "proc", max_bytes=1 << 20, metadata={"pid": os.getpid()})
    writer.append([b'{"n":1}'])
    real_write = os.write
    calls = {"n": 0}

    def half_then_enospc(fd: int, data: bytes) -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            return real_write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("ingest_client.worker.spool.os.write", half_then_enospc)
    with pytest.raises(OSError):
        writer.append([b'{"n":2}', b'{"n":3}'])
    monkeypatch.setattr("ingest_client.worker.spool.os.write", real_write)
    writer.append([b'{"n":4}'])
    segment = writer.segments[-1]
    batch = segment.read_batch(max_events=100, max_bytes=1 << 20)
    assert batch.payloads == [b'{"n":1}', b'{"n":4}']
    assert not batch.torn and segment.torn_bytes == 0
    writer.close()
