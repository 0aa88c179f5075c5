"""`goodput db prune` as an operator runs it (a real process), on SQLite and PostgreSQL, against a collector that keeps
receiving events: a retention that is not a finite number of days touches nothing; a quiet run that is pruned and
then sends its last events is analysed to the end, and a resend of what was pruned is counted duplicate, never
stored again; every surface of a pruned run reads as it did before the prune (issue 31, points 2 and 6)."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, text

from services.collector.app import create_app
from services.settings import MetricsSettings, ServiceSettings
from services.storage.step_columns import stored_step_keys
from tests.analysis.scenarios import T0, ev, reference_s1
from tests.ledger_checks import assert_partition
from tests.test_cli import GOODPUT, env_with, free_port

DAYS_FOR_A_SECOND = "1e-5"  # 0.86 s: a run that received nothing for a second is quiet for the whole window


def scenario(run_id: str, *, shift_s: float = 0.0) -> list[dict[str, Any]]:
    """The ledger specification's reference scenario (tests/analysis/scenarios.py, docs/ledger.md) with what a real
    client sends besides: a heartbeat per rank every 5 s, each step's collective seconds (rank 3 spends 0.2 s less
    in collectives than the others: 0.2 s more compute, the straggler) and its loss; times moved by `shift_s`.

    By hand, on top of the reference ledger (allocated 4160, productive 2400, startup 480, checkpoint 160, rework
    400, hang 480, idle 240): per kept step the slowest compute (0.9 s) minus the median (0.7 s) x 8 ranks =
    1.6 GPU-s of straggler, over the 300 kept steps 480 GPU-s, carved out of productive: 1920."""
    out = []
    for e in reference_s1():
        e = {**e, "run_id": run_id, "event_id": f"{run_id}-{e['event_id']}"}
        if e["kind"] == "steps":
            n = len(e["step"])
            e["comm"] = [0.1 if e["rank"] == 3 else 0.3] * n
            e["loss"] = [10.0 / s for s in e["step"]]
        out.append(e)
    beats = [(0, t, _in_progress_0(t)) for t in range(105, 350, 5)] + [(1, t, _in_progress_1(t))
                                                                      for t in range(365, 600, 5)]
    for attempt, t, step in beats:
        for rank in range(8):
            beat = ev("heartbeat", t, run_id=run_id, attempt=attempt, rank=rank, **({"step": step} if step else {}))
            out.append({**beat, "event_id": f"{run_id}-hb-{attempt}-{rank}-{t}"})
    return [_shifted(e, shift_s) for e in out]


def _in_progress_0(t: float) -> int | None:  # attempt 0: steps 1-100 from 130, a checkpoint, 101-150 from 240
    return None if t < 130 else int(t - 130) + 1 if t < 230 else 101 if t < 240 else min(int(t - 240) + 101, 151)


def _in_progress_1(t: float) -> int | None:  # attempt 1: steps 101-200 from 380, a checkpoint, 201-300 from 490
    return None if t < 380 else int(t - 380) + 101 if t < 480 else 201 if t < 490 else min(int(t - 490) + 201, 301)


def _shifted(e: dict[str, Any], by: float) -> dict[str, Any]:
    out = {**e, "time": e["time"] + by}
    for column in ("start", "end"):
        if isinstance(e.get(column), list):
            out[column] = [t + by for t in e[column]]
    return out


def event_time(e: dict[str, Any]) -> float:
    return float(e["time"])


def db_prune(database_url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*GOODPUT, "db", "prune", "--db", database_url, *args], env=env_with(**env),
                          capture_output=True, text=True, timeout=120)


def post(client: TestClient, events: list[dict[str, Any]]) -> dict[str, Any]:
    response = client.post("/v1/events", json={"events": events})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def run_rows(engine: Engine, run_id: str) -> dict[str, Any]:
    with engine.connect() as conn:
        pk = conn.execute(text("SELECT id FROM runs WHERE run_id = :r"), {"r": run_id}).scalar_one()
        keys = stored_step_keys(conn, run_id)
        out: dict[str, Any] = {"steps": len(keys), "collectives": conn.execute(
            text("SELECT count(*) FROM collectives WHERE run_pk = :pk"), {"pk": pk}).scalar_one()}
        out["attempts"] = sorted(set(keys["attempt"].tolist()))
        out["pruned_at"] = conn.execute(text("SELECT detail_pruned_at FROM runs WHERE id = :pk"),
                                        {"pk": pk}).scalar_one()
    return out


@pytest.fixture
def collector(settings: ServiceSettings, engine: Engine) -> Iterator[TestClient]:
    """The collector on the test's database, its metrics read fresh at every scrape."""
    fresh = settings.model_copy(update={"metrics": MetricsSettings(cache_ttl_s=0)})
    with TestClient(create_app(fresh, engine=engine)) as client:
        yield client


# -- point 2: a retention that is not a finite number of days >= 0 -------------------------------------------------


