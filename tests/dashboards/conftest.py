"""A real `goodput serve` (SQLite, temporary folder, free port) seeded by `goodput simulate`, and Chromium."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
GOODPUT = [sys.executable, "-m", "services.cli"]
SCREENSHOTS = REPO / "artifacts" / "screenshots"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-dev-shm-usage"]

# The seeded runs: (run id, extra `goodput simulate` arguments)
SEEDED_RUNS: dict[str, list[str]] = {
    "llama-70b-pretrain": ["--ranks", "16", "--hours", "0.4", "--mtbf", "500", "--end", "failed",
                           "--max-failures", "3", "--seed", "3"],
    "bert-finetune-straggler": ["--ranks", "16", "--hours", "0.3", "--mtbf", "0", "--straggler-rank", "5",
                                "--seed", "1"],
    "gpt-small-hang": ["--ranks", "8", "--hours", "0.25", "--mtbf", "0", "--hang-at-step", "400", "--seed", "2"],
    "resnet-live": ["--ranks", "8", "--hours", "0.4", "--mtbf", "0", "--end", "running", "--seed", "4"],
}
STALLED_RUN = "vit-stalled"  # running, but its last step was ~45 minutes ago


@dataclass(frozen=True)
class Server:
    url: str
    proc: subprocess.Popen[bytes]

    @property
    def dashboard(self) -> str:
        return f"{self.url}/dashboard/"

    def get(self, path: str, **params: Any) -> Any:
        response = httpx.get(f"{self.url}{path}", params=params, timeout=60)
        response.raise_for_status()
        return response.json()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOODPUT_")}
    env["PYTHONPATH"] = str(REPO)
    return env


def start_server(folder: Path, **env: str) -> Server:
    port = free_port()
    log = open(folder / "serve.log", "wb")  # noqa: SIM115 (closed with the process)
    # A hang floor of 5 min: "resnet-live" (progress until seeding) must not be called hung while the session
    # runs; "vit-stalled" (50 min without progress) still is.
    proc = subprocess.Popen([*GOODPUT, "serve", "--port", str(port)], cwd=folder,
                            env={**_env(), "GOODPUT_HANG_FLOOR_S": "300", **env}, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"goodput serve exited with {proc.returncode}: {(folder / 'serve.log').read_text()}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return Server(url=url, proc=proc)
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.terminate()
    raise AssertionError("goodput serve did not become healthy within 60 s")


def stop_server(server: Server) -> None:
    server.proc.terminate()
    try:
        server.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.proc.kill()


def simulate(url: str, run_id: str, *args: str) -> None:
    out = subprocess.run([*GOODPUT, "simulate", "--url", url, "--run-id", run_id, *args], env=_env(), check=False,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr


@contextmanager
def server_with_runs(folder: Path, runs: dict[str, list[str]], stalled_run: str) -> Iterator[Server]:
    """A collector + dashboard holding `runs` (simulate arguments by run id) and `stalled_run`: running, but its
    last step was ~45 minutes ago."""
    server = start_server(folder)
    try:
        for run_id, args in runs.items():
            simulate(server.url, run_id, *args)
        simulate(server.url, stalled_run, "--ranks", "8", "--hours", "0.1", "--mtbf", "0", "--end", "running",
                 "--seed", "5", "--start-time", str(time.time() - 3000))
        yield server
    finally:
        stop_server(server)


@pytest.fixture(scope="session")
def seeded_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with server_with_runs(tmp_path_factory.mktemp("seeded"), SEEDED_RUNS, STALLED_RUN) as server:
        yield server


@pytest.fixture(scope="session")
def empty_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_server(tmp_path_factory.mktemp("empty"))
    try:
        yield server
    finally:
        stop_server(server)


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the Python package only)")
    path = chromium_path()
    if path is None:
        pytest.fail("Chromium not found: apt-get install chromium (scripts/system-deps.sh does it)")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


class Page:
    """A browser tab that records console errors and uncaught exceptions."""

    def __init__(self, browser: Any) -> None:
        self.context = browser.new_context(viewport={"width": 1440, "height": 900})
        self.page = self.context.new_page()
        self.page.set_default_timeout(30_000)
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(f"console: {m.text}") if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))

    def screenshot(self, name: str) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def choose(self, dropdown_id: str, option: str, *, exact: bool = False) -> None:
        """Pick an option of a single-choice dropdown, then wait until its menu has closed and handed the focus back
        to the dropdown (Dash's dropdown does so some 70 ms after the click): keys typed before that land in the
        dropdown, which reopens and takes them (a stop of CI typed "s" into the run filter, "weep-1" into the menu)."""
        self.page.click(f"#{dropdown_id}")
        self.page.get_by_role("option", name=option, exact=exact).click()
        self.page.wait_for_function(
            "id => document.activeElement?.id === id && !document.querySelector('[role=option]')", arg=dropdown_id)

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def tab(browser: Any) -> Iterator[Page]:
    page = Page(browser)
    try:
        yield page
    finally:
        page.close()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "browser: drives Debian's headless Chromium (Playwright) against a real server")
