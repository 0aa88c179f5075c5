"""The Grafana dashboard (deploy/grafana/dashboards/goodput.json) against a real Prometheus scraping a real
`goodput serve` (PostgreSQL, 2 workers, access tokens on) the way deploy/prometheus.yml has it: three projects'
runs (one with restarts and a straggler, one hung, one on more GPUs than ranks) and a rejected batch; then every
query of every panel, and the project variable's, returns data; promtool lints the exposition and finds every
metric the dashboard names."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.metrics.servers import binary, collector_then_prometheus, query
from tests.metrics.test_metrics_endpoint import send_sim
from tests.test_cli import REPO

pytestmark = pytest.mark.prometheus

DASHBOARD = REPO / "deploy/grafana/dashboards/goodput.json"
PROJECTS = ("vision", "nlp", "speech")
# What Grafana puts in for the dashboard's variables: the project variable's "All", and a rate window of a few
# scrapes (1 s here; Grafana's $__rate_interval is at least four scrape intervals).
ALL_PROJECTS = {"$project": ".*", "$__rate_interval": "15s"}


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of every panel, rows' nested panels included."""
    board = json.loads(DASHBOARD.read_text())
    panels = [p for top in board["panels"] for p in (top, *top.get("panels", []))]
    return [(p["title"], t["expr"]) for p in panels for t in p.get("targets", [])]


def filled(expr: str, values: dict[str, str]) -> str:
    for name, value in values.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"a dashboard variable the test does not fill in: {expr}"
    return expr


def metric_names(expr: str) -> set[str]:
    names = set(re.findall(r"\bgoodput_\w+", expr))
    if re.search(r"\bup\{", expr):
        names.add("up")
    return names


def create_tokens(database_url: str) -> dict[str, str]:
    """A write token per project, and Prometheus's read token of every project ('*')."""
    from services.storage.db import make_engine
    from services.storage.migrate import upgrade
    from services.storage.tokens import create_token

    engine = make_engine(database_url)
    try:
        upgrade(engine)
        with engine.begin() as conn:
            tokens = {p: create_token(conn, kind="write", project=p, name=f"{p} trainers")[0] for p in PROJECTS}
            tokens["*"] = create_token(conn, kind="read", project="*", name="prometheus")[0]
    finally:
        engine.dispose()
    return tokens


