"""`goodput serve` on PostgreSQL runs the background analyses and retention in a process of their own (GOODPUT_ANALYST):
the run analysed is analysed there and nowhere else, the process is started again when it dies, and it ends with the
server, even a server killed outright."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Connection

from services.cli.main import _background_mode, _workers
from services.settings import ServerSettings, ServiceSettings
from services.simulate import SimConfig, simulate
from services.storage.db import make_engine
from services.storage.run_views import load_views
from services.storage.runs import get_run
from tests.collector.test_polls_beside_an_analyst import halves
from tests.test_cli import GOODPUT, database_url_postgres, env_with, free_port, wait_healthy

__all__ = ["database_url_postgres"]  # the fixture, used by name

ANALYST_LINE = re.compile(r"background analyses and retention: in a process of their own \(pid (\d+)\)")


def children(pid: int) -> set[int]:
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        out |= {int(p) for p in (task / "children").read_text().split()}
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_for(what: str, check: Callable[[], object], timeout_s: float = 60.0) -> object:
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@contextmanager
def serve(database_url: str, folder: Path, **env: str) -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    port = free_port()
    log = folder / f"serve-{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([*GOODPUT, "serve", "--port", str(port), "--no-dashboard"], cwd=folder,
                                env=env_with(GOODPUT_DATABASE_URL=database_url, **env), stdout=out,
                                stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        yield proc, url, log
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)


def post_run(url: str, run_id: str, seed: int) -> None:
    """A run of 72 s that ended a minute ago (in the metrics' window)."""
    events = simulate(SimConfig(run_id=run_id, ranks=2, hours=0.02, mtbf_s=None, seed=seed,
                                start_time=time.time() - 132)).events
    assert httpx.post(f"{url}/v1/events", json={"events": events}, timeout=30).status_code == 200


@contextmanager
def connected(database_url: str) -> Iterator[Connection]:
    """A connection of its own to the server's database (the test reads what the server stored)."""
    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            yield conn
    finally:
        engine.dispose()


def stored(database_url: str, run_id: str) -> tuple[bool, bool]:
    """(whether the run's views are stored, whether its ledger is)."""
    with connected(database_url) as conn:
        run = get_run(conn, run_id)
        return load_views(conn, run.pk) is not None, run.ledger_json is not None


def ledger_versions(database_url: str, run_id: str) -> tuple[int, int]:
    """(the run's version, its stored ledger's version)."""
    with connected(database_url) as conn:
        run = get_run(conn, run_id)
        return run.version, run.ledger_version


def analysed(database_url: str, run_id: str) -> bool:
    return stored(database_url, run_id)[0]


def run_series(url: str, run_id: str) -> list[str]:
    """The run's `goodput_run_running` lines of a scrape (none while it has no stored ledger)."""
    metrics = httpx.get(f"{url}/metrics", timeout=30).text
    return [line for line in metrics.splitlines()
            if line.startswith("goodput_run_running{") and f'run_id="{run_id}"' in line]


def stale_ledgers(url: str) -> float:
    found = re.search(r"^goodput_metrics_stale_ledgers ([\d.e+-]+)$", httpx.get(f"{url}/metrics", timeout=30).text,
                      re.M)
    assert found is not None
    return float(found.group(1))


def analyst_pid(log: Path) -> int:
    found = wait_for("the analyst's pid in serve's output", lambda: ANALYST_LINE.findall(log.read_text()))
    assert isinstance(found, list)
    return int(found[-1])


def test_the_analyses_run_in_the_analyst_process_which_is_started_again_when_it_dies(
        database_url_postgres: str, tmp_path: Path) -> None:
    with serve(database_url_postgres, tmp_path, GOODPUT_WARM_ANALYSES_S="0.3",
               GOODPUT_METRICS_CACHE_TTL_S="0") as (proc, url, log):
        pid = analyst_pid(log)
        assert children(proc.pid) == {pid}  # one worker: uvicorn serves in this process; the analyst is its child
        post_run(url, "first", seed=1)
        before, since = halves()  # a running run ("polled"): what it sent until 10 s ago, then the rest
        assert httpx.post(f"{url}/v1/events", json={"events": before}, timeout=30).status_code == 200
        wait_for("the first runs' analyses", lambda: analysed(database_url_postgres, "first")
                 and ledger_versions(database_url_postgres, "polled")[1] > 0)

        os.kill(pid, signal.SIGSTOP)  # the analyst stopped: nothing else analyses in the background
        try:
            post_run(url, "second", seed=2)
            assert httpx.post(f"{url}/v1/events", json={"events": since}, timeout=30).status_code == 200
            stale = ledger_versions(database_url_postgres, "polled")
            assert stale[1] < stale[0]
            # nor does a scrape: the worker serves the ledgers the analyst stored and counts the run without one
            assert run_series(url, "second") == []
            assert stale_ledgers(url) == 2  # "second" without one, "polled" served the one stored before
            # nor a live poll: the worker serves the running run's stored ledger
            assert httpx.get(f"{url}/v1/runs/polled/live", timeout=30).status_code == 200
            assert httpx.get(f"{url}/v1/live", timeout=30).json()["runs"][0]["run_id"] == "polled"
            time.sleep(3)  # ten of the workers' intervals, were they analysing
            assert stored(database_url_postgres, "second") == (False, False)
            assert ledger_versions(database_url_postgres, "polled") == stale
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_for("the second run's analysis", lambda: analysed(database_url_postgres, "second"))
        assert run_series(url, "second") == ['goodput_run_running{project="default",run_id="second"} 0.0']
        wait_for("the running run's analysis", lambda: len(set(ledger_versions(database_url_postgres, "polled"))) == 1)
        assert stale_ledgers(url) == 0

        os.kill(pid, signal.SIGKILL)
        wait_for("serve saying it starts the analyst again",
                 lambda: f"the analyst process (pid {pid}) exited with code -9; starting it again in 1 s"
                 in log.read_text())
        again = wait_for("a new analyst", lambda: children(proc.pid) - {pid})
        assert isinstance(again, set) and len(again) == 1
        post_run(url, "third", seed=3)
        wait_for("the third run's analysis", lambda: analysed(database_url_postgres, "third"))
        metrics = httpx.get(f"{url}/metrics", timeout=30).text  # the analyst's CPU counted into the server's metrics
        cpu = re.search(r"^goodput_collector_analysis_cpu_seconds_total ([\d.e+-]+)$", metrics, re.M)
        assert cpu is not None and float(cpu.group(1)) > 0
        proc.terminate()
        assert proc.wait(timeout=30) == -signal.SIGTERM  # as before: uvicorn ends of the signal, after its shutdown
        (new,) = again
        assert not alive(new)  # stopped by the server before it ended, not left to notice it is an orphan


def test_the_analyst_ends_with_a_server_killed_outright(database_url_postgres: str, tmp_path: Path) -> None:
    with serve(database_url_postgres, tmp_path) as (proc, _, log):
        pid = analyst_pid(log)
        proc.kill()
        proc.wait(timeout=30)
        wait_for("the orphaned analyst to exit", lambda: not alive(pid), timeout_s=10)


def test_with_goodput_analyst_thread_the_workers_analyse_and_no_process_is_started(
        database_url_postgres: str, tmp_path: Path) -> None:
    with serve(database_url_postgres, tmp_path, GOODPUT_ANALYST="thread", GOODPUT_WARM_ANALYSES_S="0.3") as (
            proc, url, log):
        post_run(url, "in-thread", seed=4)
        wait_for("the run's analysis", lambda: analysed(database_url_postgres, "in-thread"))
        assert children(proc.pid) == set() and not ANALYST_LINE.search(log.read_text())


def test_goodput_analyst_alone_needs_postgresql(tmp_path: Path) -> None:
    done = subprocess.run([*GOODPUT, "analyst", "--db", f"sqlite:///{tmp_path / 'g.db'}"], env=env_with(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "needs PostgreSQL" in done.stderr


def test_goodput_analyst_names_a_bad_setting_and_starts_nothing(database_url_postgres: str) -> None:
    done = subprocess.run([*GOODPUT, "analyst", "--db", database_url_postgres],
                          env=env_with(GOODPUT_RAW_RETENTION_DAYS="nan"), capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.startswith("goodput analyst: GOODPUT_RAW_RETENTION_DAYS must be a finite number of days")


def test_goodput_analyst_says_when_the_database_does_not_answer(postgres_admin_url: str) -> None:
    from sqlalchemy.engine import make_url

    missing = make_url(postgres_admin_url).set(database="goodput_no_such_database").render_as_string(False)
    done = subprocess.run([*GOODPUT, "analyst", "--db", missing], env=env_with(), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("goodput analyst: the database does not answer (")
    assert '"goodput_no_such_database" does not exist' in done.stderr


@pytest.mark.parametrize(("url", "analyst", "warm", "prune", "mode", "said"), [
    ("postgresql://h/db", "auto", 15.0, 3600.0, "process", False),
    ("sqlite:///g.db", "auto", 15.0, 3600.0, "thread", False),
    ("postgresql://h/db", "thread", 15.0, 3600.0, "thread", False),
    ("sqlite:///g.db", "process", 15.0, 3600.0, "thread", True),  # SQLite has one writer
    ("postgresql://h/db", "process", 0.0, 3600.0, "process", False),  # retention alone
    ("postgresql://h/db", "process", 0.0, 0.0, "none", False),  # nothing to run
    ("postgresql://h/db", "elsewhere", 15.0, 3600.0, "none", False),  # a `goodput analyst` run apart
])
def test_where_the_background_jobs_run(url: str, analyst: str, warm: float, prune: float, mode: str, said: bool,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    server = ServerSettings.model_validate(
        {"database_url": url, "analyst": analyst, "warm_analyses_s": warm, "prune_interval_s": prune})
    assert _background_mode(server) == mode
    assert ("needs PostgreSQL" in capsys.readouterr().err) == said


def test_beside_the_analyst_the_workers_run_no_job_and_a_scrape_builds_no_ledger_unless_a_budget_is_given(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GOODPUT_METRICS_REFRESH_BUDGET_S", raising=False)
    workers = _workers(ServiceSettings(server=ServerSettings(database_url="postgresql://h/db")), "process")
    assert (workers.server.analyst, workers.server.warm_analyses_s, workers.server.prune_interval_s,
            workers.metrics.refresh_budget_s) == ("elsewhere", 0, 0, 0)
    monkeypatch.setenv("GOODPUT_METRICS_REFRESH_BUDGET_S", "2")
    assert _workers(ServiceSettings(), "process").metrics.refresh_budget_s == 2


def test_beside_an_analyst_of_retention_alone_the_workers_build_what_they_serve(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GOODPUT_METRICS_REFRESH_BUDGET_S", raising=False)
    server = ServerSettings(database_url="postgresql://h/db", warm_analyses_s=0)
    workers = _workers(ServiceSettings(server=server), _background_mode(server))
    assert (workers.server.analyst, workers.server.warm_analyses_s, workers.server.prune_interval_s,
            workers.metrics.refresh_budget_s) == ("auto", 0, 0, 3)


def test_analyst_elsewhere_on_sqlite_analyses_in_the_collector(capsys: pytest.CaptureFixture[str]) -> None:
    server = ServerSettings(database_url="sqlite:///g.db", analyst="elsewhere")
    assert _background_mode(server) == "thread"
    assert "GOODPUT_ANALYST=elsewhere needs PostgreSQL" in capsys.readouterr().err
    workers = _workers(ServiceSettings(server=server), "thread")
    assert (workers.server.analyst, workers.server.warm_analyses_s) == ("thread", 15)
