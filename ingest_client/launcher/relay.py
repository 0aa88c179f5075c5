"""One sender per node: ``goodput launch --node-relay`` sends the records of all the node's ranks as one stream.

Every rank posting its own small batches costs the collector one request per rank per send interval; a fleet of
10,000 ranks needs thousands of requests a second for figures a few seconds fresh. With the relay, the launcher (one
per node) listens on 127.0.0.1 and names that address to its workers (``GOODPUT_EVENTS_VIA``): their flushers post
to it, and it forwards the posts that arrive together as one request (at most every ``MIN_SEND_INTERVAL_S``, at the
collector's pace: ``Goodput-Send-Interval`` counts one sender per node), then answers each rank with the collector's
verdict. Each answer asks the rank to post next at the relay's next send (``Goodput-Send-Interval``), so the node's
ranks post together and one request carries them all, whatever the collector's pace; a post is never held longer
than half the time a rank waits for an answer (explicit flushes and durable events, which a rank sends at once, wait
that long at most). The relay keeps nothing on disk: a rank's records stay in the rank's own spool until the
collector has acknowledged them, as without a relay, so a collector that is down, a relay that is killed or a rank
that dies loses nothing (the next process of the run replays the spool, or ``goodput sync``), and each rank keeps
its own spool bound for an outage. A second spool on the node would cost an fsync and a copy of every record and buy
nothing more (benchmarks/node_relay.py, docs/performance.md).

A merged post that the collector refuses for what it holds (400, 413, 422) is sent again one rank's post at a
time, and each rank gets its own answer: the rank halves its batch or quarantines the refused record as it would
facing the collector, so one rank's bad event never holds back another's. A 401 or 403 goes to every rank; a
failure to reach the collector is a 503 (the ranks retry; only a refused connection to the relay itself makes a
rank send directly, :mod:`ingest_client.transport.relayed`).

Only local processes that present the node's token (when there is one) may post: the token is checked before the
body is read, and a body is read within the collector's limits, inflated by a bounded inflater
(:mod:`ingest_client.launcher.relay_body`). Standard library only.
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ingest_client.common.config import ClientConfig
from ingest_client.launcher.relay_body import MAX_BODY_BYTES, READ_CHUNK_BYTES, RefusedBody, read_body, split_events
from ingest_client.transport.base import SendResult, SendStatus
from ingest_client.transport.http import HttpTransport
from ingest_client.worker.flusher import SEND_BUDGET_S

logger = logging.getLogger(__name__)

EVENTS_VIA_ENV = "GOODPUT_EVENTS_VIA"
MIN_SEND_INTERVAL_S = 0.5  # the relay sends at most this often, whatever the ranks' flush interval: fuller requests
MAX_FORWARD_EVENTS = 5_000
MAX_FORWARD_BYTES = 8 << 20
_MARGIN_S = 0.1  # a forward ends this long before the oldest waiting rank gives up on its post
_GATHER_MARGIN_S = 0.05  # beyond a rank's flush interval: the ranks asked to post at one time arrive within it


@dataclass(eq=False, slots=True)
class _Post:
    """One rank's post, waiting for the collector's verdict."""

    records: list[bytes]
    arrived: float = field(default_factory=time.monotonic)
    result: SendResult | None = None
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def size(self) -> int:
        return sum(len(r) for r in self.records)


class NodeRelay:
    def __init__(self, config: ClientConfig, run_id: str) -> None:
        assert config.events_url is not None
        self.proc_id = f"relay{uuid.uuid4().hex}"
        self.run_id = run_id
        self._token = config.token
        self._transport = HttpTransport(config.events_url, token=config.token, timeout_s=config.http_timeout_s,
                                        sender=self.proc_id)
        # how long a rank waits for its post's answer (its HTTP timeout, within its send round's budget)
        self._wait_s = min(config.http_timeout_s, SEND_BUDGET_S)
        self._hold_s = self._wait_s / 2  # the longest a post waits to be forwarded
        # after the first post arrives, wait this long for the others (they post on their flush ticks)
        self._gather_s = min(config.flush_interval_s + _GATHER_MARGIN_S, self._hold_s)
        self._interval_s = max(config.flush_interval_s, MIN_SEND_INTERVAL_S)
        self._waiting: list[_Post] = []
        self._changed = threading.Condition()
        self._next_send_at = 0.0
        self._stopping = False
        self.received_events = 0
        self.forwarded_events = 0  # acknowledged by the collector
        self.forwards = 0  # requests to the collector
        self._said_foreign = False
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="goodput-relay", daemon=True)
        self._forwarder = threading.Thread(target=self._forward_loop, name="goodput-relay-forwarder", daemon=True)

    @property
    def url(self) -> str:
        """The base URL the workers post to (their GOODPUT_EVENTS_VIA)."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> NodeRelay:
        self._forwarder.start()
        self._thread.start()
        return self

    def close(self, timeout_s: float) -> bool:
        """Stop taking posts and forward those waiting within ``timeout_s``; True when none is left unanswered.
        Whatever the collector has not acknowledged stays in the ranks' spools."""
        self._server.shutdown()
        self._server.server_close()
        with self._changed:
            self._stopping = True
            self._next_send_at = 0.0
            self._changed.notify_all()
        self._forwarder.join(timeout_s)
        return not self._forwarder.is_alive()

    def authorized(self, authorization: str | None) -> bool:
        """Whether a post carries the node's token (any post, when there is none)."""
        return not self._token or hmac.compare_digest(authorization or "", f"Bearer {self._token}")

    def next_send_in(self) -> float:
        """Seconds until the relay's next send: when a rank should post next to go with the others."""
        with self._changed:
            return max(0.0, self._next_send_at - time.monotonic())

    def forward(self, body: bytes | bytearray) -> tuple[int, SendResult]:
        """Forward a rank's batch with the others' of this send; (records, the collector's verdict).
        Raises RefusedBody."""
        post = _Post(split_events(body))
        with self._changed:
            if self._stopping:
                return len(post.records), _unavailable("the node relay is stopping")
            self.received_events += len(post.records)
            self._waiting.append(post)
            self._changed.notify_all()
        if not post.done.wait(self._wait_s) or post.result is None:
            return len(post.records), _unavailable("the node relay could not forward the batch in time")
        return len(post.records), post.result

    def _forward_loop(self) -> None:
        while True:
            with self._changed:
                while not self._waiting or (not self._stopping and time.monotonic() < self._send_at_locked()):
                    if self._stopping and not self._waiting:
                        return
                    self._changed.wait(self._send_at_locked() - time.monotonic() if self._waiting else None)
                batch = self._take_locked()
            try:
                self._forward(batch)
            except Exception as exc:  # never leave a rank waiting on a bug: it keeps its records and retries
                logger.exception("goodput: the node relay failed to forward a batch")
                for post in batch:
                    if post.result is None:
                        post.result = _unavailable(f"the node relay failed ({type(exc).__name__})")
            finally:
                for post in batch:
                    post.done.set()

    def _send_at_locked(self) -> float:
        """When to forward what waits: at the next send, once the ranks asked to post then have had time to, and
        never later than the oldest post can wait."""
        oldest = self._waiting[0].arrived
        return min(max(self._next_send_at, oldest + self._gather_s), oldest + self._hold_s)

    def _take_locked(self) -> list[_Post]:
        """The oldest waiting posts, up to one batch's limits (at least one post)."""
        n = events = size = 0
        for post in self._waiting:
            if n and (events + len(post.records) > MAX_FORWARD_EVENTS or size + post.size > MAX_FORWARD_BYTES):
                break
            n, events, size = n + 1, events + len(post.records), size + post.size
        batch, self._waiting = self._waiting[:n], self._waiting[n:]
        return batch

    def _forward(self, batch: list[_Post]) -> None:
        records = [r for post in batch for r in post.records]
        result = self._send(records, batch[0].arrived)
        if result.status is SendStatus.REJECTED and result.http_status in (400, 413, 422) and len(batch) > 1:
            for post in batch:  # one rank's batch is refused, not the others': each its own verdict
                post.result = self._send(post.records, post.arrived)
            return
        for post in batch:
            post.result = result

    def _send(self, records: list[bytes], oldest: float) -> SendResult:
        timeout_s = max(0.05, oldest + self._wait_s - _MARGIN_S - time.monotonic())
        result = self._transport.send(records, timeout_s=timeout_s)
        self.forwards += 1
        pace = max(self._interval_s, result.send_interval_s or 0.0)
        with self._changed:
            self._next_send_at = time.monotonic() + pace
        if result.status is SendStatus.OK:
            self.forwarded_events += len(records)
        elif result.foreign_answer and not self._said_foreign:
            self._said_foreign = True
            logger.warning("goodput: %s answered %s. The node's ranks keep their records in their spools and send "
                           "them again. Check GOODPUT_URL: it must be the collector's base URL (the address "
                           "`goodput serve` prints), reached without a login page or a redirect; once it is, the next "
                           "process of this run or `goodput sync` sends them.", self._transport.events_url,
                           result.message)
        return result


