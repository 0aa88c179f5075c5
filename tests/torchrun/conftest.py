"""Real torchrun jobs (examples/train_ddp.py, CPU, gloo) reporting to a real `goodput serve` on SQLite.

Helpers: a collector process per test, a job started under torchrun (optionally through `goodput launch`),
the job's own per-rank JSON logs, and the ledger fetched from the collector's API once the job's events
have arrived. Expected values come from the job's logs, never from the test's guesses about timing.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from tests.test_cli import GOODPUT, REPO, env_with, free_port, wait_healthy

EXAMPLE = REPO / "examples" / "train_ddp.py"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
T = TypeVar("T")

# Training settings shared by the tests that compare final digests with an uninterrupted run.
DIGEST_ARGS = ("--steps", "30", "--seed", "7")


def json_lines(paths: list[Path]) -> list[dict[str, Any]]:
    """The JSON lines of job logs, file after file in the order given; a torn line (a killed writer) is skipped."""
    out: list[dict[str, Any]] = []
    for path in paths:
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


@dataclass
class Collector:
    url: str
    port: int
    db_path: Path
    proc: subprocess.Popen[bytes]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def start_collector(workdir: Path, port: int | None = None, **settings: str) -> Collector:
    """`goodput serve --port P` on SQLite (goodput.db in `workdir`), healthy when this returns; `settings`: GOODPUT_*
    variables of the collector."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    proc = subprocess.Popen([*GOODPUT, "serve", "--port", str(port), "--no-dashboard"], cwd=workdir,
                            env=env_with(**settings), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    collector = Collector(url=f"http://127.0.0.1:{port}", port=port, db_path=workdir / "goodput.db", proc=proc)
    try:
        wait_healthy(collector.url, proc)
    except BaseException:
        collector.stop()
        raise
    return collector


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[Collector]:
    c = start_collector(tmp_path / "collector")
    yield c
    c.stop()


@dataclass
class Job:
    run_id: str
    workdir: Path
    log_dir: Path
    ckpt_dir: Path
    proc: subprocess.Popen[bytes]
    output: Path
    killed: list[int] = field(default_factory=list)

    def logs(self) -> list[dict[str, Any]]:
        """Every rank's log lines, in file order per rank (a torn last line is skipped)."""
        return json_lines(sorted(self.log_dir.glob("rank*.jsonl")))

    def events(self, event: str, **match: Any) -> list[dict[str, Any]]:
        return [e for e in self.logs() if e["event"] == event and all(e.get(k) == v for k, v in match.items())]

    def pid(self, rank: int, attempt: int) -> int:
        (start,) = self.events("start", rank=rank, attempt=attempt)
        return int(start["pid"])

    def steps_run(self) -> set[tuple[int, int, int]]:
        """(attempt, rank, step) of every step a rank completed, as the job logged it."""
        return {(e["attempt"], e["rank"], e["step"]) for e in self.events("step")}

    def wait(self, timeout_s: float = 90.0) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.terminate()
            raise AssertionError(f"job {self.run_id} still running after {timeout_s} s\n{self.tail()}") from None

    def terminate(self) -> None:
        # torchrun starts each worker in a session of its own, so killing torchrun's process group leaves them
        # running (or stopped, after a SIGSTOP): kill every worker the logs name too.
        for start in self.events("start"):
            kill_worker(int(start["pid"]))
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def tail(self, lines: int = 40) -> str:
        text = self.output.read_text(errors="replace") if self.output.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def kill(self, pid: int, sig: int = signal.SIGKILL) -> None:
        os.kill(pid, sig)
        self.killed.append(pid)


