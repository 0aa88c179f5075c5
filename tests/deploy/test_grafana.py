"""Grafana in docker-compose.yml, without Docker: the official image at a pinned tag, the provisioning files it
mounts (a datasource pointing at the compose Prometheus, a dashboards provider whose path is where the dashboard
JSON is mounted) and the dashboard's structure. Its queries are run against a real Prometheus in
tests/metrics/test_grafana_queries.py."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from tests.test_cli import REPO

COMPOSE = REPO / "docker-compose.yml"
GRAFANA = REPO / "deploy/grafana"
DASHBOARD = GRAFANA / "dashboards/goodput.json"
GRID_COLUMNS = 24


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def mounts(service: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Container path -> (host path relative to the compose file, or a volume name; mode) of a service."""
    out = {}
    for volume in service["volumes"]:
        source, target, *mode = volume.split(":")
        out[target] = (source, mode[0] if mode else "rw")
    return out


def host_path(source: str) -> Path:
    assert source.startswith("./"), f"{source}: a bind mount of this repository's files expected"
    return REPO / source


def provisioned(compose: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    """The YAML documents Grafana reads from /etc/grafana/provisioning/<kind>/ in the container."""
    source, mode = mounts(compose["services"]["grafana"])["/etc/grafana/provisioning"]
    assert mode == "ro"
    files = sorted((host_path(source) / kind).glob("*.yml")) + sorted((host_path(source) / kind).glob("*.yaml"))
    assert files, f"no {kind} provisioning file under {source}/{kind}"
    docs = [yaml.safe_load(f.read_text()) for f in files]
    assert all(doc["apiVersion"] == 1 for doc in docs)
    return docs


def datasource(compose: dict[str, Any]) -> dict[str, Any]:
    sources = [ds for doc in provisioned(compose, "datasources") for ds in doc["datasources"]]
    assert len(sources) == 1, sources
    return sources[0]


def test_grafana_runs_the_official_image_at_a_pinned_version(compose: dict[str, Any]) -> None:
    grafana = compose["services"]["grafana"]
    image, _, tag = grafana["image"].partition(":")
    assert image in ("grafana/grafana", "grafana/grafana-oss")
    assert re.fullmatch(r"\d+\.\d+\.\d+", tag), f"pin a release, not {tag!r}"
    assert grafana["ports"] == ["3000:3000"]
    assert "grafanadata" in compose["volumes"] and mounts(grafana)["/var/lib/grafana"] == ("grafanadata", "rw")
    assert grafana["environment"]["GF_SECURITY_ADMIN_PASSWORD"].startswith("${GOODPUT_GRAFANA_ADMIN_PASSWORD")
    assert grafana["depends_on"]["prometheus"]["condition"] == "service_healthy"
    for name in ("prometheus", "grafana"):
        health = compose["services"][name]["healthcheck"]["test"]
        assert health[:2] == ["CMD", "wget"] and health[-1].startswith("http://127.0.0.1:")


def test_the_datasource_is_the_compose_prometheus(compose: dict[str, Any]) -> None:
    ds = datasource(compose)
    assert ds["type"] == "prometheus" and ds["access"] == "proxy" and ds["uid"]
    url = urlsplit(ds["url"])
    assert url.scheme == "http" and url.hostname in compose["services"]
    prometheus = compose["services"][url.hostname]
    assert prometheus["image"].startswith("prom/prometheus:")
    listen = next((a.split("=", 1)[1] for a in prometheus.get("command", []) if a.startswith("--web.listen-address=")),
                  ":9090")
    assert url.port == int(listen.rsplit(":", 1)[1])
    scrape = yaml.safe_load((REPO / "deploy/prometheus.yml").read_text())["scrape_configs"][0]["scrape_interval"]
    assert ds["jsonData"]["timeInterval"] == scrape  # $__rate_interval never shorter than four scrapes


def test_the_dashboards_provider_reads_the_mounted_dashboard(compose: dict[str, Any]) -> None:
    providers = [p for doc in provisioned(compose, "dashboards") for p in doc["providers"]]
    assert len(providers) == 1
    provider = providers[0]
    assert provider["type"] == "file" and provider["folder"]
    source, mode = mounts(compose["services"]["grafana"])[provider["options"]["path"]]
    assert mode == "ro" and host_path(source).resolve() == DASHBOARD.parent.resolve()
    home = compose["services"]["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{provider['options']['path']}/{DASHBOARD.name}"


def all_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # a collapsed row keeps its panels inside
    return out


def test_dashboard_json_is_a_provisionable_grafana_dashboard(dashboard: dict[str, Any]) -> None:
    assert isinstance(dashboard["schemaVersion"], int) and 36 <= dashboard["schemaVersion"] <= 42
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", dashboard["uid"]) and dashboard["title"]
    assert dashboard["id"] is None  # Grafana assigns it; a provisioned file must not carry another one's
    panels = all_panels(dashboard)
    ids = [p["id"] for p in panels]
    assert all(isinstance(i, int) and i > 0 for i in ids) and len(ids) == len(set(ids)), ids
    for panel in panels:
        grid = panel["gridPos"]
        assert set(grid) == {"h", "w", "x", "y"} and all(isinstance(v, int) and v >= 0 for v in grid.values())
        assert grid["w"] > 0 and grid["h"] > 0 and grid["x"] + grid["w"] <= GRID_COLUMNS, panel["title"]
    for i, a in enumerate(panels):  # no two panels on the same cell
        for b in panels[i + 1:]:
            ga, gb = a["gridPos"], b["gridPos"]
            overlap = (ga["x"] < gb["x"] + gb["w"] and gb["x"] < ga["x"] + ga["w"]
                       and ga["y"] < gb["y"] + gb["h"] and gb["y"] < ga["y"] + ga["h"])
            assert not overlap, (a["title"], b["title"])


def test_every_query_of_the_dashboard_uses_the_provisioned_datasource(compose: dict[str, Any],
                                                                     dashboard: dict[str, Any]) -> None:
    uid = datasource(compose)["uid"]
    queried = [p for p in all_panels(dashboard) if p["type"] != "row"]
    assert queried and all(p["targets"] for p in queried)
    for panel in queried:
        assert panel["datasource"] == {"type": "prometheus", "uid": uid}, panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for t in panel["targets"]:
            assert t["datasource"] == {"type": "prometheus", "uid": uid} and t["expr"].strip(), panel["title"]
    variables = dashboard["templating"]["list"]
    assert [v["name"] for v in variables] == ["project"]
    assert variables[0]["datasource"] == {"type": "prometheus", "uid": uid}
    assert variables[0]["allValue"] == ".*"  # what the queries' project=~"$project" matches with "All"


def test_the_dashboard_covers_goodput_waste_hangs_and_the_collector(dashboard: dict[str, Any]) -> None:
    rows = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    assert rows == ["Fleet goodput", "Waste", "Hung runs", "Collector health"]
    exprs = " ".join(t["expr"] for p in all_panels(dashboard) for t in p.get("targets", []))
    for metric in ("goodput_fleet_goodput_ratio", "goodput_fleet_waste_gpu_seconds", "goodput_run_waste_gpu_seconds",
                   "goodput_run_hung", "goodput_fleet_hung_runs", "goodput_run_info",
                   "goodput_collector_request_duration_seconds_bucket", "goodput_collector_rejected_batches_total",
                   "goodput_collector_write_queue_rows"):
        assert metric in exprs, metric
    assert "by (project" in exprs and "by (category" in exprs
