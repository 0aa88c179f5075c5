"""Bytes and CPU of the column-block encoding (services.storage.column_codec) on the simulator's runs.

Each run is simulated and parsed as the collector parses it (`parse_batch`: compact `steps` records), then its step
rows are encoded two ways: one block per (attempt, rank, block of BLOCK_STEPS steps), the rows in the order they
arrived (what a block row of the storage of record holds), and one block per record and block, as received (what a
writer that appends each record's rows as they come would store). Printed: encoded bytes per rank-step (the
encoding alone; a database row adds its own header and key), and encode / decode microseconds per row (best of
--repeats), decoding a block at a time (as a block summary reads its block) and all blocks in one call (as the
loader reads a run), in the format the collector writes (zstd) and, as the baseline of the same run, in zlib (the
format before revision 0016), with zstd's ratio to it. The raw columns are 48 bytes per row (step int64 and five
float64).

    python -m benchmarks.column_blocks [--hours 1] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from collections.abc import Callable, Sequence

import numpy as np

from benchmarks._common import machine
from services.analysis.step_blocks import BLOCK_STEPS
from services.collector.batch import parse_batch
from services.simulate import SimConfig, simulate
from services.storage.column_codec import ZLIB_FORMAT, ZSTD_FORMAT, decode_blocks, decode_step_rows, encode_step_rows
from services.storage.records import IngestRecord, StepRows

_COLUMNS = ("step", "start", "end", "loss", "lr", "comm")


def parsed(config: SimConfig) -> list[IngestRecord]:
    events = simulate(config).events
    out: list[IngestRecord] = []
    for i in range(0, len(events), 2000):
        out += parse_batch(json.dumps({"events": events[i:i + 2000]}).encode(), max_events=10**6, max_rows=10**8)
    return out


def _take(rows: StepRows, where: np.ndarray) -> StepRows:
    return StepRows(*(getattr(rows, c)[where] for c in _COLUMNS))


def per_block(records: Sequence[IngestRecord]) -> list[StepRows]:
    """Every (attempt, rank, block)'s rows, in the order they arrived."""
    parts: dict[tuple[int, int, int], list[StepRows]] = defaultdict(list)
    for key, rows in record_parts(records):
        parts[key].append(rows)
    return [StepRows(*(np.concatenate([getattr(p, c) for p in group]) for c in _COLUMNS)) for group in parts.values()]


def record_parts(records: Sequence[IngestRecord]) -> list[tuple[tuple[int, int, int], StepRows]]:
    """Each record's rows split by block, keyed by (attempt, rank, block)."""
    out: list[tuple[tuple[int, int, int], StepRows]] = []
    for r in records:
        rows = r.step_rows
        if rows is None or r.attempt is None or r.rank is None:
            continue
        blocks = rows.step // BLOCK_STEPS
        for block in np.unique(blocks):
            out.append(((r.attempt, r.rank, int(block)), _take(rows, blocks == block)))
    return out


def best(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def measure(name: str, blocks: list[StepRows], repeats: int) -> None:
    rows = sum(len(b.step) for b in blocks)
    print(f"  {name}: {len(blocks):,} blocks of {rows / len(blocks):.1f} rows")
    figures = {}
    for label, fmt in (("zlib", ZLIB_FORMAT), ("zstd", ZSTD_FORMAT)):
        encoded = [encode_step_rows(b, format_version=fmt) for b in blocks]
        size = sum(len(e) for e in encoded) / rows
        encode_s = best(lambda: [encode_step_rows(b, format_version=fmt) for b in blocks], repeats) / rows  # noqa: B023
        decode_s = best(lambda: [decode_step_rows(e) for e in encoded], repeats) / rows  # noqa: B023
        together_s = best(lambda: decode_blocks(encoded), repeats) / rows  # noqa: B023
        figures[label] = (size, encode_s, decode_s, together_s)
        print(f"    {label}: {size:.2f} bytes per rank-step ({size / 48:.1%} of the raw columns); encode "
              f"{encode_s * 1e6:.2f} us, decode {decode_s * 1e6:.2f} us per row a block at a time, "
              f"{together_s * 1e6:.2f} us all together (as the loader reads a run)")
    ratios = [new / old for new, old in zip(figures["zstd"], figures["zlib"], strict=True)]
    print("    zstd / zlib: bytes {:.2f}, encode {:.2f}, decode {:.2f}, decode together {:.2f}".format(*ratios))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=1.0, help="hours of steps of each simulated run")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    runs = {
        "storage_growth's run (8 ranks, one step a second, one step per record, no failures)":
            SimConfig(run_id="growth", ranks=8, hours=args.hours, step_s=1.0, mtbf_s=None, queue_s=0,
                      records_per_rank=1),
        "the ledger benchmark's shape (64 ranks, failures, a straggler, 2,000 steps per record)":
            SimConfig(run_id="ledger", ranks=64, hours=args.hours, step_s=1.0, mtbf_s=1800.0, straggler_rank=5,
                      jitter=0.05),
    }
    print(f"column blocks: {machine()}; {args.hours:g} h of steps per run")
    for title, config in runs.items():
        records = parsed(config)
        print(title)
        measure(f"one block per (attempt, rank, {BLOCK_STEPS} steps)", per_block(records), args.repeats)
        measure("one block per record and block (as received)", [rows for _, rows in record_parts(records)],
                args.repeats)


if __name__ == "__main__":
    main()
