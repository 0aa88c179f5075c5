from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ingest_client.tools.sync import sync_directory
from ingest_client.transport import InMemoryTransport
from ingest_client.worker.quarantine import Refusal, quarantined_in
from ingest_client.worker.spool import (
    FRAME_HEADER,
    SpoolWriter,
    claim_orphans,
    encode_frame,
    read_ack,
    read_frames,
    write_ack,
)


def _payloads(n: int) -> list[bytes]:
    return [json.dumps({"n": i}).encode() for i in range(n)]


def _write(path: Path, payloads: list[bytes]) -> None:
    path.write_bytes(b"".join(encode_frame(p) for p in payloads))


def test_frames_round_trip_with_offsets(tmp_path: Path) -> None:
    path = tmp_path / "a.000001.spool"
    _write(path, _payloads(5))
    batch = read_frames(path, 0, max_events=100, max_bytes=10**6)
    assert [json.loads(p)["n"] for p in batch.payloads] == [0, 1, 2, 3, 4]
    assert batch.end_offset == path.stat().st_size and not batch.torn
    first_two = read_frames(path, 0, max_events=2, max_bytes=10**6)
    rest = read_frames(path, first_two.end_offset, max_events=100, max_bytes=10**6)
    assert [json.loads(p)["n"] for p in rest.payloads] == [2, 3, 4]


def test_torn_last_frame_is_skipped_and_earlier_frames_kept(tmp_path: Path) -> None:
    path = tmp_path / "a.000001.spool"
    _write(path, _payloads(4))
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 3)  # the writer died in the middle of the last frame
    batch = read_frames(path, 0, max_events=100, max_bytes=10**6)
    assert [json.loads(p)["n"] for p in batch.payloads] == [0, 1, 2]
    assert batch.torn


def test_crc_detects_a_corrupt_last_frame(tmp_path: Path) -> None:
    path = tmp_path / "a.000001.spool"
    _write(path, _payloads(3))
    data = bytearray(path.read_bytes())
    data[-2] ^= 0xFF  # flip a byte inside the last payload: the length still fits
    path.write_bytes(bytes(data))
    batch = read_frames(path, 0, max_events=100, max_bytes=10**6)
    assert [json.loads(p)["n"] for p in batch.payloads] == [0, 1]
    assert batch.corrupt_frames == 1 and batch.end_offset == len(data) and not batch.torn


def test_garbage_header_length_is_treated_as_torn(tmp_path: Path) -> None:
    path = tmp_path / "a.000001.spool"
    _write(path, _payloads(2))
    with open(path, "ab") as f:
        f.write(FRAME_HEADER.pack(2**31, 0) + b"xx")
    batch = read_frames(path, 0, max_events=100, max_bytes=10**6)
    assert len(batch.payloads) == 2 and batch.torn


def _frame_offsets(path: Path) -> list[int]:
    data, offsets, pos = path.read_bytes(), [], 0
    while pos < len(data):
        offsets.append(pos)
        pos += FRAME_HEADER.size + FRAME_HEADER.unpack_from(data, pos)[0]
    return offsets


def _records(n: int) -> list[bytes]:
    return [json.dumps({"event_id": f"p-{i}", "kind": "heartbeat", "nested": {"x": [i]}},
                       separators=(",", ":")).encode() for i in range(n)]


def test_a_flipped_payload_byte_costs_its_frame_and_no_other(tmp_path: Path) -> None:
    path = tmp_path / "a.000001.spool"
    _write(path, _records(162))
    data = bytearray(path.read_bytes())
    data[_frame_offsets(path)[80] + FRAME_HEADER.size + 5] ^= 0x01  # frame 81 of 162
    path.write_bytes(bytes(data))
    batch = read_frames(path, 0, max_events=10**6, max_bytes=10**9)
    assert [json.loads(p)["event_id"] for p in batch.payloads] == [f"p-{i}" for i in range(162) if i != 80]
    assert batch.corrupt_frames == 1 and not batch.torn and batch.end_offset == len(data)
    assert batch.skipped_bytes == _frame_offsets(tmp_path / "a.000001.spool")[81] - _frame_offsets(path)[80]