@pytest.mark.parametrize(("args", "env", "setting"), [
    (("--days", "nan"), {}, "--days"),
    (("--days", "inf"), {}, "--days"),
    (("--days", "-1"), {}, "--days"),
    ((), {"GOODPUT_RAW_RETENTION_DAYS": "nan"}, "GOODPUT_RAW_RETENTION_DAYS"),
    ((), {"GOODPUT_RAW_RETENTION_DAYS": "-inf"}, "GOODPUT_RAW_RETENTION_DAYS"),
])
def test_db_prune_refuses_a_retention_that_is_not_a_finite_number_of_days_and_touches_nothing(
        collector: TestClient, engine: Engine, database_url: str, args: tuple[str, ...], env: dict[str, str],
        setting: str) -> None:
    # a run still going: its first 150 steps and heartbeats arrived a moment ago (a NaN cutoff matched it on
    # PostgreSQL: its step rows went, its resume check answered 410 and its later events were never analysed)
    events = [e for e in scenario("going", shift_s=time.time() - T0 - 300) if event_time(e) <= time.time()]
    post(collector, events)
    before = run_rows(engine, "going")
    check = collector.get("/v1/runs/going/resume-check?loss_rtol=0.5")
    assert before["steps"] == 150 * 8 and check.status_code == 200

    done = db_prune(database_url, *args, **env)
    assert run_rows(engine, "going") == before
    assert collector.get("/v1/runs/going/resume-check?loss_rtol=0.5").json() == check.json()
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith(f"goodput db prune: {setting} must be a finite number of days >= 0")
    assert "nothing was pruned" in done.stderr and done.stdout == ""


@pytest.mark.parametrize(("variable", "value", "unit"), [("GOODPUT_RAW_RETENTION_DAYS", "nan", "days"),
                                                        ("GOODPUT_PRUNE_INTERVAL_S", "inf", "seconds")])
def test_goodput_serve_refuses_a_retention_setting_that_is_not_a_finite_number(
        tmp_path: Path, variable: str, value: str, unit: str) -> None:
    database = tmp_path / "goodput.db"
    done = subprocess.run([*GOODPUT, "serve", "--db", f"sqlite:///{database}", "--port", str(free_port())],
                          env=env_with(**{variable: value}), capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr == f"goodput serve: {variable} must be a finite number of {unit} >= 0 " + (
        "(0 keeps raw rows forever)" if unit == "days" else "(0 turns the collector's retention job off)") + \
        f", got {value}\n"
    assert not database.exists()  # stopped before opening the database


# -- point 2: a pruned run goes on being analysed ------------------------------------------------------------------


def scrape(client: TestClient) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    response = client.get("/metrics")
    assert response.status_code == 200
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(response.text) for s in family.samples}


def test_a_quiet_run_pruned_by_the_cli_is_analysed_when_its_last_events_arrive_and_its_resend_is_duplicate(
        collector: TestClient, engine: Engine, database_url: str) -> None:
    # the reference run, ending 60 s ago (so /metrics labels it); its first 300 s arrive first: attempt 0 up to its
    # last step (150), its heartbeats, no attempt_end; then it is quiet for a second and the CLI prunes it
    shift_s = time.time() - T0 - 680
    events = scenario("s1", shift_s=shift_s)
    cut = T0 + shift_s + 300
    first = [e for e in events if event_time(e) <= cut]
    rest = [e for e in events if event_time(e) > cut]
    assert post(collector, first) == {"accepted": len(first), "duplicates": 0}
    assert collector.get("/v1/runs/s1").json()["status"] == "running"
    time.sleep(1.2)
    done = db_prune(database_url, "--days", DAYS_FOR_A_SECOND)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "pruned run s1 (analyses stored)" in done.stdout
    pruned = run_rows(engine, "s1")
    assert pruned["steps"] == 0 and pruned["collectives"] == 0 and pruned["pruned_at"] is not None

    # the client's spool sent again (`goodput sync`): every event repeats one retention deleted or kept
    assert post(collector, first) == {"accepted": 0, "duplicates": len(first)}
    assert run_rows(engine, "s1")["steps"] == 0
    # then the rest of the run: attempt 0 fails, attempt 1 resumes from 100 (so 101-150 of the pruned attempt are
    # rework), completes, and the run ends
    assert post(collector, rest) == {"accepted": len(rest), "duplicates": 0}
    assert run_rows(engine, "s1")["attempts"] == [1]  # the pruned rows were never stored again

    ledger = collector.get("/v1/runs/s1/waste").json()
    assert ledger["status"] == "finished" and "provisional" not in {k for k, v in ledger.items() if v}
    assert ledger["allocated_gpu_seconds"] == pytest.approx(4160)
    assert ledger["productive_gpu_seconds"] == pytest.approx(1920)
    assert ledger["waste_gpu_seconds"] == pytest.approx(
        {"startup": 480, "checkpoint": 160, "rework": 400, "hang": 480, "straggler": 480, "idle": 240})
    assert ledger["goodput"] == pytest.approx(1920 / 4160)
    assert_partition(ledger)
    # the same events, never pruned: the same ledger
    whole = scenario("whole", shift_s=shift_s)
    post(collector, whole)
    reference = collector.get("/v1/runs/whole/waste").json()
    assert {k: v for k, v in ledger.items() if k != "run_id"} == {k: v for k, v in reference.items()
                                                                  if k != "run_id"}

    listed = {r["run_id"]: r for r in collector.get("/v1/runs").json()["runs"]}
    assert listed["s1"]["status"] == "finished"
    assert collector.get("/v1/live").json()["runs"] == []  # no run is running
    samples = scrape(collector)
    labels = frozenset({"run_id": "s1", "project": "default"}.items())
    assert samples[("goodput_run_running", labels)] == 0.0
    assert ("goodput_run_seconds_since_progress", labels) not in samples
    assert samples[("goodput_run_goodput_ratio", labels)] == pytest.approx(1920 / 4160)


