"""The CLI with two projects using one run id: a '*' reader says which with --project, as a user runs it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.test_cli import GOODPUT, env_with, free_port, wait_healthy


def _run(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*GOODPUT, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_a_star_reader_names_the_project_of_a_run_id_two_projects_use(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = env_with(GOODPUT_AUTH_CACHE_TTL_S="0")
    proc = subprocess.Popen([*GOODPUT, "serve", "--port", str(port), "--no-dashboard"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_healthy(url, proc)
        tokens = {}
        for project, kind in (("alpha", "write"), ("beta", "write"), ("*", "read")):
            made = _run("token", "create", "--project", project, "--kind", kind, env=env, cwd=tmp_path)
            assert made.returncode == 0, made.stderr
            tokens[(project, kind)] = made.stdout.strip()
        for project, hours in (("alpha", "0.05"), ("beta", "0.1")):
            sent = _run("simulate", "--url", url, "--token", tokens[(project, "write")], "--run-id", "shared",
                        "--hours", hours, "--mtbf", "0", env=env, cwd=tmp_path)
            assert sent.returncode == 0, sent.stderr
        reader = {**env, "GOODPUT_READ_TOKEN": tokens[("*", "read")]}

        ambiguous = _run("ledger", "shared", "--url", url, env=reader, cwd=tmp_path)
        assert ambiguous.returncode == 1
        assert "'alpha', 'beta'" in ambiguous.stdout and "--project" in ambiguous.stdout
        ledgers = {}
        for project in ("alpha", "beta"):
            shown = _run("ledger", "shared", "--url", url, "--project", project, "--json", env=reader, cwd=tmp_path)
            assert shown.returncode == 0, shown.stdout + shown.stderr
            ledgers[project] = json.loads(shown.stdout)
        assert ledgers["beta"]["productive_gpu_seconds"] > 1.5 * ledgers["alpha"]["productive_gpu_seconds"]

        listing = _run("runs", "--url", url, env=reader, cwd=tmp_path)
        rows = [line.split() for line in listing.stdout.splitlines()[1:]]
        assert sorted(row[:2] for row in rows) == [["shared", "alpha"], ["shared", "beta"]]
        only_beta = _run("runs", "--url", url, "--project", "beta", env=reader, cwd=tmp_path)
        assert [line.split()[:2] for line in only_beta.stdout.splitlines()[1:]] == [["shared", "beta"]]

        report = _run("report", "shared", "--url", url, "--project", "alpha", "--format", "json", "-o", "-",
                      env=reader, cwd=tmp_path)
        assert report.returncode == 0 and json.loads(report.stdout)["ledger"]["allocated_gpu_seconds"] == \
            ledgers["alpha"]["allocated_gpu_seconds"]
        fleet = _run("report", "--fleet", "--url", url, "--project", "beta", "-o", "-", env=reader, cwd=tmp_path)
        assert [line.split(",")[:2] for line in fleet.stdout.splitlines()[1:]] == [["shared", "beta"]]
        advice = _run("advise", "shared", "--url", url, "--project", "beta", "--json", env=reader, cwd=tmp_path)
        assert advice.returncode == 0, advice.stdout + advice.stderr
        beta = json.loads(advice.stdout)
        assert beta["run_id"] == "shared"
        assert beta["measured"]["allocated_gpu_seconds"] == ledgers["beta"]["allocated_gpu_seconds"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
