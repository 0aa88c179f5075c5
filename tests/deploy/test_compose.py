"""docker-compose.yml and the Dockerfile without Docker: the files parse and hold what production needs, and every
command they run works here against the local PostgreSQL (loopback addresses instead of service names)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import create_postgres_database, drop_postgres_database
from tests.metrics.servers import stop
from tests.test_cli import REPO, env_with, free_port, wait_healthy

COMPOSE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "Dockerfile"
VENV_BIN = Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")) / "bin"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def dockerfile_json(instruction: str) -> list[str]:
    """The exec-form (JSON array) arguments of the Dockerfile's last `instruction` (ENTRYPOINT, CMD, HEALTHCHECK)."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    lines = [line for line in text.splitlines() if line.startswith(instruction + " ")]
    assert lines, f"no {instruction} in the Dockerfile"
    import json

    return json.loads(lines[-1][lines[-1].index("["):])


def local(argv: list[str], replacements: dict[str, str]) -> list[str]:
    out = []
    for arg in argv:
        for old, new in replacements.items():
            arg = arg.replace(old, new)
        out.append(arg)
    return out


def test_compose_file_has_the_production_services(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"postgres", "collector", "collector-2", "loadbalancer", "dashboard", "prometheus",
                             "grafana"}
    pg = services["postgres"]
    assert pg["image"].startswith("postgres:15")
    assert "pgdata:/var/lib/postgresql/data" in pg["volumes"] and "pgdata" in compose["volumes"]
    assert "pg_isready" in " ".join(pg["healthcheck"]["test"])
    collector = services["collector"]
    assert collector["build"] == "." and collector["command"][0] == "serve"
    command = collector["command"]
    assert command[command.index("--workers") + 1] == "4" and "--no-dashboard" in command
    assert command[command.index("--host") + 1] == "0.0.0.0"
    assert collector["environment"]["GOODPUT_DATABASE_URL"].startswith("postgresql://")
    assert "@postgres:5432/" in collector["environment"]["GOODPUT_DATABASE_URL"]
    assert collector["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["collector-2"] == collector  # the same collector again, on the same database
    dashboard = services["dashboard"]
    assert dashboard["entrypoint"] == ["python", "-m", "dashboards"]
    assert dashboard["command"][dashboard["command"].index("--api") + 1] == "http://loadbalancer:8000"
    assert dashboard["depends_on"]["loadbalancer"]["condition"] == "service_healthy"
    prometheus = services["prometheus"]
    assert "./deploy/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in prometheus["volumes"]
    assert "promdata:/prometheus" in prometheus["volumes"]
    scrape = yaml.safe_load((REPO / "deploy/prometheus.yml").read_text())["scrape_configs"][0]
    assert scrape["static_configs"][0]["targets"] == ["collector:8000", "collector-2:8000"]  # each, not the balancer
    assert scrape["metrics_path"] == "/metrics" and scrape["scrape_interval"] == "15s"


NGINX_CONF = REPO / "deploy/nginx.conf"


def test_the_load_balancer_sends_to_every_collector_and_is_the_only_published_api_port(compose: dict[str, Any]) -> None:
    services = compose["services"]
    collectors = sorted(name for name, svc in services.items() if svc.get("command", [None])[0] == "serve")
    assert collectors == ["collector", "collector-2"]
    lb = services["loadbalancer"]
    assert lb["image"].startswith("nginx:")
    assert "./deploy/nginx.conf:/etc/nginx/nginx.conf:ro" in lb["volumes"] and NGINX_CONF.exists()
    assert lb["ports"] == ["8000:8000"]
    assert all("ports" not in services[c] and services[c]["expose"] == ["8000"] for c in collectors)
    assert {name: dep["condition"] for name, dep in lb["depends_on"].items()} == dict.fromkeys(collectors,
                                                                                           "service_healthy")
    conf = NGINX_CONF.read_text()
    upstream = re.search(r"upstream goodput_collectors \{(.*?)\}", conf, re.DOTALL)
    assert upstream is not None
    assert re.findall(r"^\s*server (\S+?):8000\b", upstream.group(1), re.MULTILINE) == collectors
    assert re.search(r"^\s*listen 8000;", conf, re.MULTILINE)
    assert "proxy_pass http://goodput_collectors;" in conf
    assert re.search(r"proxy_next_upstream [^;]*\bnon_idempotent\b", conf)  # POST /v1/events fails over
    health = lb["healthcheck"]["test"]
    assert health[:2] == ["CMD", "wget"] and health[-1] == "http://127.0.0.1:8000/nginx-healthz"
    assert "location = /nginx-healthz" in conf


def localized_nginx_conf(folder: Path, backends: list[int], port: int) -> Path:
    """deploy/nginx.conf as it runs here: the collectors at loopback ports, nginx's files in `folder`."""
    conf = NGINX_CONF.read_text()
    for name, backend in zip(("collector", "collector-2"), backends, strict=True):
        conf = conf.replace(f"server {name}:8000 ", f"server 127.0.0.1:{backend} ")
    conf = conf.replace("listen 8000;", f"listen 127.0.0.1:{port};").replace("pid /tmp/nginx.pid;",
                                                                            f"pid {folder}/nginx.pid;")
    temp = " ".join(f"{kind}_temp_path {folder}/{kind};" for kind in ("client_body", "proxy", "fastcgi", "uwsgi",
                                                                        "scgi"))
    conf = conf.replace("http {", "http {\n    " + temp, 1)
    path = folder / "nginx.conf"
    path.write_text(conf)
    return path


def nginx_binary() -> str:
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if nginx is None:
        pytest.fail("nginx not found: apt-get install nginx-light (scripts/system-deps.sh does it)")
    return nginx


def test_nginx_accepts_the_load_balancer_config(tmp_path: Path) -> None:
    out = subprocess.run([nginx_binary(), "-t", "-p", str(tmp_path), "-c",
                          str(localized_nginx_conf(tmp_path, [free_port(), free_port()], free_port()))],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "test is successful" in out.stderr


def test_docker_compose_config_accepts_the_file_when_available(tmp_path: Path) -> None:
    docker = shutil.which("docker")
    probe = subprocess.run([docker, "compose", "version"], capture_output=True, text=True) if docker else None
    if docker is None or probe is None or probe.returncode != 0:
        pytest.skip("the docker compose plugin is not installed here; the YAML structure is checked above")
    out = subprocess.run([docker, "compose", "-f", str(COMPOSE), "config", "--quiet"], capture_output=True, text=True,
                         cwd=REPO)
    assert out.returncode == 0, out.stderr


def test_dockerfile_runs_goodput_serve_as_a_non_root_user() -> None:
    text = DOCKERFILE.read_text()
    assert re.search(r"^FROM python:3\.11-slim$", text, re.MULTILINE)
    assert re.search(r'pip install -e "\.\[server\]"', text)
    users = re.findall(r"^USER (\S+)$", text, re.MULTILINE)
    assert users and users[-1] not in ("root", "0")
    assert dockerfile_json("ENTRYPOINT") == ["goodput"]
    assert dockerfile_json("CMD")[0] == "serve"
    for path in re.findall(r"^COPY (\S+) ", text, re.MULTILINE):
        assert (REPO / path).exists(), f"the Dockerfile copies {path}, which does not exist"


def test_prometheus_config_and_alert_rules_are_valid(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found: apt-get install prometheus (scripts/system-deps.sh does it)")
    deploy = tmp_path / "deploy"  # as an operator has it: the read token written next to the config
    shutil.copytree(REPO / "deploy", deploy)
    (deploy / "goodput-read-token").write_text("gpr_000000000000_example")
    out = subprocess.run([promtool, "check", "config", str(deploy / "prometheus.yml")], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout + out.stderr


@pytest.fixture
def postgres_url(postgres_admin_url: str) -> Iterator[str]:
    url = create_postgres_database(postgres_admin_url)
    yield url
    drop_postgres_database(postgres_admin_url, url)


def image_env(**env: str) -> dict[str, str]:
    full_env = env_with(**env)
    full_env["PATH"] = f"{VENV_BIN}{os.pathsep}{full_env.get('PATH', '')}"  # `goodput` and `python` as in the image
    return full_env


def start(argv: list[str], cwd: Path, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, cwd=cwd, env=image_env(**env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with httpx.Client() as fresh:  # a new connection: the kernel may hand it to any worker
        text = fresh.get(f"{url}/metrics", timeout=30).text
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_every_compose_command_runs_here_against_postgresql(compose: dict[str, Any], postgres_url: str,
                                                            tmp_path: Path) -> None:
    services = compose["services"]
    pg = services["postgres"]["healthcheck"]["test"]
    pg_isready = shutil.which("pg_isready") or next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_isready"))),
                                                    None)
    if pg_isready is None:
        pytest.fail("pg_isready not found (Debian package postgresql-client)")
    ready = shlex.split(pg[1])
    ready = [str(pg_isready), "-h", "127.0.0.1", *local(ready[1:], {"goodput": "postgres"})]
    assert subprocess.run(ready, capture_output=True, timeout=30).returncode == 0

    port, dash_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    replacements = {"0.0.0.0": "127.0.0.1", "8000": str(port), "8050": str(dash_port),
                    "http://loadbalancer:": "http://127.0.0.1:"}  # (the dashboard here asks the collector directly)
    entrypoint = dockerfile_json("ENTRYPOINT")
    collector = start([*entrypoint, *local(services["collector"]["command"], replacements)], tmp_path,
                      GOODPUT_DATABASE_URL=postgres_url, PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "metrics"),
                      GOODPUT_METRICS_CACHE_TTL_S="0")
    dashboard: subprocess.Popen[bytes] | None = None
    try:
        wait_healthy(url, collector)
        health = dockerfile_json("HEALTHCHECK")  # HEALTHCHECK ... CMD ["python", "-c", ...]
        assert health[0] == "python"
        assert subprocess.run(health, env=image_env(GOODPUT_PORT=str(port)), timeout=30).returncode == 0

        # Several workers: batches land on different processes; every scrape sees all of them.
        from services.simulate import SimConfig, simulate

        events = simulate(SimConfig(run_id="compose-run", ranks=4, hours=0.05, mtbf_s=100.0, seed=5,
                                    start_time=time.time() - 3600)).events
        accepted = 0
        for i in range(0, len(events), 20):
            with httpx.Client() as fresh:
                body = fresh.post(f"{url}/v1/events", json={"events": events[i:i + 20]}, timeout=60).json()
            accepted += body["accepted"]
        files = list((tmp_path / "metrics").glob("counter_*.db"))
        assert len(files) >= 2, f"the batches all reached one worker ({files}); expected several of 4"
        ledger = httpx.get(f"{url}/v1/runs/compose-run/waste", timeout=60).json()
        for _ in range(12):
            samples = scrape(url)
            assert samples[("goodput_collector_events_total", frozenset({("outcome", "accepted")}))] == accepted
            ratio = ("goodput_run_goodput_ratio", frozenset({("run_id", "compose-run"), ("project", "default")}))
            assert samples[ratio] == ledger["goodput"]

        dashboard = start(local(services["dashboard"]["entrypoint"], {}) +
                          local(services["dashboard"]["command"], replacements), tmp_path)
        dash_url = f"http://127.0.0.1:{dash_port}/"
        deadline = time.monotonic() + 60
        assert dashboard.stdout is not None
        while True:
            assert dashboard.poll() is None, dashboard.stdout.read().decode()
            try:
                if httpx.get(dash_url, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the dashboard command did not start serving"
            time.sleep(0.3)
        dash_health = local(services["dashboard"]["healthcheck"]["test"][1:], replacements)
        assert subprocess.run(dash_health, env=image_env(), timeout=30).returncode == 0
    finally:
        if dashboard is not None:
            stop(dashboard)
        stop(collector)


@pytest.mark.postgres
def test_through_the_load_balancer_a_killed_collector_loses_no_batch(postgres_url: str, tmp_path: Path) -> None:
    """deploy/nginx.conf for real in front of two `goodput serve` on one database: one is SIGKILLed halfway
    through; the batches sent through nginx are acknowledged (nginx passes a failed POST to the other collector,
    the client resends what was still not acknowledged) and every event is stored once."""
    from ingest_client.transport.base import SendStatus
    from ingest_client.transport.http import HttpTransport
    from services.simulate import SimConfig, simulate
    from services.storage.db import make_engine
    from services.storage.step_columns import stored_step_keys
    from tests.faults.conftest import Collector

    collectors = [Collector(postgres_url, tmp_path, name=f"serve-{i}") for i in (1, 2)]
    lb_port = free_port()
    conf = localized_nginx_conf(tmp_path, [c.port for c in collectors], lb_port)
    nginx = subprocess.Popen([nginx_binary(), "-p", str(tmp_path), "-c", str(conf), "-g", "daemon off;"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        for c in collectors:
            c.start()
        events = simulate(SimConfig(run_id="behind-nginx", ranks=4, hours=0.1, mtbf_s=None, seed=3,
                                    records_per_rank=10, start_time=float(int(time.time()) - 3600))).events
        batches = [[json.dumps(e).encode() for e in events[i:i + 10]] for i in range(0, len(events), 10)]
        transport = HttpTransport(f"http://127.0.0.1:{lb_port}/v1/events", timeout_s=30)
        acknowledged = resent = 0
        for b, batch in enumerate(batches):
            if b == len(batches) // 2:
                collectors[0].kill()
            for _ in range(20):
                result = transport.send(batch)
                assert result.status is not SendStatus.REJECTED, result.message
                if result.status is SendStatus.OK:
                    break
                resent += 1
                time.sleep(0.2)
            else:
                raise AssertionError(f"batch {b} never acknowledged through nginx: {result.message}")
            acknowledged += 1
        assert acknowledged == len(batches)
        with httpx.Client() as client:
            ledger = client.get(f"http://127.0.0.1:{lb_port}/v1/runs/behind-nginx/waste", timeout=120)
        assert ledger.status_code == 200, ledger.text
        # every event once: a step record's id goes when its rows move into block rows and heartbeats are thinned
        # (services.storage.moved_repeats), so those are checked by their rows
        with psycopg.connect(postgres_url) as conn:
            ids = [r[0] for r in conn.execute("SELECT event_id FROM events").fetchall()]
        kept = {e["event_id"] for e in events if e["kind"] not in ("steps", "heartbeat")}
        assert len(ids) == len(set(ids)) and kept <= set(ids), f"{resent} sends repeated by the client"
        engine = make_engine(postgres_url)
        with engine.connect() as conn:
            steps = stored_step_keys(conn, "behind-nginx")
        engine.dispose()
        sent = sorted((e["attempt"], e["rank"], s) for e in events if e["kind"] == "steps" for s in e["step"])
        assert sorted(steps[["attempt", "rank", "step"]].itertuples(index=False, name=None)) == sent, (
            f"{resent} sends repeated by the client")
    finally:
        nginx.terminate()
        nginx.wait(10)
        for c in collectors:
            c.stop()
