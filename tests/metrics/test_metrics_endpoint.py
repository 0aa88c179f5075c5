"""GET /metrics against the API's ledgers, on SQLite and PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.simulate import SimConfig, simulate
from tests.analysis.scenarios import reference_s1

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(client: Any) -> Samples:
    response = client.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=")
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(response.text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    if "run_id" in labels:  # a run's series carry its project too; these runs are written without a token
        labels.setdefault("project", "default")
    return samples[(name, frozenset(labels.items()))]


def names_with(samples: Samples, **labels: str) -> set[str]:
    return {name for name, ls in samples if set(labels.items()) <= ls}


@pytest.fixture
def make_client(settings, engine, monkeypatch) -> Iterator[Callable[..., Any]]:
    """A TestClient on a fresh app; keyword arguments become GOODPUT_METRICS_* variables."""
    from fastapi.testclient import TestClient

    from services.collector.app import create_app
    from services.settings import MetricsSettings

    clients: list[Any] = []

    def make(**env: str) -> Any:
        for key, val in env.items():
            monkeypatch.setenv(f"GOODPUT_METRICS_{key.upper()}", val)
        metrics = MetricsSettings()  # read now, from the variables just set
        client = TestClient(create_app(settings.model_copy(update={"metrics": metrics}), engine=engine))
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


def send_sim(client: Any, run_id: str, *, end: str = "finished", ago_s: float = 600.0, **kw: Any) -> None:
    """A simulated run whose last event is `ago_s` seconds before now."""
    config = dict(run_id=run_id, ranks=4, hours=0.05, mtbf_s=60.0, checkpoint_every=20, end=end, seed=1, **kw)
    first = simulate(SimConfig(**config, start_time=0.0))
    last = max(max(e["end"]) if isinstance(e.get("end"), list) else e.get("end", e["time"]) for e in first.events)
    events = simulate(SimConfig(**config, start_time=time.time() - ago_s - last)).events
    response = client.post("/v1/events", json={"events": events})
    assert response.status_code == 200, response.text


def test_run_series_equal_the_api_ledger(make_client) -> None:
    client = make_client()
    send_sim(client, "done", straggler_rank=1)
    send_sim(client, "live", end="running", ago_s=10.0)  # not hung (threshold 30 s): no provisional hang
    samples = scrape(client)
    for run_id in ("done", "live"):
        ledger = client.get(f"/v1/runs/{run_id}/waste").json()
        assert value(samples, "goodput_run_goodput_ratio", run_id=run_id) == ledger["goodput"]
        assert value(samples, "goodput_run_allocated_gpu_seconds", run_id=run_id) == ledger["allocated_gpu_seconds"]
        assert value(samples, "goodput_run_productive_gpu_seconds", run_id=run_id) == ledger["productive_gpu_seconds"]
        for category, gpu_s in ledger["waste_gpu_seconds"].items():
            assert value(samples, "goodput_run_waste_gpu_seconds", run_id=run_id, category=category) == gpu_s
        assert value(samples, "goodput_run_at_risk_gpu_seconds", run_id=run_id) == ledger["at_risk_gpu_seconds"]
        assert value(samples, "goodput_run_restarts_total", run_id=run_id) == ledger["restarts"]
        assert value(samples, "goodput_run_checkpoint_blocking_seconds", run_id=run_id) == \
            ledger["checkpoints"]["median_blocking_seconds"]
        assert value(samples, "goodput_run_checkpoints_total", run_id=run_id, outcome="ok") == \
            ledger["checkpoints"]["ok"]
    assert value(samples, "goodput_run_running", run_id="live") == 1.0
    assert value(samples, "goodput_run_running", run_id="done") == 0.0
    since = value(samples, "goodput_run_seconds_since_progress", run_id="live")
    assert 5.0 < since < 300.0  # the simulated last step ended about 10 s ago
    assert ("goodput_run_seconds_since_progress", frozenset({("run_id", "done")})) not in samples

    ledgers = [client.get(f"/v1/runs/{r}/waste").json() for r in ("done", "live")]
    allocated = sum(lg["allocated_gpu_seconds"] for lg in ledgers)
    productive = sum(lg["productive_gpu_seconds"] for lg in ledgers)
    assert value(samples, "goodput_fleet_allocated_gpu_seconds") == pytest.approx(allocated, rel=1e-12)
    assert value(samples, "goodput_fleet_goodput_ratio") == pytest.approx(productive / allocated, rel=1e-12)
    assert value(samples, "goodput_fleet_runs", status="running") == 1.0
    assert value(samples, "goodput_fleet_runs", status="finished") == 1.0


def test_a_hung_runs_hang_so_far_is_in_its_series_and_the_fleets_and_grows_between_scrapes(make_client) -> None:
    client = make_client(cache_ttl_s="60")  # the second scrape reuses the snapshot: the hang grows all the same
    send_sim(client, "stuck", end="running", ago_s=120.0)  # last step 120 s ago; threshold 30 s: hung
    first = scrape(client)
    waste = client.get("/v1/runs/stuck/waste").json()
    time.sleep(1.0)
    second = scrape(client)
    assert value(first, "goodput_run_hung", run_id="stuck") == 1.0
    p1 = value(first, "goodput_run_provisional_hang_gpu_seconds", run_id="stuck")
    p2 = value(second, "goodput_run_provisional_hang_gpu_seconds", run_id="stuck")
    gpus = 4  # send_sim: 4 ranks on 4 GPUs
    assert p1 == pytest.approx(120.0 * gpus, abs=10.0 * gpus)  # from the last step to the scrape
    assert p2 - p1 >= 1.0 * gpus  # a second later, on every GPU of the job
    assert p1 <= waste["provisional"]["hang_gpu_seconds"] <= p2  # /waste, read between the two scrapes
    for samples, provisional in ((first, p1), (second, p2)):
        hang = value(samples, "goodput_run_waste_gpu_seconds", run_id="stuck", category="hang")
        assert hang >= provisional
        assert value(samples, "goodput_fleet_waste_gpu_seconds", category="hang") == hang
        allocated = value(samples, "goodput_run_allocated_gpu_seconds", run_id="stuck")
        parts = value(samples, "goodput_run_productive_gpu_seconds", run_id="stuck") + sum(
            value(samples, "goodput_run_waste_gpu_seconds", run_id="stuck", category=c)
            for c in ("startup", "checkpoint", "rework", "hang", "straggler", "idle"))
        assert parts == pytest.approx(allocated, rel=1e-9)
        assert value(samples, "goodput_fleet_allocated_gpu_seconds") == allocated
    assert value(second, "goodput_run_allocated_gpu_seconds", run_id="stuck") - value(
        first, "goodput_run_allocated_gpu_seconds", run_id="stuck") == pytest.approx(p2 - p1, rel=1e-6)


def test_collector_counts_accepted_duplicate_and_rejected_events(make_client) -> None:
    client = make_client()
    events = reference_s1()
    assert client.post("/v1/events", json={"events": events}).status_code == 200
    assert client.post("/v1/events", json={"events": events[:10]}).status_code == 200  # a client's retry
    assert client.post("/v1/events", content=b"{not json").status_code == 400
    bad = dict(events[0], event_id="bad", time="yesterday")
    assert client.post("/v1/events", json={"events": [bad]}).status_code == 422
    samples = scrape(client)
    assert value(samples, "goodput_collector_events_total", outcome="accepted") == len(events)
    assert value(samples, "goodput_collector_events_total", outcome="duplicate") == 10
    assert value(samples, "goodput_collector_rejected_batches_total", code="malformed_json") == 1
    assert sum(v for (name, _), v in samples.items() if name == "goodput_collector_rejected_batches_total") == 2


def test_request_histogram_is_labelled_by_route_template_never_by_run_id(make_client) -> None:
    client = make_client()
    assert client.get("/v1/runs/secret-run-42/waste").status_code == 404
    assert client.get("/no/such/page").status_code == 404
    response = client.get("/metrics")
    assert "secret-run-42" not in response.text and "/no/such/page" not in response.text
    samples = scrape(client)
    assert value(samples, "goodput_collector_request_duration_seconds_count",
                 handler="/v1/runs/{run_id:path}/waste", method="GET", code="404") == 1
    assert value(samples, "goodput_collector_request_duration_seconds_count",
                 handler="unmatched", method="GET", code="404") == 1


def test_embedded_dashboard_requests_are_labelled_by_its_mount_whatever_the_page(settings, engine) -> None:
    from fastapi.testclient import TestClient

    from services.collector.app import create_app

    server = settings.server.model_copy(update={"serve_dashboard": True})
    app = create_app(settings.model_copy(update={"server": server}), engine=engine)
    pages = ["/dashboard/", "/dashboard/runs/secret-run-42", "/dashboard/_dash-layout", "/dashboard/no-such-page"]
    with TestClient(app, client=("127.0.0.1", 50000)) as client:  # loopback: no token needed
        codes = [client.get(page).status_code for page in pages]
        assert client.get("/dashboard", follow_redirects=False).status_code == 307
        text = client.get("/metrics").text
    assert "secret-run-42" not in text and "no-such-page" not in text
    samples = {(s.name, frozenset(s.labels.items())): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    counts = {dict(ls)["handler"]: v for (name, ls), v in samples.items()
              if name == "goodput_collector_request_duration_seconds_count"}
    assert counts == {"/dashboard/{path:path}": len(pages), "/dashboard": 1}, (counts, codes)


def test_write_queue_gauge_is_the_writers_backlog_after_the_latest_request(make_client, monkeypatch) -> None:
    from services.storage.writer import BatchWriter

    client = make_client()
    assert value(scrape(client), "goodput_collector_write_queue_rows") == 0
    monkeypatch.setattr(BatchWriter, "pending_events", property(lambda self: 1234))
    client.get("/healthz")
    assert value(scrape(client), "goodput_collector_write_queue_rows") == 1234


def test_analysis_cache_gauge_is_the_bytes_of_decoded_step_blocks_kept(make_client) -> None:
    client = make_client()
    assert value(scrape(client), "goodput_collector_analysis_cache_bytes") == 0
    send_sim(client, "cached", straggler_rank=1)
    assert client.get("/v1/runs/cached/view").status_code == 200  # an analysis: its blocks are decoded and kept
    summaries = client.app.state.analyses.summaries
    assert summaries.nbytes > 0
    assert value(scrape(client), "goodput_collector_analysis_cache_bytes") == summaries.nbytes
    summaries.clear()
    assert value(scrape(client), "goodput_collector_analysis_cache_bytes") == 0


def test_analysis_cpu_counter_adds_the_cpu_of_each_build(make_client) -> None:
    client = make_client()
    assert value(scrape(client), "goodput_collector_analysis_cpu_seconds_total") == 0
    send_sim(client, "built", straggler_rank=1)
    assert client.get("/v1/runs/built/view").status_code == 200  # a build, on its own thread
    after_one = value(scrape(client), "goodput_collector_analysis_cpu_seconds_total")
    assert after_one > 0
    client.app.state.analyses.count_cpu(2.5)  # the background analyst's own share of a round
    assert value(scrape(client), "goodput_collector_analysis_cpu_seconds_total") == pytest.approx(after_one + 2.5)


def test_run_info_has_one_series_per_labelled_run_to_join_on(make_client) -> None:
    client = make_client(max_runs="2", run_window_h="1")
    send_sim(client, "idle-gpus", gpus=6)  # 4 ranks on 6 GPUs, finished 10 min ago
    send_sim(client, "live", end="running", ago_s=5.0)
    send_sim(client, "too-old", ago_s=2 * 3600.0)  # finished before the window: no series of its own
    samples = scrape(client)
    info = {dict(ls)["run_id"]: (dict(ls), v) for (name, ls), v in samples.items() if name == "goodput_run_info"}
    assert set(info) == {"idle-gpus", "live"}
    assert info["idle-gpus"] == ({"run_id": "idle-gpus", "project": "default", "status": "finished",
                                  "world_size": "4", "gpus": "6"}, 1.0)
    assert info["live"] == ({"run_id": "live", "project": "default", "status": "running", "world_size": "4",
                             "gpus": "4"}, 1.0)
    labelled = {dict(ls)["run_id"] for name, ls in samples if name == "goodput_run_allocated_gpu_seconds"}
    assert labelled == set(info)  # the same runs as every other goodput_run_* series: joins never miss


def test_promtool_finds_every_metric_name_conventional(make_client) -> None:
    """`promtool check metrics`: counters end in _total and nothing else does, units are base units, every family
    has help text; on an exposition with every family present (runs, a hung one, drops, rejections)."""
    import shutil
    import subprocess

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found: apt-get install prometheus (scripts/system-deps.sh does it)")
    client = make_client()
    send_sim(client, "done", straggler_rank=1)
    send_sim(client, "stuck", end="running", ago_s=120.0)
    assert client.post("/v1/events", content=b"{not json").status_code == 400
    text = client.get("/metrics").text
    families = {f.name: f.type for f in text_string_to_metric_families(text)}
    assert families["goodput_run_info"] == families["goodput_collector_write_queue_rows"] == "gauge"
    assert {"goodput_run_restarts", "goodput_run_client_dropped_events", "goodput_collector_events",
            "goodput_collector_rejected_batches"} <= {name for name, kind in families.items() if kind == "counter"}
    out = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and not out.stdout.strip(), out.stdout + out.stderr


def _client_stats(run_id: str, n: int, t: float, attempt: int, rank: int, **counts: int) -> dict[str, Any]:
    return {"event_id": f"cs-{n}", "run_id": run_id, "kind": "client_stats", "time": t, "attempt": attempt,
            "rank": rank, **counts}


def test_client_drops_sum_the_latest_counters_of_each_process(make_client) -> None:
    client = make_client()
    send_sim(client, "drops", end="running", ago_s=5.0)
    now = time.time()
    stats = [
        _client_stats("drops", 1, now - 60, 0, 0, dropped_events=5),
        _client_stats("drops", 2, now - 30, 0, 0, dropped_events=7, send_failures=2),  # same process, later
        _client_stats("drops", 3, now - 50, 0, 1, dropped_events=3, spool_dropped_events=2),
        _client_stats("drops", 4, now - 20, 1, 0, dropped_events=1, rejected_events=4),  # the next attempt
    ]
    assert client.post("/v1/events", json={"events": stats}).status_code == 200
    samples = scrape(client)
    assert value(samples, "goodput_run_client_dropped_events_total", run_id="drops", reason="buffer") == 7 + 3 + 1
    assert value(samples, "goodput_run_client_dropped_events_total", run_id="drops", reason="spool") == 2
    assert value(samples, "goodput_run_client_dropped_events_total", run_id="drops", reason="rejected") == 4
    assert value(samples, "goodput_fleet_client_dropped_events", reason="buffer") == 11
    assert value(samples, "goodput_fleet_client_send_failures") == 2


def test_only_running_and_recent_runs_are_labelled_running_first_and_capped(make_client) -> None:
    client = make_client(max_runs="2", run_window_h="1")
    assert client.post("/v1/events", json={"events": reference_s1()}).status_code == 200  # finished in 2023
    send_sim(client, "older", ago_s=1800.0)
    send_sim(client, "newer", ago_s=600.0)
    send_sim(client, "live", end="running", ago_s=3 * 3600.0)  # running: labelled however old
    samples = scrape(client)
    labelled = {dict(ls)["run_id"] for name, ls in samples if name == "goodput_run_allocated_gpu_seconds"}
    assert labelled == {"live", "newer"}
    assert value(samples, "goodput_metrics_unlabelled_runs") == 1  # "older": only in the fleet series
    assert value(samples, "goodput_fleet_runs", status="finished") == 2  # s1 is outside the window
    assert not names_with(samples, run_id="s1")


def test_a_scrape_within_the_ttl_reuses_the_snapshot(make_client, monkeypatch) -> None:
    client = make_client(cache_ttl_s="60")
    send_sim(client, "cached")
    first = scrape(client)
    send_sim(client, "later")
    second = scrape(client)
    assert client.app.state.metrics.snapshots.builds == 1
    assert names_with(first, run_id="cached") and not names_with(second, run_id="later")
    assert value(second, "goodput_collector_events_total", outcome="accepted") > \
        value(first, "goodput_collector_events_total", outcome="accepted")  # counters are never cached

    fresh = make_client(cache_ttl_s="0")
    scrape(fresh)
    assert names_with(scrape(fresh), run_id="later")
    assert fresh.app.state.metrics.snapshots.builds == 2
