"""Pages that poll never wait for a slow analysis: they get the last build, flagged stale, while one background
build per run catches up. Here a "slow analysis" is a build held at a gate the test opens, on SQLite and
PostgreSQL; the real cost of a big run is measured in benchmarks/dashboard.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from services.analysis.ledger import build_ledger
from services.analysis.resume_check import build_resume_check
from services.analysis.views import build_run_views
from services.collector.routes import resume as resume_route
from services.collector.routes import runs as runs_route
from services.derive import ledger as pipeline
from services.derive import resume as resume_pipeline
from services.derive import served as served_module
from services.derive import views as views_pipeline
from services.simulate import START_TIME, SimConfig, simulate

BUDGET_S = 0.2


def post(client: Any, events: list[dict[str, Any]]) -> None:
    response = client.post("/v1/events", json={"events": events})
    assert response.status_code == 200, response.text


def halves(run_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A simulated run cut in two; the first half ends a second ago, so the run is not hung meanwhile (a hung
    running run's figures grow with the clock: services.analysis.provisional)."""
    config = dict(run_id=run_id, ranks=2, hours=0.05, mtbf_s=60, max_failures=1, digest_every=5, seed=4)
    events = simulate(SimConfig(**config)).events  # type: ignore[arg-type]
    cut = len(events) // 2
    last = max(max(e["end"]) if isinstance(e.get("end"), list) else e["time"] for e in events[:cut])
    events = simulate(SimConfig(**config, start_time=START_TIME + time.time() - 1.0 - last)).events  # type: ignore[arg-type]
    return events[:cut], events[cut:]


class Gate:
    """Wraps a function so that each call waits until the test opens the gate; counts the calls."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn, self.calls, self.opened = fn, 0, threading.Event()
        self.lock = threading.Lock()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.lock:
            self.calls += 1
        assert self.opened.wait(60), "the test never opened the gate"
        return self.fn(*args, **kwargs)


@pytest.fixture(autouse=True)
def _short_budgets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(served_module, "STALE_OK_BUDGET_S", BUDGET_S)
    monkeypatch.setattr(resume_route, "STALE_OK_BUDGET_S", BUDGET_S)
    monkeypatch.setattr(runs_route, "LIST_BUDGET_S", BUDGET_S)


def wait_until(check: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_the_run_page_gets_the_last_build_while_a_slow_rebuild_runs_once(client: Any,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = halves("swr")
    post(client, first)
    built = client.get("/v1/runs/swr/view", params={"stale_ok": "true"}).json()
    assert built["stale"] is False and built["version"] == built["run_version"]
    assert built["ledger"] == client.get("/v1/runs/swr/waste").json()  # one version: views and ledger agree

    gate = Gate(build_run_views)
    monkeypatch.setattr(views_pipeline, "build_run_views", gate)
    post(client, second)
    started = time.monotonic()
    with ThreadPoolExecutor(4) as pool:  # four pages polling at once
        answers = list(pool.map(lambda _: client.get("/v1/runs/swr/view", params={"stale_ok": "true"}).json(),
                                range(4)))
    assert time.monotonic() - started < 30
    for answer in answers:
        assert answer["stale"] is True and answer["version"] == built["version"] < answer["run_version"]
        assert answer["ledger"] == built["ledger"] and answer["timeline"] == built["timeline"]
        assert answer["analysed_at"] == built["analysed_at"]
    # paced: a rebuild starts once 4x the last build's duration has passed since it (here: milliseconds)
    wait_until(lambda: bool(client.get("/v1/runs/swr/view", params={"stale_ok": "true"}).json()["stale"]
                            and gate.calls), "the background rebuild to start")
    assert gate.calls == 1, "one background rebuild for every poll of the run"

    gate.opened.set()
    wait_until(lambda: client.get("/v1/runs/swr/view", params={"stale_ok": "true"}).json()["stale"] is False,
               "the background rebuild")
    fresh = client.get("/v1/runs/swr/view", params={"stale_ok": "true"}).json()
    assert fresh["version"] == fresh["run_version"] > built["version"]
    assert fresh["ledger"] == client.get("/v1/runs/swr/waste").json()
    assert fresh["ledger"]["status"] == "finished" and built["ledger"]["status"] == "running"
    assert gate.calls == 1, "the request that found the build stored did not build again"


def test_without_stale_ok_the_view_waits_for_the_current_version(client: Any) -> None:
    first, second = halves("exact")
    post(client, first)
    old = client.get("/v1/runs/exact/view").json()
    post(client, second)
    new = client.get("/v1/runs/exact/view").json()
    assert new["stale"] is False and new["version"] > old["version"] and new["version"] == new["run_version"]
    assert new["timeline"] == client.get("/v1/runs/exact/timeline").json()["timeline"]


def test_the_fleet_list_shows_the_stored_ledger_while_a_slow_one_is_built(client: Any,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = halves("listed")
    post(client, first)
    before = client.get("/v1/runs").json()["runs"][0]
    assert before["stale"] is False and before["status"] == "running"

    gate = Gate(build_ledger)
    monkeypatch.setattr(pipeline, "build_ledger", gate)
    post(client, second)
    during = client.get("/v1/runs").json()["runs"][0]
    assert during["stale"] is True and during["goodput"] == before["goodput"] and during["status"] == "running"
    wait_until(lambda: bool(client.get("/v1/runs").json()["runs"][0]["stale"] and gate.calls),
               "the background ledger to start")

    gate.opened.set()
    wait_until(lambda: client.get("/v1/runs").json()["runs"][0]["stale"] is False, "the background ledger")
    after = client.get("/v1/runs").json()["runs"][0]
    assert after["status"] == "finished" and after["goodput"] == client.get("/v1/runs/listed/waste").json()["goodput"]
    assert gate.calls == 1


def test_the_resume_check_is_pending_then_stale_then_fresh(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = halves("resumes")
    post(client, first)
    gate = Gate(build_resume_check)
    monkeypatch.setattr(resume_pipeline, "build_resume_check", gate)
    pending = client.get("/v1/runs/resumes/resume-check", params={"stale_ok": "true"})
    assert pending.status_code == 202 and pending.json()["error"]["code"] == "resume_check_pending"
    assert pending.headers["Retry-After"] == "5"
    gate.opened.set()
    wait_until(lambda: client.get("/v1/runs/resumes/resume-check", params={"stale_ok": "true"}).status_code == 200,
               "the first resume check")
    old = client.get("/v1/runs/resumes/resume-check", params={"stale_ok": "true"}).json()
    assert old["stale"] is False

    gate.opened.clear()
    post(client, second)
    stale = client.get("/v1/runs/resumes/resume-check", params={"stale_ok": "true"}).json()
    assert stale["stale"] is True and stale["version"] == old["version"]
    gate.opened.set()
    exact = client.get("/v1/runs/resumes/resume-check").json()  # waits for the current version
    assert exact["version"] > old["version"] and exact["stale"] is False
