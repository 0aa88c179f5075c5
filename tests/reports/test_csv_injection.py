"""Every CSV the service writes is safe to open in a spreadsheet (OWASP, "CSV Injection"): a text cell that starts
with `=`, `+`, `-`, `@`, tab or carriage return is written with a leading single quote, numbers stay numbers.

Run ids are the text any write token chooses, and the fleet CSV puts every project's runs in one file an operator
opens: the ids below are accepted at ingest, so each export is checked with them: the fleet CSV and a run's CSV from
the API (SQLite and PostgreSQL), and both again as `goodput report` saves them against a real `goodput serve`.
"""

from __future__ import annotations

import csv
import io
import math
import subprocess
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import pandas as pd
import pytest
from fastapi.testclient import TestClient

from services.reports.export import FLEET_COLUMNS, FORMULA_PREFIXES, fleet_csv, spreadsheet_safe
from services.simulate import SimConfig, simulate
from tests.reports.ledgers import ledger
from tests.test_cli import GOODPUT, env_with, free_port, wait_healthy

DANGEROUS = ("=", "+", "-", "@", "\t", "\r")
# One run id per prefix that ingest accepts (tab and carriage return are control characters, refused in any id).
RUN_IDS = ('=HYPERLINK("http://example.invalid","open me")', "+1+cmd|' /C calc'!A0", "-2+3",
           "@SUM(1+1)*cmd|' /C calc'!A0")
SAFE_RUN_ID = "plain-run"


def events(run_id: str) -> list[dict[str, object]]:
    return simulate(SimConfig(run_id=run_id, ranks=2, hours=0.02, mtbf_s=None, seed=4,
                              start_time=time.time() - 3600)).events


def unquoted(cell: str) -> str:
    """What a program reading the CSV gets back: the leading quote removed where spreadsheet_safe added it."""
    return cell[1:] if cell.startswith("'") and cell[1:].startswith(DANGEROUS) else cell


def check_cells(text: str, numeric: set[str]) -> list[dict[str, str]]:
    """The CSV read back as rows: no text cell starts with a dangerous character; a cell of a numeric column that
    does is a number (a negative one)."""
    rows = list(csv.DictReader(io.StringIO(text, newline="")))
    assert rows, text
    for row in rows:
        for column, cell in row.items():
            if cell.startswith(DANGEROUS):
                assert column in numeric and math.isfinite(float(cell)), (column, cell)
    return rows


def fleet_numeric() -> set[str]:
    return {c for c in FLEET_COLUMNS if c not in ("run_id", "project", "status", "first_time_utc", "last_time_utc")}


BREAKDOWN_NUMERIC = {"gpu_seconds", "gpu_hours", "share"}


def test_the_owasp_prefixes_are_the_ones_neutralised() -> None:
    assert FORMULA_PREFIXES == DANGEROUS
    for prefix in DANGEROUS:
        assert spreadsheet_safe(prefix + "1+1") == "'" + prefix + "1+1"
    for text in ("run-1", "'=already quoted", "a=b", " =1", "", "1e-5"):
        assert spreadsheet_safe(text) == text


def test_the_csv_writer_quotes_every_dangerous_text_and_keeps_negative_numbers_numeric() -> None:
    """The writer holds on its own, whatever reaches it: also the tab and carriage return that ingest refuses, and a
    negative figure in a numeric column, which stays a number a spreadsheet sums."""
    ids = [p + "1+1" for p in DANGEROUS] + ["-1.5"]
    text = fleet_csv(("team", ledger(run_id=run_id, queue_seconds=-1.5, at_risk_gpu_seconds=float("-inf")))
                     for run_id in ids)
    rows = check_cells(text, fleet_numeric() - {"at_risk_gpu_seconds"})
    assert [row["run_id"] for row in rows] == ["'" + run_id for run_id in ids]
    assert [unquoted(row["run_id"]) for row in rows] == ids
    assert {row["queue_seconds"] for row in rows} == {"-1.5"}  # a number, not the text '-1.5
    assert {row["at_risk_gpu_seconds"] for row in rows} == {"'-inf"}  # not a finite number: text, quoted
    frame = pd.read_csv(io.StringIO(text))
    assert frame["queue_seconds"].dtype.kind == "f" and (frame["queue_seconds"] == -1.5).all()


