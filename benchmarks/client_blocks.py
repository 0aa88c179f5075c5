"""Should the client send its steps as column blocks? Wire bytes and CPU of today's compact records against blocks.

One rank's step series of a simulated run (jittered times, a straggler, failures: every float at full precision) is
cut into the records its client would send, `--steps-per-record` rows each (the flush interval times the step rate),
and `records per request` of them go in one request (the send interval over the flush interval), two ways:

- today: `RecordBuilder`'s compact `steps` records (their `comm` added as the client adds it), JSON as the spool
  writes them (`encode_record`), gzip level 5 over the request as `HttpTransport` sends it (bodies over 1 KiB).
- blocks: the same record without its arrays and with `block`, the record's columns as a column block
  (services.storage.column_codec's zlib format, encoded here with the standard library only, as the client would have
  to: `encode_block`) in base64, the request gzipped the same way. `raw block` is the block's bytes alone (a binary
  body would send those).

Printed per rank-step: wire bytes; the client's CPU to serialize and compress (the flusher thread's work; building
the records from rows is the same for both and shown once); the collector's CPU to inflate and parse (today:
`parse_batch`; blocks: inflating, `parse_batch` of the records cut to one row, for their own fields, then
base64 and `decode_blocks`); and what the collector spends encoding a block of BLOCK_STEPS rows when a rank enters
its next block (services.storage.step_columns), which a client block could spare only where it is that block.
Ratios are blocks over today, measured in the same run (best of --repeats).

    python -m benchmarks.client_blocks [--hours 1] [--ranks 4] [--repeats 3]
"""

from __future__ import annotations

import argparse
import base64
import gzip
import json
import math
import struct
import sys
import zlib
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from benchmarks._common import machine
from benchmarks.column_blocks import best, parsed
from ingest_client.common.events import ROW_STEP, Record, RecordBuilder, RecordContext
from ingest_client.transport.base import encode_batch
from ingest_client.transport.http import GZIP_MIN_BYTES
from ingest_client.worker.spool import encode_record
from services.analysis.step_blocks import BLOCK_STEPS
from services.collector.batch import parse_batch
from services.simulate import SimConfig
from services.storage.column_codec import ZLIB_FORMAT, decode_blocks, encode_step_rows
from services.storage.records import StepRows

_MASK = (1 << 64) - 1
_HEADER = struct.Struct("<BI")
_LEVEL = 6
_NAN = float("nan")
# (steps per record, records per request): one step a second flushed every 0.2 s and sent every second or every
# 10 s; faster steps; a record of a whole storage block; the client's largest record (MAX_ROWS_PER_RECORD)
SHAPES = ((1, 5), (1, 50), (8, 25), (BLOCK_STEPS, 4), (1000, 1))


# -- the column codec with the standard library only (what the client would run) --------------------------------

def encode_block(step: Sequence[int], start: Sequence[float], end: Sequence[float], loss: Sequence[float | None],
                 lr: Sequence[float | None], comm: Sequence[float | None]) -> bytes:
    """The columns as services.storage.column_codec.encode_step_rows encodes them, byte for byte (None = NaN)."""
    n = len(step)
    start_bits = _bits(start)
    words = [
        _zigzag_all(_delta(_delta([s & _MASK for s in step]))),
        _zigzag_all(_delta(_delta(start_bits))),
        _zigzag_all(_delta([(e - s) & _MASK for e, s in zip(_bits(end), start_bits, strict=True)])),
        _xor_previous(_bits(loss)),
        _xor_previous(_bits(lr)),
        _xor_previous(_bits(comm)),
    ]
    columns = []
    for column in words:
        packed = array("Q", column)
        if sys.byteorder == "big":
            packed.byteswap()
        columns.append(packed.tobytes())
    raw = b"".join(columns)
    shuffled = b"".join(raw[k::8] for k in range(8))  # byte k of every word together, column after column
    return _HEADER.pack(ZLIB_FORMAT, n) + zlib.compress(shuffled, _LEVEL)


def _bits(values: Sequence[float | None]) -> list[int]:
    n = len(values)
    return list(struct.unpack(f"<{n}Q", struct.pack(f"<{n}d", *(_NAN if v is None else v for v in values))))


def _delta(words: list[int]) -> list[int]:
    return words[:1] + [(b - a) & _MASK for a, b in pairwise(words)]


def _zigzag_all(words: list[int]) -> list[int]:
    return [((w << 1) & _MASK) ^ (_MASK if w >> 63 else 0) for w in words]


