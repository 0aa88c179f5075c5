"""The training examples of deploy/kubernetes/examples/ run here as their pods would: each container's environment
resolved from the manifest as the kubelet resolves it (downward API labels, the Secret, what the training-operator or
an Indexed Job adds), its command run as written, the init container against an HTTPS server that answers the one
Kubernetes API request it makes (GET of the job, with the service account's token and CA), the workers' command
under a real `goodput launch` sending to a real collector, torchrun's part replaced by a one-node torchrun of
examples/train_ddp.py (there are no GPUs and no second node here). No cluster is involved."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.deploy.kube import KUBERNETES, argv, container_env, one, render
from tests.deploy.test_compose import image_env
from tests.test_cli import GOODPUT, env_with, free_port
from tests.torchrun.conftest import EXAMPLE, TORCHRUN, start_collector

EXAMPLES = KUBERNETES / "examples"
NAMESPACE = "training"
SA_TOKEN = "eyJhbGciOiJSUzI1NiJ9.service-account"
KUBELET_ENV = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}


@pytest.fixture(scope="module")
def examples() -> list[dict[str, Any]]:
    return render(EXAMPLES)


class ApiServer:
    """HTTPS on 127.0.0.1 with a certificate of its own: GET of the objects it holds, for the bearer token of the
    service account bound to the Role of launch-rbac.yaml (401 for another token, 403 outside the Role, 404 for an
    object it does not hold), answered with the JSON the Kubernetes API sends."""

    def __init__(self, folder: Path, allowed: set[str]) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        if shutil.which("openssl") is None:
            pytest.fail("openssl not found: apt-get install openssl (it makes the test API server's certificate)")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                        "/CN=kubernetes", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout",
                        str(folder / "key.pem"), "-out", str(folder / "ca.crt")], check=True, capture_output=True)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.requests.append((self.path, self.headers.get("Authorization", "")))
                plural = self.path.split("/")[2] + "/" + self.path.split("/")[-2] if self.path.count("/") > 4 else ""
                if self.headers.get("Authorization") != f"Bearer {SA_TOKEN}":
                    self.answer(401, {"kind": "Status", "status": "Failure", "reason": "Unauthorized", "code": 401})
                elif plural not in allowed:
                    self.answer(403, {"kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403,
                                      "message": f"cannot get resource {plural} in namespace {NAMESPACE}"})
                elif self.path in server.objects:
                    self.answer(200, server.objects[self.path])
                else:
                    self.answer(404, {"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404})

            def answer(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.port = free_port()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(folder / "ca.crt", folder / "key.pem")
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.service_account = folder / "serviceaccount"
        self.service_account.mkdir()
        (self.service_account / "token").write_text(SA_TOKEN)
        (self.service_account / "namespace").write_text(NAMESPACE)
        (self.service_account / "ca.crt").write_text((folder / "ca.crt").read_text())

    def hold(self, job: dict[str, Any], created: str) -> None:
        group, version = job["apiVersion"].split("/")
        plural = {"PyTorchJob": "pytorchjobs", "JobSet": "jobsets"}[job["kind"]]
        path = f"/apis/{group}/{version}/namespaces/{NAMESPACE}/{plural}/{job['metadata']['name']}"
        self.objects[path] = {**job, "metadata": {**job["metadata"], "creationTimestamp": created,
                                                  "uid": "3c9c1c53-64a1-4f0e-9f3e-1b2f6d0b7a11"}}

    def env(self) -> dict[str, str]:
        return {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(self.port)}

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def api_server(tmp_path: Path) -> Iterator[ApiServer]:
    server = ApiServer(tmp_path, allowed={"kubeflow.org/pytorchjobs", "jobset.x-k8s.io/jobsets"})
    yield server
    server.close()


def test_the_role_lets_the_pods_read_exactly_the_two_jobs(examples: list[dict[str, Any]]) -> None:
    role, binding = one(examples, "Role"), one(examples, "RoleBinding")
    assert role["rules"] == [{"apiGroups": ["kubeflow.org"], "resources": ["pytorchjobs"], "verbs": ["get"]},
                             {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"], "verbs": ["get"]}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "goodput-launch", "namespace": NAMESPACE}]
    scripts = one(examples, "ConfigMap", "goodput-launch-scripts")
    assert scripts["data"] == {"submitted_at.py": (EXAMPLES / "submitted_at.py").read_text()}
    for kind in ("PyTorchJob", "JobSet"):
        for pod in pods(one(examples, kind)):
            assert pod["spec"]["serviceAccountName"] == "goodput-launch"
            (init,) = pod["spec"]["initContainers"]
            (main,) = pod["spec"]["containers"]
            assert init["image"] == main["image"]  # the training image: Python, and no second image to pull
            volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
            assert volumes["goodput-scripts"]["configMap"]["name"] == scripts["metadata"]["name"]
            assert "emptyDir" in volumes["goodput"]


def pods(job: dict[str, Any]) -> list[dict[str, Any]]:
    if job["kind"] == "PyTorchJob":
        return [spec["template"] for spec in job["spec"]["pytorchReplicaSpecs"].values()]
    return [rjob["template"]["spec"]["template"] for rjob in job["spec"]["replicatedJobs"]]


def test_the_pytorchjob_master_and_worker_run_the_same_pod_and_ask_for_its_gpus(examples: list[dict[str, Any]]
                                                                                ) -> None:
    job = one(examples, "PyTorchJob")
    master, worker = pods(job)
    assert master == worker
    (container,) = master["spec"]["containers"]
    assert container["name"] == "pytorch"  # the container the operator sets PET_* in
    assert container["resources"]["limits"]["nvidia.com/gpu"] == int(job["spec"]["nprocPerNode"])


def test_the_jobsets_node_count_and_gpus_per_node_match_its_job(examples: list[dict[str, Any]]) -> None:
    jobset = one(examples, "JobSet")
    (rjob,) = jobset["spec"]["replicatedJobs"]
    spec = rjob["template"]["spec"]
    assert rjob["replicas"] == 1 and spec["completionMode"] == "Indexed"  # node rank = the pod's completion index
    (container,) = spec["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert int(env["NNODES"]) == spec["parallelism"] == spec["completions"]
    assert int(env["NPROC_PER_NODE"]) == container["resources"]["limits"]["nvidia.com/gpu"]
    assert env["MASTER_ADDR"] == f"$(JOB_NAME)-{rjob['name']}-0-0.$(JOB_NAME)"  # pod 0 of job 0 (JobSet's DNS)


# -- the pods' commands, run here --------------------------------------------------------------------------------


def pod_metadata(job: dict[str, Any], node: int, restart_attempt: int = 0) -> tuple[dict[str, Any], dict[str, str]]:
    """(metadata, what the controllers add to the container's environment) of the pod of node `node`."""
    name = job["metadata"]["name"]
    if job["kind"] == "PyTorchJob":  # the training-operator v1.9: pkg/controller.v1/pytorch/envvar.go
        replica, index = ("master", 0) if node == 0 else ("worker", node - 1)
        nnodes = sum(s["replicas"] for s in job["spec"]["pytorchReplicaSpecs"].values())
        nproc = job["spec"]["nprocPerNode"]
        labels = {"training.kubeflow.org/job-name": name, "training.kubeflow.org/replica-type": replica,
                  "training.kubeflow.org/replica-index": str(index),
                  "training.kubeflow.org/operator-name": "pytorchjob-controller"}
        master = f"{name}-master-0"
        injected = {"PYTHONUNBUFFERED": "1", "MASTER_PORT": "23456", "MASTER_ADDR": master,
                    "PET_MASTER_PORT": "23456", "PET_MASTER_ADDR": master, "WORLD_SIZE": str(nnodes * int(nproc)),
                    "RANK": str(node), "PET_NODE_RANK": str(node), "PET_NPROC_PER_NODE": nproc,
                    "PET_NNODES": str(nnodes)}
        pod = f"{name}-{replica}-{index}"
    else:  # JobSet v0.12 labels (pkg/controllers/jobset_controller.go) and an Indexed Job's completion index
        labels = {"jobset.sigs.k8s.io/jobset-name": name, "jobset.sigs.k8s.io/replicatedjob-name": "workers",
                  "jobset.sigs.k8s.io/restart-attempt": str(restart_attempt), "jobset.sigs.k8s.io/job-index": "0"}
        injected = {"JOB_COMPLETION_INDEX": str(node)}
        pod = f"{name}-workers-0-{node}-x7k2p"
    return {"name": pod, "namespace": NAMESPACE, "labels": labels}, injected


def in_pod(args: list[str], pod_dir: Path) -> list[str]:
    """The paths of the pod's volumes, here: the emptyDir at /goodput, the scripts ConfigMap at /etc/goodput."""
    return [re.sub(r"(?<![\w/])/goodput/", f"{pod_dir}/", a.replace("/etc/goodput/", f"{EXAMPLES}/")) for a in args]


def run_init(job: dict[str, Any], pod_dir: Path, api: ApiServer, node: int = 0,
             restart_attempt: int = 0) -> subprocess.CompletedProcess[str]:
    template = pods(job)[0]
    (init,) = template["spec"]["initContainers"]
    metadata, _ = pod_metadata(job, node, restart_attempt)
    env = container_env(init, metadata, {})
    command = [*in_pod(argv(init, env), pod_dir), "--service-account", str(api.service_account)]
    return subprocess.run(command, env=image_env(**env, **api.env()), capture_output=True, text=True, timeout=60)


def torchrun_here(workdir: Path) -> list[str]:
    return [*TORCHRUN, "--standalone", "--nnodes", "1", "--nproc-per-node", "2", "--max-restarts", "0",
            "--monitor-interval", "0.1", str(EXAMPLE), "--steps", "12", "--checkpoint-every", "5",
            "--ckpt-dir", str(workdir / "ckpt"), "--log-dir", str(workdir / "logs")]


def create_token(db: str, kind: str) -> str:
    out = subprocess.run([*GOODPUT, "token", "create", "--project", "training", "--kind", kind, "--db", db],
                         env=env_with(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def run_main(job: dict[str, Any], pod_dir: Path, url: str, node: int, restart_attempt: int,
             torchrun: list[str], token: str) -> subprocess.CompletedProcess[str]:
    """The worker container's shell script, its torchrun command replaced by `torchrun` (a job that fits here)."""
    (main,) = pods(job)[0]["spec"]["containers"]
    metadata, injected = pod_metadata(job, node, restart_attempt)
    env = container_env(main, metadata, {("goodput-write-token", "token"): token}, injected)
    assert env["GOODPUT_TOKEN"] == token
    env = {name: in_pod([value], pod_dir)[0] for name, value in env.items()}  # GOODPUT_SPOOL_DIR
    assert env["GOODPUT_SPOOL_DIR"] == f"{pod_dir}/spool"
    env["GOODPUT_URL"] = url  # the collector's Service, here
    env |= KUBELET_ENV  # the kubelet sets them in every container (the worker does not call the API)
    shell, flag, script = argv(main, env)
    assert [shell, flag] == ["/bin/sh", "-c"]
    assert subprocess.run([shell, "-n", "-c", script]).returncode == 0  # the script as written parses
    head = script.split("-- torchrun", 1)[0]
    assert head.rstrip().endswith("\\") and "goodput launch" in head and "--token" not in script
    script = in_pod([head + "-- " + shlex.join(torchrun)], pod_dir)[0]
    return subprocess.run([shell, flag, script], env=image_env(**env, OMP_NUM_THREADS="1"), cwd=pod_dir,
                          capture_output=True, text=True, timeout=240)


@pytest.mark.parametrize("kind", ["PyTorchJob", "JobSet"])
def test_the_init_container_writes_when_the_job_was_submitted(examples: list[dict[str, Any]], api_server: ApiServer,
                                                              tmp_path: Path, kind: str) -> None:
    job = one(examples, kind)
    api_server.hold(job, "2026-12-04T09:30:15Z")
    done = run_init(job, tmp_path / "pod", api_server)
    assert done.returncode == 0, done.stderr
    expected = datetime(2026, 12, 4, 9, 30, 15, tzinfo=UTC).timestamp()
    assert float((tmp_path / "pod/submitted-at").read_text()) == expected
    assert f"{kind.lower()}s/{job['metadata']['name']}" in api_server.requests[0][0]  # the job, by its label's name
    assert api_server.requests[0][1] == f"Bearer {SA_TOKEN}"


def test_the_init_container_never_stops_the_pod(examples: list[dict[str, Any]], tmp_path: Path) -> None:
    """Without the Role (403) or without the API (nothing listening), the pod still starts training: the script
    says why on stderr, writes nothing and exits 0."""
    job = one(examples, "JobSet")
    (tmp_path / "api").mkdir()
    forbidding = ApiServer(tmp_path / "api", allowed=set())
    try:
        forbidding.hold(job, "2026-12-04T09:30:15Z")
        refused = run_init(job, tmp_path / "pod", forbidding)
    finally:
        forbidding.close()
    assert refused.returncode == 0 and "403" in refused.stderr and "launch-rbac.yaml" in refused.stderr
    assert not (tmp_path / "pod/submitted-at").exists()
    forbidding.port = free_port()  # nothing listens there any more
    started = time.monotonic()
    unreachable = run_init(job, tmp_path / "pod", forbidding)
    assert unreachable.returncode == 0 and "could not read when" in unreachable.stderr
    assert time.monotonic() - started < 30 and not (tmp_path / "pod/submitted-at").exists()


@pytest.mark.torchrun
@pytest.mark.parametrize(("kind", "restart_attempt"), [("PyTorchJob", 0), ("JobSet", 1)])
def test_the_training_pods_report_one_run_through_goodput_launch(examples: list[dict[str, Any]],
                                                                 api_server: ApiServer, tmp_path: Path, kind: str,
                                                                 restart_attempt: int) -> None:
    """Node 0 and node 1 of the job, each its init container then its worker container: one run `k8s-<name>`,
    submitted at the job's creation (its queue time is the wait until node 0's launcher started), one allocation of
    the job's 16 GPUs (2 nodes x 8, from the pod, whatever the torchrun that fits here runs), reported by node 0
    alone; under a JobSet restart its attempts continue after those of the pods before (restart 1 of torchrun
    --max-restarts 2: from attempt 3)."""
    job = one(examples, kind)
    created = datetime.fromtimestamp(int(time.time()) - 90, tz=UTC)
    api_server.hold(job, created.strftime("%Y-%m-%dT%H:%M:%SZ"))
    # A collector with tokens, as in production: the write token reaches the pods through the Secret.
    db = f"sqlite:///{tmp_path / 'collector' / 'goodput.db'}"
    (tmp_path / "collector").mkdir()
    write, read = (create_token(db, kind) for kind in ("write", "read"))
    collector = start_collector(tmp_path / "collector")
    try:
        for node in (0, 1):
            pod_dir = tmp_path / f"node{node}"
            assert run_init(job, pod_dir, api_server, node, restart_attempt).returncode == 0
            torchrun = torchrun_here(pod_dir) if node == 0 else [sys.executable, "-c", "pass"]  # node 1: no ranks here
            done = run_main(job, pod_dir, collector.url, node, restart_attempt, torchrun, write)
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        run_id = f"k8s-{job['metadata']['name']}"
        ledger = wait_finished(collector.url, run_id, read)
    finally:
        collector.stop()
    (allocation,) = ledger["allocations"]
    assert allocation["gpus"] == 16
    assert ledger["queue_seconds"] == pytest.approx(allocation["start"] - created.timestamp(), abs=1e-3)
    assert ledger["queue_seconds"] >= 90
    base = restart_attempt * (2 + 1)  # MAX_RESTARTS=2 in the JobSet; the PyTorchJob restarts in its pod
    assert [a["attempt"] for a in ledger["attempts"]] == [base] and ledger["attempts"][0]["world_size"] == 2
    assert ledger["status"] == "finished" and ledger["steps"]["kept"] == 12


def wait_finished(url: str, run_id: str, token: str, timeout_s: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        response = httpx.get(f"{url}/v1/runs/{run_id}/waste", timeout=30, headers={"Authorization": f"Bearer {token}"})
        last = response.text
        if response.status_code == 200 and response.json()["status"] == "finished" \
                and response.json()["steps"]["kept"] == 12:
            result: dict[str, Any] = response.json()
            return result
        time.sleep(0.5)
    raise AssertionError(f"{run_id} never finished with its 12 steps: {last[:2000]}")