def test_fleet_and_run_csv_from_the_api_never_start_a_cell_with_a_formula(client: TestClient) -> None:
    for run_id in (*RUN_IDS, SAFE_RUN_ID):
        response = client.post("/v1/events", json={"events": events(run_id)})
        assert response.status_code == 200, response.text
    for control in ("\t=1+1", "\r=1+1"):  # the two prefixes ingest never lets into a run id
        assert client.post("/v1/events", json={"events": events(control)}).status_code == 422

    fleet = client.get("/v1/reports/fleet.csv")
    assert fleet.status_code == 200
    rows = check_cells(fleet.text, fleet_numeric())
    assert sorted(row["run_id"] for row in rows) == sorted(["'" + r for r in RUN_IDS] + [SAFE_RUN_ID])
    assert sorted(unquoted(row["run_id"]) for row in rows) == sorted((*RUN_IDS, SAFE_RUN_ID))
    assert all(float(row["allocated_gpu_seconds"]) > 0 for row in rows)  # the numbers are still numbers

    for run_id in RUN_IDS:
        response = client.get(f"/v1/runs/{quote(run_id, safe='')}/report", params={"format": "csv"})
        assert response.status_code == 200
        rows = check_cells(response.text, BREAKDOWN_NUMERIC)
        assert {row["run_id"] for row in rows} == {"'" + run_id}
        allocated = client.get(f"/v1/runs/{quote(run_id, safe='')}/waste").json()["allocated_gpu_seconds"]
        assert float(next(r for r in rows if r["category"] == "allocated")["gpu_seconds"]) == round(allocated, 2)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("serve")
    port = free_port()
    proc = subprocess.Popen([*GOODPUT, "serve", "--port", str(port), "--no-dashboard"], cwd=folder, env=env_with(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        for run_id in RUN_IDS:
            response = httpx.post(f"{url}/v1/events", json={"events": events(run_id)}, timeout=60)
            assert response.status_code == 200, response.text
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def report(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([*GOODPUT, "report", "--url", url, *args], env=env_with(), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out


def test_goodput_report_saves_the_fleet_and_run_csv_with_formulas_neutralised(served: str, tmp_path: Path) -> None:
    fleet = report(served, "--fleet", "-o", "-").stdout
    rows = check_cells(fleet, fleet_numeric())
    assert sorted(unquoted(row["run_id"]) for row in rows) == sorted(RUN_IDS)
    assert all(row["run_id"].startswith("'") for row in rows)

    for i, run_id in enumerate(RUN_IDS):
        path = tmp_path / f"run{i}.csv"
        report(served, "--format", "csv", "-o", str(path), "--", run_id)  # `--`: an id may start with '-'
        rows = check_cells(path.read_text(), BREAKDOWN_NUMERIC)
        assert {row["run_id"] for row in rows} == {"'" + run_id}


def test_the_run_csv_neutralises_host_names_in_its_attempt_rows() -> None:
    from services.reports.content import build_report
    from services.reports.export import breakdown_csv
    from services.schemas.ledger import AttemptLedger

    host = '=HYPERLINK("http://example.invalid")'
    attempt = AttemptLedger(attempt=0, start=0.0, end=60.0, end_reported=True, reason=None, failed=False,
                            world_size=2, hosts=[host], resume_step=None, resume_reported=False, first_step=1,
                            last_step=50, steps_kept=50, steps_reworked=0, gpu_seconds={"productive": 120.0})
    text = breakdown_csv(build_report(ledger(120.0, attempts=[attempt]), None, generated_at=0.0))
    rows = list(csv.DictReader(io.StringIO(text, newline="")))
    (row,) = [r for r in rows if r["section"] == "attempt"]
    assert row["hosts"] == "'" + host and row["world_size"] == "2" and row["steps_kept"] == "50"
    assert not any(cell.startswith(FORMULA_PREFIXES) for r in rows for cell in r.values() if cell)
