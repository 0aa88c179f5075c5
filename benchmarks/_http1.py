"""A minimal HTTP/1.1 keep-alive client over asyncio streams, for load generators that must cost little CPU.

httpx spends about 1 ms of CPU per request; a load generator simulating thousands of ranks at ~2,000 requests/s
on the collector's own machine would take a core from it. This client writes the request by hand and reads only
the status line, the headers and a Content-Length body (what uvicorn answers; no chunked bodies, no redirects,
no TLS). Connections come from a bounded pool, most recently used first, so idle ones expire and are replaced
instead of being reused after the server's keep-alive timeout closed them.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

# uvicorn closes a keep-alive connection idle for 5 s; a connection idle this long is not reused
IDLE_REUSE_S = 3.0
MAX_HEAD_BYTES = 64 * 1024


class ProtocolError(Exception):
    """The server's answer was not an HTTP/1.1 response this client understands."""


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    headers: dict[str, str]  # lower-case names; a repeated header keeps its last value
    body: bytes


def parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    """Status and headers (lower-case names) of a response head ending in CRLF CRLF."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise ProtocolError(f"bad status line {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise ProtocolError(f"bad header line {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers


def build_request(path: str, host: str, body: bytes, headers: dict[str, str]) -> bytes:
    head = [f"POST {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
    head += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


class _Connection:
    __slots__ = ("reader", "writer", "idle_since")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_since = time.monotonic()

    def close(self) -> None:
        self.writer.close()


class Pool:
    """At most `size` connections to one host:port; `post` waits for a free one."""

    def __init__(self, host: str, port: int, size: int) -> None:
        self.host = host
        self.port = port
        self._free: list[_Connection] = []
        self._slots = asyncio.Semaphore(size)
        self.opened = 0  # connections opened over the pool's life

    async def post(self, path: str, body: bytes, headers: dict[str, str], timeout_s: float) -> Response:
        """One request; raises OSError, asyncio.TimeoutError or ProtocolError (the connection is then dropped)."""
        async with self._slots:
            conn = self._take()
            reused = conn is not None
            if conn is None:
                conn = await self._open(timeout_s)
            try:
                response = await asyncio.wait_for(self._exchange(conn, path, body, headers), timeout_s)
            except ConnectionResetError:
                conn.close()
                if not reused:
                    raise
                # a kept-alive connection the server had closed: once more on a new one, as HTTP clients do
                conn = await self._open(timeout_s)
                try:
                    response = await asyncio.wait_for(self._exchange(conn, path, body, headers), timeout_s)
                except BaseException:
                    conn.close()
                    raise
            except BaseException:
                conn.close()
                raise
            if response.headers.get("connection", "").lower() == "close":
                conn.close()
            else:
                conn.idle_since = time.monotonic()
                self._free.append(conn)
            return response

    async def _open(self, timeout_s: float) -> _Connection:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), timeout_s)
        self.opened += 1
        return _Connection(reader, writer)

    def _take(self) -> _Connection | None:
        now = time.monotonic()
        while self._free:
            conn = self._free.pop()  # most recently used first
            if now - conn.idle_since < IDLE_REUSE_S and not conn.reader.at_eof():
                return conn
            conn.close()
        return None

    async def _exchange(self, conn: _Connection, path: str, body: bytes, headers: dict[str, str]) -> Response:
        conn.writer.write(build_request(path, f"{self.host}:{self.port}", body, headers))
        try:
            head = await conn.reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            raise ConnectionResetError("the server closed the connection before answering") from exc
        except asyncio.LimitOverrunError as exc:
            raise ProtocolError("response head too long") from exc
        status, response_headers = parse_head(head[:MAX_HEAD_BYTES])
        length = int(response_headers.get("content-length", "0"))
        data = await conn.reader.readexactly(length) if length else b""
        return Response(status, response_headers, data)

    def close(self) -> None:
        for conn in self._free:
            conn.close()
        self._free.clear()
