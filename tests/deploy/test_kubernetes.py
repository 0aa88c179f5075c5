"""deploy/kubernetes/ without a cluster: every kustomization rendered by kubectl's Kustomize, every resource validated
against the schemas of the Kubernetes releases kubernetes-validate ships (core kinds) or its project's released CRD
(ServiceMonitor, PyTorchJob, JobSet), the references between resources checked, and the collector's commands (the
migrations Job, `goodput serve` as the Deployment runs it, its three probes) run here against PostgreSQL.
The training examples' commands run in tests/deploy/test_kubernetes_examples.py."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import yaml

from tests.conftest import create_postgres_database, drop_postgres_database
from tests.deploy import crd_schema
from tests.deploy.kube import (
    DEPLOY,
    KUBERNETES,
    one,
    operator_copy,
    pod_templates,
    render,
    validate_core,
    versions,
)
from tests.deploy.test_compose import DOCKERFILE, dockerfile_json, image_env
from tests.metrics.servers import binary, collector_then_prometheus, query, stop
from tests.test_cli import GOODPUT, env_with, free_port, wait_healthy

COLLECTOR_LABELS = {"app.kubernetes.io/name": "goodput", "app.kubernetes.io/component": "collector"}
CUSTOM_KINDS = {"ServiceMonitor", "PyTorchJob", "JobSet"}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """The three builds an operator applies or reads: the base alone, the production overlay (with its secret files
    written from their examples), the training examples."""
    copy = operator_copy(tmp_path_factory.mktemp("deploy"))
    return {name: render(copy / "kubernetes" / name) for name in ("base", "overlays/production", "examples")}


@pytest.fixture(scope="module")
def production(rendered: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return rendered["overlays/production"]


@pytest.fixture
def postgres_url(postgres_admin_url: str) -> Iterator[str]:
    url = create_postgres_database(postgres_admin_url)
    yield url
    drop_postgres_database(postgres_admin_url, url)


def all_docs(rendered: dict[str, list[dict[str, Any]]]) -> Iterator[dict[str, Any]]:
    for docs in rendered.values():
        yield from docs


def containers(obj: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for _, template in pod_templates(obj):
        yield from template["spec"].get("initContainers", [])
        yield from template["spec"]["containers"]


def test_every_kustomization_renders_what_it_lists(rendered: dict[str, list[dict[str, Any]]]) -> None:
    kinds = {name: sorted((d["kind"], d["metadata"]["name"]) for d in docs) for name, docs in rendered.items()}
    collector = [("ConfigMap", "goodput-grafana-dashboard"), ("ConfigMap", "goodput-grafana-datasource"),
                 ("Deployment", "goodput-collector"), ("Job", "goodput-db-upgrade"),
                 ("PodDisruptionBudget", "goodput-collector"), ("Service", "goodput-collector")]
    assert kinds["base"] == collector
    database = next(d["metadata"]["name"] for d in rendered["overlays/production"]
                    if d["kind"] == "Secret" and d["metadata"]["name"].startswith("goodput-database"))
    assert re.fullmatch(r"goodput-database-[a-z0-9]{10}", database)  # hashed: a new URL rolls the pods
    assert kinds["overlays/production"] == sorted([*collector, ("Namespace", "goodput"), ("Secret", database),
                                                   ("Secret", "goodput-metrics-token"),
                                                   ("ServiceMonitor", "goodput-collector")])
    assert kinds["examples"] == sorted([("ConfigMap", "goodput-launch-scripts"), ("JobSet", "pretrain-js-2026-12-04a"),
                                        ("PyTorchJob", "pretrain-2026-12-04a"), ("Role", "goodput-launch"),
                                        ("RoleBinding", "goodput-launch"), ("ServiceAccount", "goodput-launch")])
    assert {d["metadata"].get("namespace") for d in rendered["overlays/production"] if d["kind"] != "Namespace"} \
        == {"goodput"}
    assert {d["metadata"].get("namespace") for d in rendered["examples"]} == {"training"}


@pytest.mark.parametrize("version", versions())
def test_core_resources_validate_against_the_kubernetes_schemas(rendered: dict[str, list[dict[str, Any]]],
                                                                version: str) -> None:
    """Strict: an unknown or misspelt field fails, as `kubectl apply` (--validate=strict) refuses it. The pod
    templates inside the custom resources are core objects too: validated as the pods of a Job."""
    checked = 0
    for obj in all_docs(rendered):
        if obj["kind"] in CUSTOM_KINDS:
            for where, template in pod_templates(obj):
                name = f"{obj['metadata']['name']}-{where.lower()}"
                job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
                       "spec": {"template": template}}
                validate_core(job, version)
                checked += 1
        else:
            validate_core(obj, version)
            checked += 1
    assert checked == 22  # 19 core resources in the three builds + the 3 pod templates of the training jobs


def test_custom_resources_validate_against_their_released_crds(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """The CRD schemas vendored in tests/deploy/crds/ (their sources are in the files). CEL rules are not evaluated
    by jsonschema: the ones these objects reach are named here with why they hold."""
    holds = {
        "self == oldSelf": "a transition rule: checked when an object is updated, never on create",
        "!(has(self.startupPolicy) && self.startupPolicy.startupPolicyOrder == 'InOrder' && "
        "self.replicatedJobs.exists(x, has(x.dependsOn)))": "the JobSet sets neither startupPolicy nor dependsOn",
    }
    custom = [d for d in all_docs(rendered) if d["kind"] in CUSTOM_KINDS]
    assert sorted(d["kind"] for d in custom) == ["JobSet", "PyTorchJob", "ServiceMonitor"]
    for obj in custom:
        assert crd_schema.validate(obj) == [], obj["kind"]
        for path, rule in crd_schema.cel_rules(obj):
            assert rule in holds, f"{obj['kind']} {path}: CEL rule {rule!r} is not accounted for"
        validate_core({"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]},  # ObjectMeta
                      versions()[-1])
    jobset = one(custom, "JobSet")
    assert not jobset["spec"].get("startupPolicy")
    assert not any("dependsOn" in j for j in jobset["spec"]["replicatedJobs"])
    for kind in CUSTOM_KINDS:
        source = crd_schema.load(kind)["source"].split()
        assert len(source) == 4 and re.fullmatch(r"[0-9a-f]{40}", source[2]), source


@pytest.mark.parametrize(("kind", "change", "error"), [
    ("PyTorchJob", lambda o: o["spec"].update(pytorchReplicaSpec=o["spec"].pop("pytorchReplicaSpecs")),
     "'pytorchReplicaSpec' was unexpected"),
    ("PyTorchJob", lambda o: o["spec"]["pytorchReplicaSpecs"]["Worker"].update(replicas="1"), "is not of type"),
    ("JobSet", lambda o: o["spec"]["replicatedJobs"][0].update(replica=1), "'replica' was unexpected"),
    ("JobSet", lambda o: o["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
     .update(image=7), "is not of type"),
    ("ServiceMonitor", lambda o: o["spec"]["endpoints"][0].update(authorisation={}), "'authorisation' was unexpected"),
    ("ServiceMonitor", lambda o: o["spec"]["endpoints"][0]["authorization"]["credentials"].pop("key"),
     "'key' is a required property"),
])
def test_the_crd_check_refuses_what_the_api_server_would(rendered: dict[str, list[dict[str, Any]]], kind: str,
                                                         change: Any, error: str) -> None:
    obj = json.loads(json.dumps(one(list(all_docs(rendered)), kind)))
    change(obj)
    errors = crd_schema.validate(obj)
    assert any(error in e for e in errors), errors


def test_the_collector_deployment_service_pdb_and_servicemonitor_fit_together(production: list[dict[str, Any]]
                                                                              ) -> None:
    deployment, service = one(production, "Deployment"), one(production, "Service")
    pdb, monitor = one(production, "PodDisruptionBudget"), one(production, "ServiceMonitor")
    spec = deployment["spec"]
    assert spec["replicas"] >= 2 and spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pod = spec["template"]
    assert spec["selector"]["matchLabels"] == COLLECTOR_LABELS
    assert pod["metadata"]["labels"].items() >= COLLECTOR_LABELS.items()
    assert service["spec"]["selector"] == pdb["spec"]["selector"]["matchLabels"] == COLLECTOR_LABELS
    assert pdb["spec"]["minAvailable"] < spec["replicas"]
    (container,) = pod["spec"]["containers"]
    (http,) = container["ports"]
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] == http["name"] == "http" and port["port"] == http["containerPort"] == 8000
    args = container["args"]
    assert args[:1] == ["serve"] and args[args.index("--port") + 1] == "8000" and args[args.index("--host") + 1] == \
        "0.0.0.0"
    assert int(args[args.index("--workers") + 1]) >= 2  # PostgreSQL: several processes per pod
    # The ServiceMonitor scrapes this Service's pods on the named port, with the '*' token of the generated Secret.
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == port["name"] and endpoint["path"] == "/metrics"
    credentials = endpoint["authorization"]["credentials"]
    assert one(production, "Secret", credentials["name"])["data"].keys() == {credentials["key"]}
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/path"] == "/metrics"
    assert annotations["prometheus.io/port"] == str(http["containerPort"])


def test_every_pod_runs_as_the_images_user_under_the_restricted_pod_security_standard(
        production: list[dict[str, Any]]) -> None:
    """The namespace enforces `restricted`; runAsUser must be the image's numeric uid, since the Dockerfile's USER
    is a name the kubelet cannot check against runAsNonRoot (the pod would not start)."""
    assert one(production, "Namespace")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    uid = int(re.search(r"useradd [^\n]*--uid (\d+)", DOCKERFILE.read_text()).group(1))  # type: ignore[union-attr]
    images = set()
    for obj in (one(production, "Deployment"), one(production, "Job")):
        pod = obj["spec"]["template"]["spec"]
        security = pod["securityContext"]
        assert security["runAsNonRoot"] is True and security["runAsUser"] == uid
        assert security["seccompProfile"]["type"] == "RuntimeDefault" and pod["automountServiceAccountToken"] is False
        for container in pod["containers"]:
            own = container["securityContext"]
            assert own["allowPrivilegeEscalation"] is False and own["capabilities"]["drop"] == ["ALL"]
            assert own["readOnlyRootFilesystem"] is True
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            volumes = {v["name"]: v for v in pod["volumes"]}
            assert "emptyDir" in volumes[mounts["/tmp"]]  # the only place goodput serve writes (its metrics files)
            resources = container["resources"]
            assert {"cpu", "memory"} <= resources["requests"].keys() and "memory" in resources["limits"]
            (database,) = [e for e in container["env"] if e["name"] == "GOODPUT_DATABASE_URL"]
            ref = database["valueFrom"]["secretKeyRef"]
            assert ref["key"] in one(production, "Secret", ref["name"])["data"]  # the hashed, generated Secret
            images.add(container["image"])
    assert images == {"registry.example.com/goodput:0.1.0"}  # the overlay's image, for the Job as for the collectors


def datasource_uids(node: Any) -> set[str]:
    """The uids of every Prometheus datasource a Grafana dashboard's panels and variables name."""
    if isinstance(node, list):
        return set().union(*(datasource_uids(item) for item in node))
    if not isinstance(node, dict):
        return set()
    own = node.get("datasource")
    found = {own["uid"]} if isinstance(own, dict) and own.get("type") == "prometheus" else set()
    return found.union(*(datasource_uids(value) for value in node.values()))