def _xor_previous(words: list[int]) -> list[int]:
    return words[:1] + [a ^ b for a, b in pairwise(words)]


# -- the two requests ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Series:
    """One rank's steps in the order its client recorded them."""

    rank: int
    rows: StepRows


def series(config: SimConfig, ranks: int) -> list[Series]:
    parts: dict[int, list[StepRows]] = {}
    for record in parsed(config):
        if record.step_rows is not None and record.rank is not None and record.rank < ranks:
            parts.setdefault(record.rank, []).append(record.step_rows)
    return [Series(rank, StepRows(*(np.concatenate([getattr(p, c) for p in rows]) for c in _COLUMNS)))
            for rank, rows in sorted(parts.items())]


_COLUMNS = ("step", "start", "end", "loss", "lr", "comm")


def _floats(values: np.ndarray) -> list[float | None]:
    return [None if math.isnan(v) else v for v in values.tolist()]


def client_records(s: Series, steps_per_record: int) -> list[Record]:
    """The rank's compact records, built by the client's RecordBuilder from hot-path rows, `comm` as it adds it."""
    builder = RecordBuilder(RecordContext(run_id="client-blocks", attempt=0, rank=s.rank), f"r{s.rank}")
    r = s.rows
    step, start, end, loss, lr, comm = (r.step.tolist(), r.start.tolist(), r.end.tolist(), _floats(r.loss),
                                        _floats(r.lr), _floats(r.comm))
    out: list[Record] = []
    for i in range(0, len(step), steps_per_record):
        rows = [(ROW_STEP, *values) for values in zip(step[i:i + steps_per_record], start[i:i + steps_per_record],
                                                      end[i:i + steps_per_record], loss[i:i + steps_per_record],
                                                      lr[i:i + steps_per_record], strict=True)]
        for record in builder.build(rows):
            record["comm"] = comm[i:i + len(record["step"])]
            out.append(record)
    return out


def record_block(record: Record) -> bytes:
    missing = [None] * len(record["step"])
    return encode_block(record["step"], record["start"], record["end"], record.get("loss", missing),
                        record.get("lr", missing), record["comm"])


def block_record(record: Record) -> Record:
    envelope = {k: v for k, v in record.items() if not isinstance(v, list)}
    envelope["block"] = base64.b64encode(record_block(record)).decode()
    return envelope


def _gzip_as_sent(body: bytes) -> bytes:
    return gzip.compress(body, compresslevel=5) if len(body) > GZIP_MIN_BYTES else body


def send_today(records: Sequence[Record]) -> bytes:
    return _gzip_as_sent(encode_batch([encode_record(r) for r in records]))


def send_blocks(records: Sequence[Record]) -> bytes:
    return _gzip_as_sent(encode_batch([encode_record(block_record(r)) for r in records]))


def _inflate(body: bytes) -> bytes:
    return gzip.decompress(body) if body[:2] == b"\x1f\x8b" else body


def collect_today(body: bytes) -> object:
    return parse_batch(_inflate(body), max_events=10**6, max_rows=10**8)


@dataclass(frozen=True, slots=True)
class BlockRequest:
    """What the collector would take out of a blocks request: the body as sent, the records' own fields as a batch
    of one-row records (validated as the collector validates a record) and the blocks in base64."""

    body: bytes
    fields: bytes
    blocks: list[str]


def block_request(body: bytes) -> BlockRequest:
    events = json.loads(_inflate(body))["events"]
    fields = [{**{k: v for k, v in e.items() if k != "block"}, "step": [0], "start": [e["time"]], "end": [e["time"]]}
              for e in events]
    return BlockRequest(body, json.dumps({"events": fields}).encode(), [e["block"] for e in events])


def collect_blocks(request: BlockRequest) -> object:
    _inflate(request.body)
    return parse_batch(request.fields, max_events=10**6, max_rows=10**8), decode_blocks(
        [base64.b64decode(b) for b in request.blocks])


# -- the measurement ----------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Shape:
    steps_per_record: int
    records_per_request: int
    steps: int
    build_us: float
    today_bytes: float
    blocks_bytes: float
    raw_block_bytes: float
    today_client_us: float
    blocks_client_us: float
    today_collector_us: float
    blocks_collector_us: float


def _timed(fn: Callable[[], object], steps: int, repeats: int) -> float:
    return best(fn, repeats) / steps * 1e6


