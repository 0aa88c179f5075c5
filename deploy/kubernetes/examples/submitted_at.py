"""Write when this pod's job was submitted, for `goodput launch --submitted-at`.

The downward API gives a pod its own fields, not its job's, and a job's pods are created when it is admitted, not
when it was submitted (a queue such as Kueue holds it suspended meanwhile). So this asks the Kubernetes API for the
job (a PyTorchJob, a JobSet) with the pod's service account and writes its `metadata.creationTimestamp` as UTC
seconds since the epoch to --out. It runs as an init container in the training image (standard library only).

It never fails the pod: when the job cannot be read (no permission, API unreachable), it says so on stderr, writes
nothing, and exits 0; `goodput launch` then runs without --submitted-at and the run has no queue time.

    python submitted_at.py --resource kubeflow.org/v1/pytorchjobs --name "$JOB_NAME" --out /goodput/submitted-at
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import urllib.request
from datetime import datetime
from pathlib import Path

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


def job_url(resource: str, namespace: str, name: str, env: dict[str, str]) -> str:
    """The API path of one object: resource is <group>/<version>/<plural>, e.g. jobset.x-k8s.io/v1alpha2/jobsets."""
    group, version, plural = resource.split("/")
    host = env["KUBERNETES_SERVICE_HOST"]
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    return (f"https://{host}:{env['KUBERNETES_SERVICE_PORT']}/apis/{group}/{version}/namespaces/{namespace}/"
            f"{plural}/{name}")


def creation_time(resource: str, name: str, service_account: Path) -> tuple[str, float]:
    """The object's creationTimestamp as the API gives it (RFC 3339, UTC) and as epoch seconds."""
    namespace = (service_account / "namespace").read_text().strip()
    token = (service_account / "token").read_text().strip()
    request = urllib.request.Request(job_url(resource, namespace, name, dict(os.environ)), headers={
        "Authorization": f"Bearer {token}", "Accept": "application/json"})
    context = ssl.create_default_context(cafile=str(service_account / "ca.crt"))
    with urllib.request.urlopen(request, timeout=10, context=context) as response:
        created = json.load(response)["metadata"]["creationTimestamp"]
    return created, datetime.fromisoformat(created.replace("Z", "+00:00")).timestamp()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--resource", required=True, help="<group>/<version>/<plural> of the job's kind")
    parser.add_argument("--name", required=True, help="the job's name (from a pod label, through the downward API)")
    parser.add_argument("--out", required=True, type=Path, help="file to write the epoch seconds to")
    parser.add_argument("--service-account", type=Path, default=Path(SERVICE_ACCOUNT),
                        help="the mounted service account (token, ca.crt, namespace)")
    args = parser.parse_args(argv)
    try:
        created, epoch_s = creation_time(args.resource, args.name, args.service_account)
    except Exception as exc:  # reported, never raised: training starts either way
        print(f"goodput: could not read when {args.resource} {args.name!r} was submitted ({exc}); the run will have "
              "no queue time. The pod's service account needs `get` on that resource "
              "(deploy/kubernetes/examples/launch-rbac.yaml).", file=sys.stderr)
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    partial = args.out.with_name(args.out.name + ".partial")
    partial.write_text(f"{epoch_s:.3f}\n")
    partial.replace(args.out)  # whole or absent, never half written
    print(f"goodput: {args.resource} {args.name} was submitted at {created} ({epoch_s:.0f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