def test_the_grafana_dashboard_configmap_is_generated_from_the_dashboard_file(production: list[dict[str, Any]]
                                                                              ) -> None:
    dashboard_file = DEPLOY / "grafana/dashboards/goodput.json"
    config_map = one(production, "ConfigMap", "goodput-grafana-dashboard")
    assert config_map["data"] == {"goodput.json": dashboard_file.read_text()}  # byte for byte
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    generator = yaml.safe_load((DEPLOY / "grafana/kustomization.yaml").read_text())["configMapGenerator"]
    assert generator[0]["files"] == ["dashboards/goodput.json"]  # the file compose provisions, not a copy
    assert not list(KUBERNETES.rglob("*.json")), "a copy of the dashboard under deploy/kubernetes"
    # The datasource the dashboard names, with the scrape interval as the floor of $__rate_interval.
    datasources = one(production, "ConfigMap", "goodput-grafana-datasource")
    assert datasources["metadata"]["labels"]["grafana_datasource"] == "1"
    (source,) = yaml.safe_load(datasources["data"]["goodput-prometheus.yaml"])["datasources"]
    assert datasource_uids(json.loads(dashboard_file.read_text())) == {source["uid"]}
    assert source["type"] == "prometheus" and source["isDefault"] is False
    assert source["jsonData"]["timeInterval"] == one(production, "ServiceMonitor")["spec"]["endpoints"][0]["interval"]