def kill_worker(pid: int) -> None:
    """SIGKILL a train_ddp.py worker, unless the pid has since been reused by another program."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return
    if b"train_ddp.py" in cmdline:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def start_job(workdir: Path, url: str | None, *, run_id: str, nproc: int = 2, max_restarts: int = 0,
              launch: bool = True, args: tuple[str, ...] = (), extra_env: dict[str, str] | None = None) -> Job:
    """examples/train_ddp.py under torchrun (through `goodput launch` if `launch`), in its own process group."""
    workdir.mkdir(parents=True, exist_ok=True)
    log_dir, ckpt_dir = workdir / "logs", workdir / "ckpt"
    torchrun = [*TORCHRUN, "--standalone", "--nproc-per-node", str(nproc), "--max-restarts", str(max_restarts),
                "--monitor-interval", "0.1", str(EXAMPLE), "--ckpt-dir", str(ckpt_dir), "--log-dir", str(log_dir),
                *args]
    command = [*GOODPUT, "launch", "--", *torchrun] if launch else torchrun
    env = env_with(GOODPUT_RUN_ID=run_id, GOODPUT_SPOOL_DIR=str(workdir / "spool"), **(extra_env or {}))
    if url is not None:
        env["GOODPUT_URL"] = url
    env.setdefault("OMP_NUM_THREADS", "1")
    output = workdir / "torchrun.out"
    with open(output, "wb") as out:
        proc = subprocess.Popen(command, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    return Job(run_id=run_id, workdir=workdir, log_dir=log_dir, ckpt_dir=ckpt_dir, proc=proc, output=output)


@pytest.fixture
def jobs() -> Iterator[list[Job]]:
    """Started jobs are killed (whole process group) at the end of the test, whatever happened."""
    started: list[Job] = []
    yield started
    for job in started:
        job.terminate()


def wait_for(predicate: Callable[[], T | None], timeout_s: float, what: str, job: Job | None = None,
              interval_s: float = 0.05) -> T:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if job is not None and job.proc.poll() is not None:
            value = predicate()
            if value:
                return value
            raise AssertionError(f"job exited ({job.proc.returncode}) before {what}\n{job.tail()}")
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}" + (f"\n{job.tail()}" if job else ""))


def fetch_ledger(url: str, run_id: str, until: Callable[[dict[str, Any]], bool], timeout_s: float = 30.0
                 ) -> dict[str, Any]:
    """GET /v1/runs/{run_id}/waste until `until(ledger)` holds (events may still be in flight)."""
    last: dict[str, Any] | None = None

    def ready() -> dict[str, Any] | None:
        nonlocal last
        response = httpx.get(f"{url}/v1/runs/{run_id}/waste", timeout=30)
        if response.status_code != 200:
            return None
        last = response.json()
        return last if until(last) else None

    try:
        return wait_for(ready, timeout_s, f"the ledger of {run_id}", interval_s=0.5)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last ledger: {json.dumps(last, indent=1)}") from None


def fetch_run(url: str, run_id: str) -> dict[str, Any]:
    response = httpx.get(f"{url}/v1/runs/{run_id}", timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def final_digest(job: Job) -> str:
    done = job.events("done")
    assert done, f"no rank logged done\n{job.tail()}"
    digests = {e["digest"] for e in done}
    assert len(digests) == 1, f"ranks disagree on the final model: {done}"
    return digests.pop()


_REFERENCE: dict[tuple[str, ...], str] = {}


@pytest.fixture(scope="session")
def reference_digest(tmp_path_factory: pytest.TempPathFactory) -> Callable[[tuple[str, ...]], str]:
    """The final digest of an uninterrupted run with the given training args (run once per session)."""

    def get(args: tuple[str, ...]) -> str:
        if args not in _REFERENCE:
            workdir = tmp_path_factory.mktemp("reference")
            job = start_job(workdir, None, run_id="reference", launch=False, args=args,
                            extra_env={"GOODPUT_MODE": "disabled"})
            try:
                assert job.wait() == 0, job.tail()
            finally:
                job.terminate()
            _REFERENCE[args] = final_digest(job)
        return _REFERENCE[args]

    return get
