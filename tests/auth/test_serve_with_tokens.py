"""A real `goodput serve` on all interfaces: localhost only until a token exists, then tokens for everyone.

The "remote" client is this machine's own non-loopback address, so the collector sees a non-loopback peer.
"""

from __future__ import annotations

import base64
import socket
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.test_cli import GOODPUT, env_with, free_port, wait_healthy

T = 1_700_000_000.0


def _non_loopback_address() -> str | None:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # no packet is sent; picks the outgoing interface
            address = str(s.getsockname()[0])
    except OSError:
        return None
    return None if address.startswith("127.") else address


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*GOODPUT, *args], cwd=cwd, env=env_with(), capture_output=True, text=True, timeout=120,
                          check=False)


def _events(run_id: str, n: int) -> dict[str, object]:
    return {"events": [{"event_id": f"{run_id}-{i}", "run_id": run_id, "kind": "step", "time": T + i, "attempt": 0,
                        "rank": 0, "step": i, "start": T + i - 1, "end": T + i} for i in range(1, n + 1)]}


def test_serve_says_whether_auth_is_on_and_enforces_it_for_remote_clients(tmp_path: Path) -> None:
    address = _non_loopback_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address to act as a remote client")
    db = f"sqlite:///{tmp_path / 'goodput.db'}"
    port = free_port()
    log = open(tmp_path / "serve.log", "w+b")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen([*GOODPUT, "serve", "--host", "0.0.0.0", "--port", str(port), "--db", db],
                            cwd=tmp_path, env=env_with(GOODPUT_AUTH_CACHE_TTL_S="0"), stdout=log,
                            stderr=subprocess.STDOUT)
    local, remote = f"http://127.0.0.1:{port}", f"http://{address}:{port}"
    try:
        wait_healthy(local, proc)
        log.seek(0)
        assert b"authentication off" in log.read()

        # no token yet: localhost may, the rest of the network may not
        assert httpx.post(f"{local}/v1/events", json=_events("local-run", 2), timeout=30).status_code == 200
        refused = httpx.post(f"{remote}/v1/events", json=_events("remote-run", 2), timeout=30)
        assert refused.status_code == 403 and "goodput token create" in refused.json()["error"]["message"]
        assert httpx.get(f"{remote}/dashboard/", timeout=30).status_code == 403

        created = _cli("token", "create", "--project", "alpha", "--kind", "write", "--name", "trainer", "--db", db,
                       cwd=tmp_path)
        assert created.returncode == 0, created.stderr
        write = created.stdout.strip()
        assert write.startswith("gpw_") and "shown only now" in created.stderr
        read = _cli("token", "create", "--project", "alpha", "--kind", "read", "--db", db, cwd=tmp_path).stdout.strip()
        listing = _cli("token", "list", "--db", db, cwd=tmp_path).stdout
        _, token_id, secret = write.split("_", 2)
        assert "trainer" in listing and token_id in listing and secret and secret not in listing

        # tokens exist: everyone needs one, localhost included
        assert httpx.get(f"{local}/v1/runs", timeout=30).status_code == 401
        ok = httpx.post(f"{remote}/v1/events", json=_events("remote-run", 3), timeout=30,
                        headers={"Authorization": f"Bearer {write}"})
        assert ok.status_code == 200 and ok.json()["accepted"] == 3
        runs = httpx.get(f"{remote}/v1/runs", timeout=30, headers={"Authorization": f"Bearer {read}"}).json()
        assert [r["run_id"] for r in runs["runs"]] == ["remote-run"]  # "local-run" is in project "default"

        # the dashboard asks the browser for the read token (HTTP Basic), and takes it
        challenge = httpx.get(f"{remote}/dashboard/", timeout=30)
        assert challenge.status_code == 401 and challenge.headers["WWW-Authenticate"].startswith("Basic")
        basic = base64.b64encode(f"me:{read}".encode()).decode()
        page = httpx.get(f"{remote}/dashboard/", timeout=30, headers={"Authorization": f"Basic {basic}"})
        assert page.status_code == 200 and "<html" in page.text.lower()

        # the CLI's read commands take GOODPUT_READ_TOKEN
        shown = subprocess.run([*GOODPUT, "runs", "--url", remote], env=env_with(GOODPUT_READ_TOKEN=read), check=False,
                               capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0 and "remote-run" in shown.stdout, shown.stdout + shown.stderr

        revoked = _cli("token", "revoke", write.split("_")[1], "--db", db, cwd=tmp_path)
        assert revoked.returncode == 0, revoked.stderr
        gone = httpx.post(f"{remote}/v1/events", json=_events("remote-run", 4), timeout=30,
                          headers={"Authorization": f"Bearer {write}"})
        assert gone.status_code == 401 and "revoked" in gone.json()["error"]["message"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def test_serve_with_tokens_says_authentication_is_on(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'goodput.db'}"
    assert _cli("token", "create", "--project", "p", "--kind", "read", "--db", db, cwd=tmp_path).returncode == 0
    port = free_port()
    proc = subprocess.Popen([*GOODPUT, "serve", "--port", str(port), "--db", db, "--no-dashboard"], cwd=tmp_path,
                            env=env_with(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
    finally:
        proc.terminate()
        out = proc.communicate(timeout=30)[0].decode()
    assert "authentication on: 1 active token(s) for project(s) p" in out