@pytest.mark.parametrize("field", ["length", "crc and length", "two frames"])
def test_a_corrupt_length_resynchronises_on_the_next_good_frame(field: str, tmp_path: Path) -> None:
    path = tmp_path / "a.000001.spool"
    _write(path, _records(162))
    offsets = _frame_offsets(path)
    data = bytearray(path.read_bytes())
    at = offsets[80]
    if field == "length":
        data[at + 1] ^= 0x10  # 4 KiB more: the frame seems to swallow the next ones
    elif field == "crc and length":
        data[at:at + 8] = FRAME_HEADER.pack(3, 0)  # a length that lands inside the payload
    else:  # frames 81 and 82 overwritten by bytes with many a record's start in them
        data[at:offsets[82]] = ((bytes(range(256)) + b'{"') * 10)[:offsets[82] - at]
    path.write_bytes(bytes(data))
    batch = read_frames(path, 0, max_events=10**6, max_bytes=10**9)
    lost = {80, 81} if field == "two frames" else {80}
    assert [json.loads(p)["event_id"] for p in batch.payloads] == [f"p-{i}" for i in range(162) if i not in lost]
    assert batch.corrupt_frames == 1 and not batch.torn and batch.end_offset == len(data)


def test_garbage_between_frames_is_never_read_as_records(tmp_path: Path) -> None:
    """After a bad length, bytes that look like a frame (a header, then a record's first bytes) but whose CRC or
    JSON does not hold are skipped, and the frames around them kept."""
    import random
    import zlib

    rng = random.Random(31)
    good = _records(20)
    fake = b'{"event_id":"fake","kind":"heartbeat"'  # no closing brace: not a JSON object
    garbage = [FRAME_HEADER.pack(2**30, 0),  # a length past the end: the reader looks for the next good frame
               FRAME_HEADER.pack(len(fake), zlib.crc32(fake)) + fake,  # its CRC holds, its JSON does not
               FRAME_HEADER.pack(10, 12345) + b'{"a":"b"}x',  # wrong CRC
               bytes(rng.randrange(256) for _ in range(5000)).replace(b"}", b"{\"")]
    path = tmp_path / "a.000001.spool"
    path.write_bytes(b"".join(encode_frame(p) for p in good[:10]) + b"".join(garbage)
                     + b"".join(encode_frame(p) for p in good[10:]))
    batch = read_frames(path, 0, max_events=10**6, max_bytes=10**9)
    assert batch.payloads == good and batch.corrupt_frames == 1 and not batch.torn


