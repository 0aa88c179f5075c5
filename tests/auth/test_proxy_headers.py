"""Behind a reverse proxy on the collector's host: X-Forwarded-For is believed from loopback peers only (uvicorn's
FORWARDED_ALLOW_IPS default), so a proxy that sets it makes remote clients look remote, and a remote client
cannot claim to be local by sending it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest

from tests.auth.test_serve_with_tokens import _non_loopback_address
from tests.test_cli import GOODPUT, env_with, free_port, wait_healthy


def test_x_forwarded_for_is_believed_from_a_local_proxy_only(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen([*GOODPUT, "serve", "--host", "0.0.0.0", "--port", str(port), "--db",
                             f"sqlite:///{tmp_path / 'goodput.db'}", "--no-dashboard"], cwd=tmp_path,
                            env=env_with(GOODPUT_WARM_ANALYSES_S="0"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    local = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(local, proc)
        assert httpx.get(f"{local}/v1/runs", timeout=30).status_code == 200  # no tokens: localhost may
        proxied = httpx.get(f"{local}/v1/runs", headers={"X-Forwarded-For": "203.0.113.9"}, timeout=30)
        assert proxied.status_code == 403 and "203.0.113.9" in proxied.json()["error"]["message"]
        address = _non_loopback_address()
        if address is None:
            pytest.skip("no non-loopback address to act as a remote client")
        spoofed = httpx.get(f"http://{address}:{port}/v1/runs", headers={"X-Forwarded-For": "127.0.0.1"}, timeout=30)
        assert spoofed.status_code == 403
    finally:
        proc.terminate()
        proc.wait(timeout=30)