def test_no_token_is_ever_on_a_command_line(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """Command lines are readable by anyone who may list pods (and by `ps` on the node): tokens come from Secrets,
    as environment variables."""
    seen = 0
    for obj in all_docs(rendered):
        for container in containers(obj) if obj["kind"] in ("Deployment", "Job", *CUSTOM_KINDS) else ():
            line = " ".join([*container.get("command", []), *container.get("args", [])])
            assert "--token" not in line and not re.search(r"gp[rw]_", line), (obj["kind"], container["name"])
            for entry in container.get("env", []):
                if "TOKEN" in entry["name"]:
                    assert "secretKeyRef" in entry["valueFrom"], (obj["kind"], entry)
                    seen += 1
    assert seen == 3  # GOODPUT_TOKEN of the PyTorchJob's two replicas and of the JobSet
    text = "\n".join(p.read_text() for p in KUBERNETES.rglob("*") if p.is_file())
    assert not re.search(r"gp[rw]_[0-9a-f]", text)


def test_the_overlays_secret_files_stay_out_of_git() -> None:
    production = KUBERNETES / "overlays/production"
    generators = yaml.safe_load((production / "kustomization.yaml").read_text())["secretGenerator"]
    files = [*generators[0]["envs"], *(f.split("=")[-1] for f in generators[1]["files"])]
    assert files == ["database.env", "metrics-token"]
    for name in files:
        assert (production / f"{name}.example").exists()
        ignored = subprocess.run(["git", "check-ignore", "-q", str(production / name)], cwd=DEPLOY)
        assert ignored.returncode == 0, f"{name} is not ignored by git"


@pytest.mark.postgres
@pytest.mark.prometheus
def test_the_annotation_scrape_job_scrapes_each_collector_pod_with_the_metrics_token(
        production: list[dict[str, Any]], postgres_url: str, tmp_path: Path) -> None:
    """deploy/kubernetes/prometheus-kubernetes-pods.yml in a real Prometheus against a real collector that has
    tokens. Debian's Prometheus is built without Kubernetes discovery, so a file lists the target with the labels
    Kubernetes discovery gives a pod (its address, namespace, name and prometheus.io/* annotations, from the rendered
    Deployment, the port being this test's); the job's relabelling and token are the file's own."""
    config = yaml.safe_load((KUBERNETES / "prometheus-kubernetes-pods.yml").read_text())
    (job,) = config["scrape_configs"]
    (discovery,) = job.pop("kubernetes_sd_configs")
    assert discovery == {"role": "pod", "namespaces": {"names": [one(production, "Namespace")["metadata"]["name"]]}}
    assert job["scrape_interval"] == one(production, "ServiceMonitor")["spec"]["endpoints"][0]["interval"]
    pod = one(production, "Deployment")["spec"]["template"]["metadata"]
    with collector_then_prometheus(postgres_url, tmp_path) as servers:
        created = subprocess.run([*GOODPUT, "token", "create", "--project", "*", "--kind", "read", "--name",
                                  "prometheus", "--db", postgres_url], env=env_with(), capture_output=True,
                                 text=True, timeout=60)
        assert created.returncode == 0, created.stderr
        token = tmp_path / "token"
        token.write_text(created.stdout.strip())
        job["authorization"]["credentials_file"] = str(token)  # where the Secret is mounted, here
        meta = {f"__meta_kubernetes_pod_annotation_{re.sub('[^a-zA-Z0-9_]', '_', k)}": v
                for k, v in pod["annotations"].items()}
        meta["__meta_kubernetes_pod_annotation_prometheus_io_port"] = str(servers.port)
        targets = tmp_path / "pods.json"
        targets.write_text(json.dumps([{"targets": ["127.0.0.1:9"], "labels": {
            **meta, "__meta_kubernetes_namespace": "goodput", "__meta_kubernetes_pod_name": "goodput-collector-0"}}]))
        job["file_sd_configs"] = [{"files": [str(targets)], "refresh_interval": "1s"}]
        job["scrape_interval"] = "1s"  # (15 s in the file) this test's patience
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        check = subprocess.run([binary("promtool"), "check", "config", str(tmp_path / "prometheus.yml")],
                               capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        deadline = time.monotonic() + 30  # collectors see a new token within GOODPUT_AUTH_CACHE_TTL_S (5 s)
        while httpx.get(f"{servers.url}/metrics", timeout=10).status_code != 401:  # without the token: refused
            assert time.monotonic() < deadline, "the collector never started asking for a token"
            time.sleep(0.5)
        servers.start_prometheus(tmp_path / "prometheus.yml")
        (up,) = query(servers.prom_url, 'up{job="goodput"} == 1')
        assert up["metric"]["instance"] == f"127.0.0.1:{servers.port}"  # the port from the annotation
        assert up["metric"]["namespace"] == "goodput" and up["metric"]["pod"] == "goodput-collector-0"
        assert query(servers.prom_url, 'goodput_collector_write_queue_rows{job="goodput"}')


# -- the collector's commands, run here -------------------------------------------------------------------------


def probe(container: dict[str, Any], name: str, port: int) -> subprocess.CompletedProcess[str]:
    command = [arg.replace("127.0.0.1:8000", f"127.0.0.1:{port}") for arg in container[name]["exec"]["command"]]
    assert command[:2] == ["python", "-c"]
    return subprocess.run(command, env=image_env(), capture_output=True, text=True,
                          timeout=container[name]["timeoutSeconds"] + 5)


def set_connections(admin_url: str, url: str, allow: bool) -> None:
    """Make the collector's database unreachable (refuse new connections, end the open ones) or reachable again."""
    name = url.rsplit("/", 1)[1]
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {str(allow).lower()}')
        if not allow:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))