def _unavailable(message: str) -> SendResult:
    return SendResult(status=SendStatus.RETRY, http_status=503, retry_after_s=1.0, message=message)


def _handler_for(relay: NodeRelay) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            if self.path.split("?", 1)[0] != "/v1/events":
                self._refuse(404, "the node relay takes POST /v1/events only")
                return
            length = self.headers.get("Content-Length", "")
            if not length.isdigit():
                self._refuse(411, "the node relay needs a Content-Length")
                return
            # The token before the body: a post without it costs no more than reading its bytes (and not even that
            # past the limit), whatever they would inflate to.
            if not relay.authorized(self.headers.get("Authorization")):
                if int(length) <= MAX_BODY_BYTES:
                    self._discard(int(length))  # so that the client reads the answer, not a reset connection
                self._refuse(401, "the node relay takes records only with the node's token (GOODPUT_TOKEN or "
                                  "GOODPUT_TOKEN_FILE)")
                return
            consumed = 0

            def read(size: int) -> bytes:
                nonlocal consumed
                chunk = self.rfile.read(size)
                consumed += len(chunk)
                return chunk

            try:
                body = read_body(read, int(length), self.headers.get("Content-Encoding"))
                n, result = relay.forward(body)
            except RefusedBody as exc:
                if int(length) <= MAX_BODY_BYTES:
                    self._discard(int(length) - consumed)  # a rank halves its batch after a 413 it can read
                self._refuse(exc.status, str(exc))
                return
            if result.status is SendStatus.OK:
                pace = {"Goodput-Send-Interval": f"{relay.next_send_in():.3f}"}  # post again with the others
                self._send(200, b'{"accepted":%d,"duplicates":0}' % n, pace)
            elif result.status is SendStatus.REJECTED and result.http_status is not None:
                self._answer(result.http_status, f"the collector: {result.message}")
            else:
                retry_after = {"Retry-After": str(max(1, round(result.retry_after_s or 1)))}
                self._answer(503, f"the node relay cannot reach the collector: {result.message}", retry_after)

        def _discard(self, length: int) -> None:
            while length > 0:
                chunk = self.rfile.read(min(READ_CHUNK_BYTES, length))
                if not chunk:
                    return
                length -= len(chunk)

        def _refuse(self, status: int, message: str) -> None:
            """An error answer after which the connection closes: the rest of the body may be unread."""
            self.close_connection = True
            self._answer(status, message)

        def _answer(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
            self._send(status, json.dumps({"error": {"code": "relay", "message": message}}).encode(), headers)

        def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
            try:
                self._write(status, body, headers or {})
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the rank stopped waiting: it sends again, a duplicate is absorbed

        def _write(self, status: int, body: bytes, headers: dict[str, str]) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for name, value in headers.items():
                self.send_header(name, value)
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # a line per request on stderr would drown the training log

    return Handler
