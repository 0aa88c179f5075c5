"""Reports as files: JSON, CSV (one run's breakdown, or the fleet) and self-contained HTML (services.reports.html)."""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from services.presentation import iso
from services.reports.content import RunReport
from services.schemas.categories import WASTE_KEYS
from services.schemas.ledger import Ledger

# a run's CSV: one table, a `section` per kind of row (ledger, attempt, checkpoint, rank), each filling its columns
RUN_CSV_COLUMNS = (
    "run_id", "section", "category", "gpu_seconds", "gpu_hours", "share",
    "attempt", "start_utc", "end_utc", "outcome", "world_size", "hosts", "resume_step", "first_step", "last_step",
    "steps_kept", "steps_reworked", "step", "blocking_seconds",
    "rank", "host", "median_compute_seconds", "straggler_gpu_seconds", "share_of_straggler",
)
FLEET_COLUMNS = (
    "run_id", "project", "status", "first_time", "last_time", "first_time_utc", "last_time_utc",
    "allocated_gpu_seconds", "allocated_gpu_hours", "productive_gpu_seconds", "goodput", "eval_gpu_seconds",
    *(f"{k}_gpu_seconds" for k in WASTE_KEYS), "at_risk_gpu_seconds", "restarts", "failures", "queue_seconds",
)


FLEET_FILENAME = "goodput-fleet.csv"


def report_filename(run_id: str, format: str) -> str:
    """The file a run's report is saved as (the API's Content-Disposition, `goodput report`'s default): the run id
    with anything but letters, digits, `.`, `_` and `-` replaced, then `-report.<format>`."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", run_id)[:120] + f"-report.{format}"


def report_json(report: RunReport) -> str:
    return json.dumps(report.to_json_dict(), indent=2, allow_nan=False)


def csv_decimals(column: str) -> int:
    """Decimals a CSV column's numbers keep: GPU-seconds and seconds to 0.01, GPU-hours, ratios (share, goodput)
    and a step's compute seconds (73 ms) to 1e-6, epoch times to the millisecond. Enough for any sum a spreadsheet
    makes, and no float noise (33.06666564941406 is written 33.07)."""
    if column.endswith(("gpu_hours", "compute_seconds")) or column in ("share", "goodput", "share_of_straggler"):
        return 6
    if column.endswith("_time"):
        return 3
    return 2


# OWASP, "CSV Injection": a spreadsheet reads a cell that starts with one of these as a formula (tab and carriage
# return are dropped by some importers, which then read the character after them).
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(text: str) -> str:
    """`text` as a CSV cell a spreadsheet shows as text and never runs: prefixed with a single quote when it starts
    with one of FORMULA_PREFIXES (OWASP's advice), else unchanged. A run id such as `=HYPERLINK("http://...")`,
    which any write token may send, is then the text `'=HYPERLINK(...)`; a program reading the file gets the id back
    by removing a leading `'` that is followed by one of those characters.

    `_cell` applies it to every text cell of every CSV the service writes (the fleet CSV, a run's CSV, and so the
    CLI's `goodput report`, which saves what the API returns). Numbers are left alone, so numeric columns stay
    numeric: a Python int or finite float is written as a number literal (`-1.5`, `2.5e-07`), which spreadsheets
    parse as a number, never as a formula, and quoting it would turn it into text that sums and charts skip.
    OWASP's rule quotes any cell starting with `-`; it is meant for text whose type the writer does not know.
    Here the type is known, and a text cell that looks like a number (a run id `-1`) is still quoted."""
    return "'" + text if text.startswith(FORMULA_PREFIXES) else text


def _cell(column: str, value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float) and math.isfinite(value):
        return repr(round(value, csv_decimals(column)))  # the shortest text of the rounded number
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return spreadsheet_safe(str(value))  # text, and the odd non-finite float ('-inf')


def _write(columns: Iterable[str], rows: Iterable[Mapping[str, Any]]) -> str:
    """The one writer of every CSV the service serves: every cell goes through `_cell` (spreadsheet_safe). Lines end
    in CRLF (RFC 4180), so that a cell holding a carriage return is quoted: with "\n" alone Python's writer leaves
    it bare and the reader starts a new row there."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(columns), lineterminator="\r\n", extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _cell(k, v) for k, v in row.items()})
    return out.getvalue()


def breakdown_csv(report: RunReport) -> str:
    """The run as one CSV table (`RUN_CSV_COLUMNS`), a `section` column saying what each row is: `ledger`, one row
    per category (productive, eval, the six waste categories, allocated: GPU-seconds, GPU-hours, share); `attempt`,
    one per attempt (times, outcome, world size, hosts, steps); `checkpoint`, one per checkpoint the report holds;
    `rank`, one per rank of the run (the costliest in straggler time first). Numbers rounded
    (`csv_decimals`), every text cell spreadsheet-safe."""
    rows: list[dict[str, Any]] = [{"section": "ledger", **row.model_dump()} for row in report.breakdown]
    rows += [{"section": "attempt", "attempt": a.attempt, "start_utc": iso(a.start), "end_utc": iso(a.end),
              "outcome": a.reason or ("failed" if a.failed else ""), "world_size": a.world_size,
              "hosts": " ".join(a.hosts), "resume_step": a.resume_step, "first_step": a.first_step,
              "last_step": a.last_step, "steps_kept": a.steps_kept, "steps_reworked": a.steps_reworked}
             for a in report.ledger.attempts]
    rows += [{"section": "checkpoint", "attempt": c.attempt, "step": c.step, "start_utc": iso(c.start),
              "end_utc": iso(c.end), "blocking_seconds": c.blocking_seconds,
              "outcome": "torn" if c.torn else ("ok" if c.ok else "failed")}
             for c in report.checkpoints.rows or []]
    rows += [{"section": "rank", "rank": r.rank, "host": r.host, "median_compute_seconds": r.median_compute_seconds,
              "straggler_gpu_seconds": r.straggler_gpu_seconds, "share_of_straggler": r.share_of_straggler}
             for r in report.ranks]
    return _write(RUN_CSV_COLUMNS, ({"run_id": report.run_id, **row} for row in rows))


def fleet_rows(runs: Iterable[tuple[str, Ledger]]) -> list[dict[str, Any]]:
    """One row per (project, ledger)."""
    return [{
        "run_id": ledger.run_id, "project": project, "status": ledger.status,
        "first_time": ledger.first_time, "last_time": ledger.latest_time,
        "first_time_utc": iso(ledger.first_time), "last_time_utc": iso(ledger.latest_time),
        "allocated_gpu_seconds": ledger.allocated_gpu_seconds,
        "allocated_gpu_hours": ledger.allocated_gpu_seconds / 3600.0,
        "productive_gpu_seconds": ledger.productive_gpu_seconds, "goodput": ledger.goodput,
        "eval_gpu_seconds": ledger.eval_gpu_seconds,
        **{f"{k}_gpu_seconds": v for k, v in ledger.waste_gpu_seconds.items()},
        "at_risk_gpu_seconds": ledger.at_risk_gpu_seconds, "restarts": ledger.restarts,
        "failures": ledger.failures, "queue_seconds": ledger.queue_seconds,
    } for project, ledger in runs]


def fleet_csv(runs: Iterable[tuple[str, Ledger]]) -> str:
    """One row per run (its project and ledger): times (epoch seconds and ISO 8601 UTC), GPU-seconds per category,
    goodput, restarts."""
    return _write(FLEET_COLUMNS, fleet_rows(runs))
