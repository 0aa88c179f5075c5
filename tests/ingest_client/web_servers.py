"""Servers that are not the collector, for the client to meet at a wrong GOODPUT_URL (issue 31, points 1 and 7).

- ``web_page()``: a web server's default page: 200 text/html to every request (what a wrong port or host answers);
  ``error_page(status)`` its error page.
- ``login_redirect()``: a single-sign-on proxy: 302 to ``/login`` for every API path; ``GET /login`` is a 200 login
  page. Every request is recorded, with its Authorization header, so a test sees a redirect followed or a token
  sent to the login page.
- ``Trickle``: answers every request, but one byte every ``byte_every_s`` (a broken proxy, an overloaded link): each
  read returns in time, the request never ends. Records how long each connection stayed open.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PAGE = (b"<!DOCTYPE html><html><head><title>Welcome to nginx!</title></head><body><h1>Welcome to nginx!</h1>"
        b"<p>If you see this page, the web server is successfully installed.</p></body></html>")
LOGIN = b"<!DOCTYPE html><html><head><title>Sign in</title></head><body><form>...</form></body></html>"


@dataclass
class Seen:
    method: str
    path: str
    authorization: str | None


class _Recording(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        self.seen: list[Seen] = []
        self.lock = threading.Lock()
        threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: _Recording

    def log_message(self, *args: Any) -> None:
        pass

    def _record(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with self.server.lock:
            self.server.seen.append(Seen(self.command, self.path, self.headers.get("Authorization")))

    def _page(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _PageHandler(_Handler):
    def do_POST(self) -> None:
        self._record()
        self._page(PAGE)

    do_GET = do_POST


class _LoginHandler(_Handler):
    def do_POST(self) -> None:
        self._record()
        if self.path.startswith("/login"):
            self._page(LOGIN)
            return
        self.send_response(302)
        self.send_header("Location", f"http://127.0.0.1:{self.server.server_address[1]}/login?next={self.path}")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST


def web_page() -> _Recording:
    return _Recording(_PageHandler)


def error_page(status: int) -> _Recording:
    """A web server's error page with ``status`` (text/html), to every request."""

    class Handler(_Handler):
        def do_POST(self) -> None:
            self._record()
            body = b"<html><body><h1>%d</h1><hr>nginx</body></html>" % status
            self.send_response(status)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return _Recording(Handler)


def login_redirect() -> _Recording:
    return _Recording(_LoginHandler)


@dataclass
class Trickle:
    """A raw socket server: reads each request's head and body, then answers one byte every ``byte_every_s``."""

    byte_every_s: float = 0.3
    answer: bytes = (b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 31\r\n\r\n'
                     b'{"accepted":1,"duplicates":0}\r\n')
    connections: list[tuple[float, float]] = field(default_factory=list)  # (opened, closed) monotonic seconds
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self._sock.settimeout(0.1)
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        opened = time.monotonic()
        try:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            while len(body) < length:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                body += chunk
            for i in range(len(self.answer)):
                if self._stop.wait(self.byte_every_s):
                    return
                conn.sendall(self.answer[i:i + 1])
        except OSError:  # the client gave up and closed: what a deadline does
            pass
        finally:
            conn.close()
            self.connections.append((opened, time.monotonic()))

    def stop(self) -> None:
        self._stop.set()
        self._sock.close()
