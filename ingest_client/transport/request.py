"""Every HTTP request the client makes (batches, signal polls, checkpoint requests) goes through :func:`exchange`.

Two things urllib does not do on its own:

- **A deadline for the whole request.** urllib's timeout bounds each socket operation, not the request: a server
  that sends one byte every 1.5 s keeps a 2 s request alive for as long as it likes, and holds the flusher with
  it. Here the connection is shut down once the whole exchange (connecting, sending, the answer's headers and
  body) has taken ``timeout_s`` (:mod:`ingest_client.transport.deadline`); the request then fails with
  TimeoutError.
- **No redirects.** urllib turns a POST's 302 into a GET of its ``Location``, with the ``Authorization`` header:
  behind a single-sign-on proxy a login page's 200 passed for the collector's acknowledgement, and the token went
  to the login page's host. A 3xx is returned as the answer, like any other status.

Proxies from the environment (``https_proxy``, ``no_proxy``) are honoured as urllib honours them. Standard library
only.
"""

from __future__ import annotations

import functools
import http.client
import socket
import urllib.error
import urllib.request
from dataclasses import dataclass
from email.message import Message
from typing import Any

from ingest_client.transport.deadline import Deadline

MAX_ANSWER_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Answer:
    """What the server answered, whatever the status (the first ``max_answer_bytes`` of its body)."""

    status: int
    headers: Message
    body: bytes

    def describe(self) -> str:
        """The answer in a few words for a log line: status, type, where it redirects, or how its body starts."""
        content_type = self.headers.get("Content-Type") or "no Content-Type"
        if 300 <= self.status < 400:
            return f"HTTP {self.status} redirecting to {self.headers.get('Location') or '(no Location)'}"
        start = " ".join(self.body[:120].decode("utf-8", "replace").split())
        return f"HTTP {self.status} {content_type}: {start!r}" if start else f"HTTP {self.status} {content_type}"


class _Request(urllib.request.Request):
    def __init__(self, url: str, *, deadline: Deadline, **kwargs: Any) -> None:  # Any: Request's own arguments
        super().__init__(url, **kwargs)
        self.deadline = deadline


def _deadline_of(request: urllib.request.Request) -> Deadline:
    assert isinstance(request, _Request)
    return request.deadline


def _watched_connection(deadline: Deadline, address: tuple[str, int], timeout: float | None = None,
                        source_address: tuple[str, int] | None = None) -> socket.socket:
    """http.client's socket.create_connection, with the socket handed to the deadline before anything is sent (a
    proxy's tunnel and the TLS handshake included)."""
    sock = socket.create_connection(address, timeout, source_address)
    deadline.watch(sock)
    return sock


class _WatchedHTTPConnection(http.client.HTTPConnection):
    def __init__(self, *args: Any, deadline: Deadline, **kwargs: Any) -> None:  # Any: HTTPConnection's arguments
        super().__init__(*args, **kwargs)
        self._create_connection = functools.partial(_watched_connection, deadline)


class _WatchedHTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, *args: Any, deadline: Deadline, **kwargs: Any) -> None:  # Any: HTTPSConnection's arguments
        super().__init__(*args, **kwargs)
        self._create_connection = functools.partial(_watched_connection, deadline)


class _HTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        # the connection class takes the deadline besides http.client's arguments: not the protocol typeshed names
        return self.do_open(_WatchedHTTPConnection, req, deadline=_deadline_of(req))  # type: ignore[arg-type]


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_WatchedHTTPSConnection, req, deadline=_deadline_of(req))  # type: ignore[arg-type]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any) -> None:  # Any: urllib's (req, fp, code, msg, headers, newurl)
        return None  # urllib then raises the 3xx as an HTTPError: it is the answer


_OPENER = urllib.request.build_opener(_NoRedirect, _HTTPHandler, _HTTPSHandler)


def exchange(url: str, *, method: str, headers: dict[str, str], timeout_s: float, data: bytes | None = None,
             max_answer_bytes: int = MAX_ANSWER_BYTES) -> Answer:
    """Send one request and read its answer, all within ``timeout_s``; never follows a redirect.

    Returns the answer whatever its status. Raises OSError when there is none: TimeoutError past the deadline,
    ConnectionRefusedError when nothing listens, another OSError for the rest (the connection broke, DNS, TLS);
    ValueError for a URL urllib cannot use.
    """
    deadline = Deadline(timeout_s)
    try:
        request = _Request(url, data=data, headers=headers, method=method, deadline=deadline)
        try:
            response: Any = _OPENER.open(request, timeout=timeout_s)  # Any: an HTTPResponse, or the HTTPError below
        except urllib.error.HTTPError as exc:  # a 3xx, 4xx or 5xx: an answer all the same
            response = exc
        with response:
            answer = Answer(status=int(response.status), headers=response.headers, body=response.read(max_answer_bytes))
        if deadline.expired:  # http.client returns what arrived when the connection is shut mid-body
            raise TimeoutError(f"no whole answer within {deadline.timeout_s:g} s")
        return answer
    except (OSError, http.client.HTTPException) as exc:
        if deadline.expired:
            raise TimeoutError(f"no whole answer within {deadline.timeout_s:g} s") from exc
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        if isinstance(reason, OSError):
            raise reason from None
        raise ConnectionError(f"{type(exc).__name__}: {reason}") from exc
    finally:
        deadline.cancel()
