"""A fake collector: ThreadingHTTPServer on 127.0.0.1 that validates bodies against docs/events.md."""

from __future__ import annotations

import gzip
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.ingest_client.wire import validate_event


@dataclass
class Reply:
    status: int
    body: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)


class FakeCollector:
    def __init__(self, token: str | None = None) -> None:
        self.token = token
        self.lock = threading.RLock()
        self.events: list[dict[str, Any]] = []  # unique by event_id
        self.event_ids: set[str] = set()
        self.duplicates = 0
        self.requests: list[dict[str, Any]] = []  # one per POST: headers, n events, status
        self.problems: list[str] = []  # bodies that broke the wire format: tests assert this is empty
        self.script: list[Reply] = []  # replies served first, in order
        self.delay_s = 0.0
        self.max_events: int | None = None  # larger batches are answered 413, like GOODPUT_MAX_EVENTS_PER_BATCH
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                collector._handle(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        with self.lock:
            return [e for e in self.events if e["kind"] == kind]

    def step_numbers(self) -> list[int]:
        return sorted(s for e in self.of_kind("steps") for s in e["step"])

    def wait_for(self, predicate: Any, timeout_s: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                if predicate(self):
                    return True
            time.sleep(0.01)
        return False

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _reply(self, h: BaseHTTPRequestHandler, reply: Reply) -> None:
        data = json.dumps(reply.body).encode()
        h.send_response(reply.status)
        for k, v in reply.headers.items():
            h.send_header(k, v)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        raw = h.rfile.read(int(h.headers.get("Content-Length", "0")))
        if self.delay_s:
            time.sleep(self.delay_s)
        info = {"path": h.path, "encoding": h.headers.get("Content-Encoding"), "auth": h.headers.get("Authorization"),
                "size": len(raw), "time": time.monotonic(), "sent_at": h.headers.get("Goodput-Sent-At")}
        try:
            body = gzip.decompress(raw) if info["encoding"] == "gzip" else raw
            payload = json.loads(body)
        except (OSError, ValueError) as exc:
            self.problems.append(f"undecodable body: {exc}")
            return self._reply(h, Reply(400, {"error": {"code": "bad_json", "message": str(exc)}}))
        if info["encoding"] != "gzip" and len(raw) > 1024:
            self.problems.append(f"uncompressed body of {len(raw)} bytes")
        with self.lock:
            self.requests.append(info)
            if h.path != "/v1/events":
                return self._reply(h, Reply(404, {"error": {"message": "not found"}}))
            if self.token and info["auth"] != f"Bearer {self.token}":
                return self._reply(h, Reply(401, {"error": {"code": "unauthorized", "message": "bad token"}}))
            if set(payload) != {"schema_version", "events"} or payload["schema_version"] != 1:
                self.problems.append(f"bad envelope {sorted(payload)}")
                return self._reply(h, Reply(400, {"error": {"message": "bad envelope"}}))
            info["n"] = n = len(payload["events"])
            if self.max_events is not None and n > self.max_events:
                info["status"] = 413
                return self._reply(h, Reply(413, {"error": {"code": "batch_too_large",
                                                            "message": f"more than {self.max_events} events"}}))
            if self.script:
                reply = self.script.pop(0)
                info["status"] = reply.status
                return self._reply(h, reply)
            for i, event in enumerate(payload["events"]):
                problem = validate_event(event)
                if problem:
                    self.problems.append(problem)
                    error = {"code": "invalid_event", "message": problem, "index": i}
                    return self._reply(h, Reply(422, {"error": error}))
            accepted = 0
            for event in payload["events"]:
                if event["event_id"] in self.event_ids:
                    self.duplicates += 1
                else:
                    self.event_ids.add(event["event_id"])
                    self.events.append(event)
                    accepted += 1
            info["status"] = 200
            return self._reply(h, Reply(200, {"accepted": accepted, "duplicates": len(payload["events"]) - accepted}))


def closed_port_url() -> str:
    """A URL on which nothing listens (connection refused)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"