def local_prometheus_config(folder: Path, port: int, read_token: str) -> Path:
    """deploy/prometheus.yml (and its alert rules) as it runs here: the collector on a loopback port, scraped
    every second, with the read token next to the config as an operator writes it."""
    for name in ("prometheus.yml", "goodput-alerts.yml"):
        shutil.copy(REPO / "deploy" / name, folder / name)
    (folder / "goodput-read-token").write_text(read_token)
    config = yaml.safe_load((folder / "prometheus.yml").read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    scrape = config["scrape_configs"][0]
    scrape.update(scrape_interval="1s", scrape_timeout="1s")
    scrape["static_configs"] = [{"targets": [f"127.0.0.1:{port}"]}]
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    return folder / "prometheus.yml"


def seed(url: str, tokens: dict[str, str]) -> None:
    def client(project: str) -> httpx.Client:
        return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {tokens[project]}"}, timeout=120)

    with client("vision") as vision:
        send_sim(vision, "vision-restarts", straggler_rank=1)  # finished 10 min ago: restarts, a straggler
        assert vision.post("/v1/events", content=b"{not json").status_code == 400  # an ingest error
    with client("nlp") as nlp:
        send_sim(nlp, "nlp-hung", end="running", ago_s=120.0)  # no step for 2 min, threshold 30 s: hung
    with client("speech") as speech:
        send_sim(speech, "speech-done", ago_s=300.0, gpus=6)  # 4 ranks on 6 GPUs: idle waste


def test_every_grafana_panel_query_returns_data_from_the_real_prometheus(postgres_url: str, tmp_path: Path) -> None:
    promtool = binary("promtool")
    tokens = create_tokens(postgres_url)
    with collector_then_prometheus(postgres_url, tmp_path) as servers:
        url, port, prom_url = servers.url, servers.port, servers.prom_url
        seed(url, tokens)
        config = local_prometheus_config(tmp_path, port, tokens["*"])
        check = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        servers.start_prometheus(config)
        # scraped with the read token (an unauthenticated scrape would be refused, and `up` 0)
        assert query(prom_url, 'up{job="goodput-collector"} == 1')
        query(prom_url, 'count_over_time(goodput_collector_events_total{outcome="accepted"}[15s]) > 4')
        # every run's ledger built: the analyst process builds them in rounds (15 s apart, most recent run first,
        # a share of the round each), and /metrics labels a run once its ledger is stored; under CI's load the
        # first run seeded can come a round later than the others
        query(prom_url, f"count(count by (project) (goodput_run_info)) == {len(PROJECTS)}", timeout_s=90)

        queries = dashboard_queries()
        empty = []
        for title, expr in queries:
            try:
                query(prom_url, filled(expr, ALL_PROJECTS), timeout_s=20)
            except AssertionError:
                empty.append(f"{title}: {expr}")
        assert not empty, "panel queries without data:\n" + "\n".join(empty)
        per_project = [expr for _, expr in queries if "$project" in expr]
        for expr in per_project:  # one project chosen: its series only
            result = query(prom_url, filled(expr, {**ALL_PROJECTS, "$project": "nlp"}))
            assert {r["metric"].get("project", "nlp") for r in result} == {"nlp"}, expr

        values = httpx.get(f"{prom_url}/api/v1/label/project/values", params={"match[]": "goodput_run_info"},
                           timeout=10).json()["data"]  # the dashboard's project variable
        assert sorted(values) == sorted(PROJECTS)
        hung = next(expr for title, expr in queries if title == "Hung runs: seconds since progress")
        (row,) = query(prom_url, filled(hung, ALL_PROJECTS))
        assert (row["metric"]["run_id"], row["metric"]["project"], row["metric"]["gpus"]) == ("nlp-hung", "nlp", "4")
        assert float(row["value"][1]) >= 120.0
        statuses = query(prom_url, filled(next(e for t, e in queries if t == "Runs by project and status"),
                                          ALL_PROJECTS))
        assert sorted((r["metric"]["project"], r["metric"]["status"], r["value"][1]) for r in statuses) == [
            ("nlp", "running", "1"), ("speech", "finished", "1"), ("vision", "finished", "1")]
        worst = query(prom_url, filled(next(e for t, e in queries if t == "Runs wasting the most (GPU-hours)"),
                                       ALL_PROJECTS))
        assert {r["metric"]["run_id"]: (r["metric"]["world_size"], r["metric"]["gpus"]) for r in worst} == {
            "vision-restarts": ("4", "4"), "nlp-hung": ("4", "4"), "speech-done": ("4", "6")}

        # promtool: the exposition follows Prometheus's naming rules, and holds every metric the dashboard names
        with httpx.Client() as fresh:
            exposition = fresh.get(f"{url}/metrics", headers={"Authorization": f"Bearer {tokens['*']}"},
                                   timeout=30).text
        lint = subprocess.run([promtool, "check", "metrics"], input=exposition, capture_output=True, text=True)
        assert lint.returncode == 0 and not lint.stdout.strip(), lint.stdout + lint.stderr
        exposed = {s.name for family in text_string_to_metric_families(exposition) for s in family.samples}
        named = set().union(*(metric_names(expr) for _, expr in queries)) - {"up"}
        assert named <= exposed, sorted(named - exposed)
        for name in sorted(named):
            out = subprocess.run([promtool, "query", "series", prom_url, f"--match={name}"], capture_output=True,
                                 text=True, timeout=30)
            assert out.returncode == 0 and name in out.stdout, f"{name}: {out.stdout}{out.stderr}"