# -- point 6: every surface reads the same before and after a prune -----------------------------------------------

SURFACES = ("live", "view", "waste", "report", "stragglers", "resume-check", "advice", "timeline", "ranks",
            "checkpoints", "restarts")
# measured from the collector's clock at each request: compared as the moments they stand for
SINCE_NOW = ("seconds_since_last_event", "seconds_since_progress", "heartbeat_age_seconds")
# what a prune changes by design: when it happened; a report's time of writing
PRUNE_STAMPS = ("detail_pruned_at", "generated_at")
# a hung run's advice says how long ago its progress stopped, to the server's clock ("No progress for 1118 d 10 h
# (..."): the two reads a prune apart may fall on both sides of an hour
_SINCE_NOW_WORDING = re.compile(r"^No progress for [^(]+\(")


def surfaces(client: TestClient, run_id: str) -> dict[str, Any]:
    out = {}
    for name in SURFACES:
        response = client.get(f"/v1/runs/{run_id}/{name}")
        assert response.status_code == 200, (name, response.text)
        out[name] = _comparable(response.json())
    return out


def _comparable(value: Any, now: float | None = None) -> Any:
    if isinstance(value, dict) and value.get("key") in SINCE_NOW:  # advice's evidence: "no progress for 1115 d"
        return {k: v for k, v in value.items() if k not in ("value", "text")}
    if isinstance(value, dict):
        now = value.get("server_time", now)
        out = {}
        for key, v in value.items():
            if key in PRUNE_STAMPS or key in ("server_time", "as_of"):
                continue
            if key == "wording" and isinstance(v, str):
                out[key] = _SINCE_NOW_WORDING.sub("No progress for (since now) (", v)
            elif key in SINCE_NOW and v is not None and now is not None:
                out[key.replace("seconds_since", "at").replace("age_seconds", "at")] = round(now - v, 3)
            elif key == "hung_for_seconds" and v is not None and now is not None:
                out["hung_since"] = round(now - v, 3)
            else:
                out[key] = _comparable(v, now)
        return out
    if isinstance(value, list):
        return [_comparable(v, now) for v in value]
    return value


@pytest.mark.parametrize("ended", [True, False], ids=["finished", "hung"])
def test_every_surface_of_a_run_reads_the_same_before_and_after_the_cli_prunes_it(
        collector: TestClient, settings: ServiceSettings, engine: Engine, database_url: str, ended: bool) -> None:
    events = scenario("s1")
    if not ended:  # attempt 1 stops after step 300 and never ends: a running run, hung for years, rank 6 behind
        # (its allocation still ends at 620: the provisional hang stops growing there, the same at every read)
        events = [e for e in events if e["kind"] != "run_end"
                  and not (e["kind"] == "attempt_end" and e["attempt"] == 1)]
        events += [ev("collectives", 595, run_id="s1", attempt=1, rank=r, step=[301, 301], op=["allreduce"] * 2,
                      start=[T0 + 590.5, T0 + 592], end=[T0 + 591, T0 + 593]) for r in range(8) if r != 6]
    post(collector, events)
    before = surfaces(collector, "s1")
    live = before["live"]
    assert live["last_step"] == 300 and live["pending_step"] == 301 and live["median_step_seconds"] == 1.0
    assert all(r["pending_step"] == 301 and r["last_step_end"] == T0 + 590 for r in live["ranks"])
    assert live["hung"] is not ended and before["view"]["live"] == live
    if not ended:
        assert [s["rank"] for s in live["suspects"]] == [6]
        assert {r["rank"]: r["collectives_in_pending_step"] for r in live["ranks"]} == {
            r: 0 if r == 6 else 2 for r in range(8)}

    time.sleep(1.2)
    done = db_prune(database_url, "--days", DAYS_FOR_A_SECOND)
    assert done.returncode == 0 and "pruned run s1 (analyses stored)" in done.stdout, done.stdout + done.stderr
    assert run_rows(engine, "s1")["steps"] == 0

    after = surfaces(collector, "s1")
    assert after == before
    assert collector.get("/v1/runs/s1/view").json()["detail_pruned_at"] is not None
    # and from a collector that never saw the run before the prune (nothing of it in memory)
    with TestClient(create_app(settings, engine=engine)) as fresh:
        assert surfaces(fresh, "s1") == before
