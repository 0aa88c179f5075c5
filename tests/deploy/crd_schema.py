"""Custom resources (ServiceMonitor, PyTorchJob, JobSet) checked offline against their projects' published CRDs.

tests/deploy/crds/ holds each CRD's `openAPIV3Schema` as its project released it, with the `description` texts left
out (they are most of the size and validate nothing), and where it came from. To refresh one from a newer release:

    python -m tests.deploy.crd_schema path/to/the_crd.yaml --source "<repository> <tag> <commit> <path>"

The API server validates a custom resource with that schema, rejects unknown fields when asked to (kubectl's
default, `--validate=strict`) and evaluates the CEL rules (`x-kubernetes-validations`). Here the schema becomes a JSON
Schema (objects closed unless they keep unknown fields, int-or-string, nullable) checked with `jsonschema`; the object's
`metadata` is checked against the core ObjectMeta schema of kubernetes-validate. CEL is not evaluated: `cel_rules`
lists the rules an object reaches, and the test says why each holds.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import jsonschema
import yaml

CRDS = Path(__file__).resolve().parent / "crds"
_SCHEMA_LISTS = ("anyOf", "allOf", "oneOf")
_SCHEMA_VALUES = ("items", "additionalProperties", "not")


def without_descriptions(node: Any) -> Any:
    """The schema without its `description` keywords (a property *named* description is kept)."""
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "description":
            continue
        if key == "properties":
            out[key] = {name: without_descriptions(schema) for name, schema in value.items()}
        elif key in _SCHEMA_VALUES:
            out[key] = without_descriptions(value)
        elif key in _SCHEMA_LISTS:
            out[key] = [without_descriptions(schema) for schema in value]
        else:
            out[key] = value
    return out


def crd_file(kind: str) -> Path:
    return CRDS / f"{kind.lower()}.json"


def load(kind: str) -> dict[str, Any]:
    """{group, version, kind, source, openAPIV3Schema} of a vendored CRD."""
    data: dict[str, Any] = json.loads(crd_file(kind).read_text())
    return data


def json_schema(node: Any) -> Any:
    """A structural OpenAPI v3 schema as a JSON Schema that rejects what the API server would refuse or drop."""
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "properties":
            out[key] = {name: json_schema(schema) for name, schema in value.items()}
        elif key in _SCHEMA_VALUES:
            out[key] = json_schema(value)
        elif key in _SCHEMA_LISTS:
            out[key] = [json_schema(schema) for schema in value]
        elif key.startswith("x-kubernetes-") or key in ("format", "nullable", "default", "example"):
            continue
        else:
            out[key] = value
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    keeps_unknown = node.get("x-kubernetes-preserve-unknown-fields") or node.get("x-kubernetes-embedded-resource")
    if node.get("type") == "object" and "properties" in node and "additionalProperties" not in node \
            and not keeps_unknown:
        out["additionalProperties"] = False  # an unknown field: refused (strict) or silently dropped: both wrong
    return out


def validate(obj: dict[str, Any]) -> list[str]:
    """Errors of `obj` against the vendored CRD of its kind (empty: valid), each as 'path: message'."""
    crd = load(obj["kind"])
    assert obj["apiVersion"] == f"{crd['group']}/{crd['version']}", (
        f"{obj['kind']} {obj['metadata']['name']}: apiVersion {obj['apiVersion']}, the vendored CRD serves "
        f"{crd['group']}/{crd['version']}")
    validator = jsonschema.Draft202012Validator(json_schema(crd["openAPIV3Schema"]))
    return [f"{'.'.join(str(p) for p in error.absolute_path)}: {error.message}"
            for error in validator.iter_errors(obj)]


def cel_rules(obj: dict[str, Any]) -> list[tuple[str, str]]:
    """(path, rule) of every CEL rule on a schema node that `obj` reaches (a field it sets)."""
    found: list[tuple[str, str]] = []

    def walk(schema: dict[str, Any], value: Any, path: str) -> None:
        for rule in schema.get("x-kubernetes-validations", []):
            found.append((path or ".", rule["rule"]))
        if isinstance(value, dict):
            for name, item in value.items():
                if name in schema.get("properties", {}):
                    walk(schema["properties"][name], item, f"{path}.{name}")
                elif isinstance(schema.get("additionalProperties"), dict):
                    walk(schema["additionalProperties"], item, f"{path}.{name}")
        elif isinstance(value, list) and isinstance(schema.get("items"), dict):
            for i, item in enumerate(value):
                walk(schema["items"], item, f"{path}[{i}]")

    walk(load(obj["kind"])["openAPIV3Schema"], obj, "")
    return found


def vendor(crd_yaml: Path, source: str) -> Path:
    crd = yaml.safe_load(crd_yaml.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
    out = crd_file(crd["spec"]["names"]["kind"])
    out.write_text(json.dumps({
        "group": crd["spec"]["group"], "version": version["name"], "kind": crd["spec"]["names"]["kind"],
        "source": source, "openAPIV3Schema": without_descriptions(version["schema"]["openAPIV3Schema"]),
    }, separators=(",", ":"), sort_keys=True) + "\n")
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="vendor a CRD's schema into tests/deploy/crds/")
    parser.add_argument("crd", type=Path)
    parser.add_argument("--source", required=True, help='"<repository> <tag> <commit> <path>" it came from')
    ns = parser.parse_args()
    print(vendor(ns.crd, ns.source))