def test_a_segment_of_nothing_but_bad_frames_is_skipped_whole_and_done(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    path = run_dir / "deadproc.000001.spool"
    _write(path, _records(3))
    data = bytearray(path.read_bytes())
    for offset in _frame_offsets(path):
        data[offset + FRAME_HEADER.size + 3] ^= 0x01
    path.write_bytes(bytes(data))
    transport = InMemoryTransport()
    result = sync_directory(tmp_path, transport=transport)
    assert transport.events == [] and result.sent == 0 and result.torn_bytes == len(data)
    assert not path.exists(), "a spool with nothing left to send is deleted"


def test_ack_file_round_trips_and_a_torn_ack_means_replay_from_zero(tmp_path: Path) -> None:
    ack = tmp_path / "a.000001.ack"
    assert read_ack(ack) == 0
    write_ack(ack, 12345)
    assert read_ack(ack) == 12345
    ack.write_bytes(ack.read_bytes()[:-1] + b"\x00")
    assert read_ack(ack) == 0


def test_sync_replays_a_torn_spool_up_to_the_last_good_frame(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    records = [json.dumps({"event_id": f"p-{i}", "kind": "heartbeat"}).encode() for i in range(6)]
    path = run_dir / "deadproc.000001.spool"
    _write(path, records)
    with open(path, "ab") as f:
        f.write(encode_frame(b'{"event_id":"p-torn"}')[:-4])
    transport = InMemoryTransport()
    result = sync_directory(tmp_path, transport=transport)
    assert [e["event_id"] for e in transport.events] == [f"p-{i}" for i in range(6)]
    assert result.sent == 6 and result.torn_bytes > 0 and result.failed == 0
    assert not path.exists(), "a fully replayed spool is deleted"


def test_spool_is_bounded_and_drops_oldest_segments_with_a_count(tmp_path: Path) -> None:
    writer = SpoolWriter(tmp_path, "proc", max_bytes=64 * 1024, metadata={"pid": os.getpid()})
    payload = b"x" * 1000
    for _ in range(300):  # ~300 KB into a 64 KB spool
        writer.append([payload])
    assert writer.total_bytes <= 64 * 1024
    on_disk = sum(p.stat().st_size for p in tmp_path.glob("*.spool"))
    assert on_disk == writer.total_bytes
    kept = sum(s.records_written for s in writer.segments)
    assert writer.dropped_records + kept == 300
    assert writer.dropped_records > 200
    writer.close()


def test_live_process_spool_is_not_claimed_but_a_dead_one_is(tmp_path: Path) -> None:
    live = SpoolWriter(tmp_path, "live", max_bytes=10**6, metadata={"pid": os.getpid()})
    live.append([b'{"a":1}'])
    dead = SpoolWriter(tmp_path, "dead", max_bytes=10**6, metadata={"pid": 0})
    dead.append([b'{"a":2}'])
    dead.close()  # releases its lock, leaves unacknowledged data
    orphans, alive = claim_orphans(tmp_path)
    assert alive == 1
    assert [o.lock_path.name for o in orphans] == ["dead.lock"]
    again, alive_again = claim_orphans(tmp_path)
    assert again == [] and alive_again == 2, "a claimed spool is locked against other replayers"
    for o in orphans:
        o.release()
    live.close()


def test_acknowledged_closed_segments_are_deleted(tmp_path: Path) -> None:
    writer = SpoolWriter(tmp_path, "p", max_bytes=64 * 1024, metadata={})
    for _ in range(40):
        writer.append([b"y" * 1000])
    assert len(writer.segments) >= 2
    first = writer.segments[0]
    writer.record_ack(first, first.size, first.records_written)
    assert not first.path.exists() and first not in writer.segments
    last = writer.segments[-1]
    for seg in list(writer.segments):
        writer.record_ack(seg, seg.size, seg.records_written)
    writer.close()
    assert not last.path.exists() and not list(tmp_path.iterdir()), "all acknowledged: nothing left"


def test_an_ack_for_a_segment_trimmed_while_it_was_being_sent_writes_no_ack_file(tmp_path: Path) -> None:
    writer = SpoolWriter(tmp_path, "proc", max_bytes=64 * 1024, metadata={"pid": os.getpid()})
    writer.append([b"x" * 1000])
    sending = writer.segments[0]
    batch = sending.read_batch(max_events=10, max_bytes=1 << 20)
    for _ in range(300):  # another thread's durable writes rotate and trim the spool meanwhile
        writer.append([b"y" * 1000])
    assert sending not in writer.segments and not sending.path.exists()
    writer.record_ack(sending, batch.end_offset, len(batch.payloads))
    assert not sending.ack_path.exists()
    writer.close()


def _refusal(n: int, status: int = 401) -> Refusal:
    return Refusal(http_status=status, message="token revoked", time=1_700_000_000.0, records=n)


def test_the_quarantine_counts_against_the_spool_bound_and_its_oldest_batches_go_first(tmp_path: Path) -> None:
    writer = SpoolWriter(tmp_path, "proc", max_bytes=64 * 1024, metadata={"pid": os.getpid()})
    payload = b"q" * 1000
    for _ in range(120):  # every batch of 10 records refused: ~120 KB of quarantine into a 64 KB bound
        writer.append([payload] * 10)
        segment = writer.segments[-1]
        start = segment.ack_offset
        batch = segment.read_batch(max_events=10, max_bytes=10**6)
        writer.quarantine(segment, start, batch.payloads, _refusal(10))
        writer.record_ack(segment, batch.end_offset, 10)
    on_disk = sum(p.stat().st_size for p in tmp_path.iterdir() if p.suffix in (".spool", ".quarantine"))
    assert on_disk == writer.total_bytes <= 64 * 1024
    kept = quarantined_in(tmp_path)
    assert [q.path for q in kept] == [q.path for q in writer.quarantined], "the newest are kept"
    assert writer.dropped_records == 1200 - 10 * len(kept) and writer.dropped_records > 500
    writer.close()


def test_a_process_whose_only_files_left_are_quarantined_is_claimed_and_its_batches_are_found(
    tmp_path: Path,
) -> None:
    writer = SpoolWriter(tmp_path, "dead", max_bytes=10**6, metadata={"pid": 0})
    writer.append(_payloads(3))
    segment = writer.segments[0]
    batch = segment.read_batch(max_events=10, max_bytes=10**6)
    writer.quarantine(segment, 0, batch.payloads, _refusal(3, 422))
    writer.record_ack(segment, batch.end_offset, 3)
    writer.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "dead.000001.000000000000.quarantine", "dead.000001.000000000000.quarantine.json"]
    orphans, alive = claim_orphans(tmp_path)
    assert alive == 0 and len(orphans) == 1 and not orphans[0].segments
    (found,) = orphans[0].quarantined
    assert [json.loads(p)["n"] for p in found.payloads()] == [0, 1, 2]
    assert found.refusal().http_status == 422 and found.refusal().records == 3
    assert json.loads(found.reason_path.read_text())["message"] == "token revoked"
    orphans[0].release()