@pytest.mark.postgres
def test_the_migrations_job_the_collector_and_its_probes_run_here(production: list[dict[str, Any]],
                                                                  postgres_url: str, postgres_admin_url: str,
                                                                  tmp_path: Path) -> None:
    entrypoint = dockerfile_json("ENTRYPOINT")
    (job,) = one(production, "Job")["spec"]["template"]["spec"]["containers"]
    upgrade = subprocess.run([*entrypoint, *job["args"]], env=image_env(GOODPUT_DATABASE_URL=postgres_url),
                             capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert upgrade.returncode == 0, upgrade.stderr
    assert "at revision" in upgrade.stdout

    (container,) = one(production, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["startupProbe"]["exec"] == container["livenessProbe"]["exec"]
    port = free_port()
    args = [{"0.0.0.0": "127.0.0.1", "8000": str(port)}.get(a, a) for a in container["args"]]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    proc = subprocess.Popen([*entrypoint, *args], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=image_env(GOODPUT_DATABASE_URL=postgres_url, TMPDIR=str(tmp_path), **env))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        for name in ("startupProbe", "livenessProbe", "readinessProbe"):
            out = probe(container, name, port)
            assert out.returncode == 0, (name, out.stderr)
        # Why the probes run in the container: the kubelet connects from the node's address, which the collector
        # refuses until a token exists (a proxy on loopback saying who its client is stands for it here).
        remote = httpx.get(f"{url}/healthz", headers={"X-Forwarded-For": "10.0.0.7"}, timeout=10)
        assert remote.status_code == 403 and remote.json()["error"]["code"] == "auth_not_configured"

        # The database goes away: the pod leaves the Service (readiness fails) but is not restarted (liveness
        # holds), also once /healthz answers 503 (the token cache, GOODPUT_AUTH_CACHE_TTL_S, has expired).
        set_connections(postgres_admin_url, postgres_url, allow=False)
        codes = set()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and 503 not in codes:
            codes.add(httpx.get(f"{url}/healthz", timeout=10).status_code)
            ready, alive = probe(container, "readinessProbe", port), probe(container, "livenessProbe", port)
            assert ready.returncode != 0 and alive.returncode == 0, (ready.stderr, alive.stderr)
            time.sleep(1)
        assert 503 in codes, codes
        set_connections(postgres_admin_url, postgres_url, allow=True)
        deadline = time.monotonic() + 20
        while probe(container, "readinessProbe", port).returncode != 0:
            assert time.monotonic() < deadline, "the collector did not become ready again with its database back"
            time.sleep(0.5)
    finally:
        set_connections(postgres_admin_url, postgres_url, allow=True)
        stop(proc)
    dead = probe(container, "livenessProbe", port)
    assert dead.returncode != 0 and "Connection refused" in dead.stderr