def measure(all_series: Sequence[Series], steps_per_record: int, records_per_request: int, repeats: int) -> Shape:
    per_rank = [client_records(s, steps_per_record) for s in all_series]
    requests = [records[i:i + records_per_request] for records in per_rank
                for i in range(0, len(records), records_per_request)]
    steps = sum(len(r["step"]) for request in requests for r in request)
    today = [send_today(request) for request in requests]
    blocks = [send_blocks(request) for request in requests]
    block_requests = [block_request(b) for b in blocks]
    raw = sum(len(record_block(r)) for request in requests for r in request)
    return Shape(
        steps_per_record, records_per_request, steps,
        build_us=_timed(lambda: [client_records(s, steps_per_record) for s in all_series], steps, repeats),
        today_bytes=sum(map(len, today)) / steps, blocks_bytes=sum(map(len, blocks)) / steps,
        raw_block_bytes=raw / steps,
        today_client_us=_timed(lambda: [send_today(r) for r in requests], steps, repeats),
        blocks_client_us=_timed(lambda: [send_blocks(r) for r in requests], steps, repeats),
        today_collector_us=_timed(lambda: [collect_today(b) for b in today], steps, repeats),
        blocks_collector_us=_timed(lambda: [collect_blocks(r) for r in block_requests], steps, repeats),
    )


def block_entry_encode_us(all_series: Sequence[Series], repeats: int) -> float:
    """The collector's encode per step when a rank's rows move into BLOCK_STEPS-step blocks."""
    parts = []
    for s in all_series:
        block = s.rows.step // BLOCK_STEPS
        for b in np.unique(block):
            parts.append(StepRows(*(getattr(s.rows, c)[block == b] for c in _COLUMNS)))
    return _timed(lambda: [encode_step_rows(p) for p in parts], sum(len(p.step) for p in parts), repeats)


def verdict(shape: Shape, saved_us: float) -> str:
    """Blocks pay where they save a fifth of the bytes and of the collector's CPU without costing the flusher more
    than half again; records of whole storage blocks are credited the block-entry encode they would spare."""
    aligned = shape.steps_per_record % BLOCK_STEPS == 0
    collector = shape.blocks_collector_us - (saved_us if aligned else 0.0)
    wins = []
    if shape.blocks_bytes < 0.8 * shape.today_bytes:
        wins.append("bytes")
    if collector < 0.8 * shape.today_collector_us:
        wins.append("collector CPU")
    client_ok = shape.blocks_client_us <= 1.5 * shape.today_client_us
    if len(wins) == 2 and client_ok:
        return "pays, if each record is one storage block" if aligned else "pays"
    if wins and client_ok:
        return f"pays on {' and '.join(wins)} only"
    if not wins:
        return "does not pay"
    return f"{' and '.join(wins)} saved, client CPU x{shape.blocks_client_us / shape.today_client_us:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=1.0, help="hours of steps of the simulated run")
    parser.add_argument("--ranks", type=int, default=4, help="ranks whose series are measured")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    config = SimConfig(run_id="client-blocks", ranks=max(args.ranks, 2), hours=args.hours, step_s=1.0,
                       mtbf_s=1800.0, straggler_rank=1, jitter=0.05)
    all_series = series(config, args.ranks)
    saved = block_entry_encode_us(all_series, args.repeats)
    print(f"client blocks: {machine()}; {sum(len(s.rows.step) for s in all_series):,} steps of {len(all_series)} "
          f"ranks ({args.hours:g} h, jittered, a straggler, failures); per rank-step, best of {args.repeats}")
    print("steps/rec rec/req | bytes today  blocks (raw)  ratio | client us: build  today  blocks  ratio | "
          "collector us: today  blocks  ratio | verdict")
    for steps_per_record, records_per_request in SHAPES:
        s = measure(all_series, steps_per_record, records_per_request, args.repeats)
        print(f"{steps_per_record:9} {records_per_request:7} | {s.today_bytes:11.1f} {s.blocks_bytes:7.1f} "
              f"({s.raw_block_bytes:5.1f}) {s.blocks_bytes / s.today_bytes:6.2f} | {s.build_us:16.2f} "
              f"{s.today_client_us:6.2f} {s.blocks_client_us:7.2f} {s.blocks_client_us / s.today_client_us:6.2f} | "
              f"{s.today_collector_us:19.2f} {s.blocks_collector_us:7.2f} "
              f"{s.blocks_collector_us / s.today_collector_us:6.2f} | {verdict(s, saved)}")
    print(f"collector encode at block entry ({BLOCK_STEPS} steps per block), spared only where a client block is "
          f"exactly a storage block: {saved:.2f} us per step")


if __name__ == "__main__":
    main()
