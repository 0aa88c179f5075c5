"""`goodput report` against a real `goodput serve`, and the HTML report opened offline in headless Chromium."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
from pathlib import Path

import httpx
import pandas as pd
import pytest

from tests.test_cli import GOODPUT, env_with, free_port, wait_healthy

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-extensions", "--no-first-run"]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("serve")
    port = free_port()
    proc = subprocess.Popen([*GOODPUT, "serve", "--port", str(port), "--no-dashboard"], cwd=folder, env=env_with(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        for run_id, extra in (("cli-rep", ["--straggler-rank", "1", "--hang-at-step", "60"]), ("cli-other", [])):
            out = subprocess.run([*GOODPUT, "simulate", "--url", url, "--run-id", run_id, "--ranks", "4", "--hours",
                                  "0.05", "--mtbf", "100", *extra], env=env_with(), capture_output=True, text=True,
                                 timeout=120)
            assert out.returncode == 0, out.stderr
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def report(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*GOODPUT, "report", *args, "--url", url], env=env_with(), capture_output=True, text=True,
                          timeout=120)


def test_report_command_writes_every_format(served: str, tmp_path: Path) -> None:
    ledger = httpx.get(f"{served}/v1/runs/cli-rep/waste", timeout=30).json()
    for fmt in ("json", "csv", "html"):
        out = report(served, "cli-rep", "--format", fmt, "-o", str(tmp_path / f"r.{fmt}"))
        assert out.returncode == 0, out.stderr
        assert f"r.{fmt}" in out.stderr
    assert json.loads((tmp_path / "r.json").read_text())["ledger"] == ledger
    frame = pd.read_csv(tmp_path / "r.csv").set_index("category")
    assert frame.loc["allocated", "gpu_seconds"] == round(ledger["allocated_gpu_seconds"], 2)
    assert frame.loc["hang", "gpu_seconds"] == round(ledger["waste_gpu_seconds"]["hang"], 2)
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")

    to_stdout = report(served, "cli-rep", "--format", "csv", "-o", "-")
    assert to_stdout.returncode == 0 and to_stdout.stdout == (tmp_path / "r.csv").read_text()


def test_report_command_writes_a_file_named_after_the_run_by_default(served: str, tmp_path: Path) -> None:
    out = subprocess.run([*GOODPUT, "report", "cli-rep", "--url", served], env=env_with(), capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout == ""  # nothing printed to the terminal
    page = tmp_path / "cli-rep-report.html"
    assert page.read_text().startswith("<!DOCTYPE html>")
    assert "wrote the report of run cli-rep to cli-rep-report.html in the current folder" in out.stderr
    fleet = subprocess.run([*GOODPUT, "report", "--fleet", "--url", served], env=env_with(), capture_output=True,
                           text=True, timeout=120, cwd=tmp_path)
    assert fleet.returncode == 0 and (tmp_path / "goodput-fleet.csv").read_text().startswith("run_id,")


def test_report_command_writes_the_fleet_csv_with_a_time_filter(served: str, tmp_path: Path) -> None:
    out = report(served, "--fleet", "-o", str(tmp_path / "fleet.csv"))
    assert out.returncode == 0, out.stderr
    assert set(pd.read_csv(tmp_path / "fleet.csv")["run_id"]) == {"cli-rep", "cli-other"}
    future = report(served, "--fleet", "--since", "2100-01-01", "-o", "-")
    assert future.returncode == 0 and future.stdout.count("\n") == 1  # the header only
    listing = pd.read_csv(io.StringIO(report(served, "--fleet", "--since", "2020-01-01T00:00:00", "-o", "-").stdout))
    assert len(listing) == 2


def test_report_command_explains_its_mistakes(served: str) -> None:
    missing = report(served, "no-such-run", "--format", "json")
    assert missing.returncode == 1 and "404" in missing.stderr and "no-such-run" in missing.stderr
    both = report(served, "cli-rep", "--fleet")
    assert both.returncode == 2 and "RUN_ID, or --fleet" in both.stderr
    bad_time = report(served, "--fleet", "--since", "last tuesday")
    assert bad_time.returncode != 0 and "ISO 8601" in bad_time.stderr


def test_html_report_renders_its_figures_offline_in_chromium(served: str, tmp_path: Path) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.fail("Chromium not found: apt-get install chromium (scripts/system-deps.sh does it)")
    page = tmp_path / "report.html"
    page.write_bytes(httpx.get(f"{served}/v1/runs/cli-rep/report", params={"format": "html", "self_contained": "true"},
                               timeout=60).content)
    # Offline: every proxy points at a closed port, so any request for an outside resource would fail.
    dom = subprocess.run([chromium, *CHROMIUM_FLAGS, "--proxy-server=127.0.0.1:9", "--virtual-time-budget=10000",
                          "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert dom.stdout.count('class="main-svg"') >= 6  # plotly drew every figure (2 svg layers per figure)
    png = tmp_path / "report.png"
    shot = subprocess.run([chromium, *CHROMIUM_FLAGS, "--hide-scrollbars", f"--screenshot={png}",
                           "--window-size=1200,2000", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert shot.returncode == 0 and png.stat().st_size > 50_000, shot.stderr[-2000:]
