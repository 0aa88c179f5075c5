"""One sender per node: ``goodput launch --node-relay`` sends the records of all the node's ranks as one stream.

Every rank posting its own small batches costs the collector one request per rank per send interval; a fleet of
10,000 ranks needs thousands of requests a second for figures a few seconds fresh. With the relay, the launcher
(one per node) listens on 127.0.0.1 and names that address to its workers (``GOODPUT_EVENTS_VIA``): their
flushers post to it, it appends their records to its own spool on the node's disk (written and fsynced before it
answers 200, like a rank's own spool), and its flusher sends that spool to the collector as any client's would:
fuller batches, at the collector's pace (``Goodput-Send-Interval`` counts one sender per node), retried with
backoff, replayed after a crash. So a rank's records are acknowledged once they are durable on the node, not
once the collector committed them; what the relay has not sent when the launcher dies stays in its spool, in
the run's spool directory, where the next process of the run replays it (or ``goodput sync``).

A record the collector refuses for what it holds (400, 422) arrives in a batch with other ranks' records:
the relay halves the batch until the refused record is alone, quarantines that one (``goodput sync`` shows it)
and sends the rest, so one rank's bad event never holds back another's.

Only local processes that present the node's token (when there is one) may post: the token is checked before the
body is read, and a body is read within the collector's limits, inflated by a bounded inflater
(:mod:`ingest_client.launcher.relay_body`). Standard library only.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ingest_client.common.config import ClientConfig
from ingest_client.common.events import RecordBuilder, RecordContext
from ingest_client.launcher.relay_body import MAX_BODY_BYTES, READ_CHUNK_BYTES, RefusedBody, read_body, split_events
from ingest_client.transport.http import HttpTransport
from ingest_client.worker.flusher import Pipeline, PipelineSettings
from ingest_client.worker.spool import run_dir_name

logger = logging.getLogger(__name__)

EVENTS_VIA_ENV = "GOODPUT_EVENTS_VIA"
MIN_SEND_INTERVAL_S = 0.5  # the relay sends at most this often, whatever the ranks' flush interval: fuller requests


class NodeRelay:
    def __init__(self, config: ClientConfig, run_id: str) -> None:
        assert config.events_url is not None
        self.proc_id = f"relay{uuid.uuid4().hex}"
        self._token = config.token
        transport = HttpTransport(config.events_url, token=config.token, timeout_s=config.http_timeout_s,
                                  sender=self.proc_id)
        settings = PipelineSettings(
            spool_run_dir=config.spool_dir / run_dir_name(run_id), proc_id=self.proc_id,
            spool_max_bytes=config.spool_max_bytes, queue_capacity=config.queue_capacity,
            flush_interval_s=max(config.flush_interval_s, MIN_SEND_INTERVAL_S), http_timeout_s=config.http_timeout_s,
            max_batch_events=max(config.max_batch_events, 5_000), max_batch_bytes=max(config.max_batch_bytes, 8 << 20),
            replay_orphans=False, spool_metadata={"pid": os.getpid(), "run_id": run_id, "relay": True},
        )
        self.pipeline = Pipeline(settings, RecordBuilder(RecordContext(run_id=run_id, attempt=None, rank=None),
                                                         self.proc_id), transport)
        self.received_events = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="goodput-relay", daemon=True)

    @property
    def url(self) -> str:
        """The base URL the workers post to (their GOODPUT_EVENTS_VIA)."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> NodeRelay:
        self.pipeline.start()
        self._thread.start()
        return self

    def close(self, timeout_s: float) -> bool:
        """Stop taking records, send what is spooled within ``timeout_s``; True when all of it was acknowledged
        (what was not stays in the spool for the next process of the run or ``goodput sync``)."""
        self._server.shutdown()
        self._server.server_close()
        return self.pipeline.shutdown(timeout_s)

    def authorized(self, authorization: str | None) -> bool:
        """Whether a post carries the node's token (any post, when there is none)."""
        return not self._token or hmac.compare_digest(authorization or "", f"Bearer {self._token}")

    def accept(self, body: bytes | bytearray) -> int:
        """Spool a rank's batch durably; the number of records taken. Raises RefusedBody, OSError."""
        records = split_events(body)
        if not self.pipeline.append_encoded(records):
            raise OSError(f"the node relay cannot write its spool in {self.pipeline.settings.spool_run_dir}")
        self.received_events += len(records)
        return len(records)


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
                n = relay.accept(body)
            except RefusedBody as exc:
                if int(length) <= MAX_BODY_BYTES:
                    self._discard(int(length) - consumed)  # a rank halves its batch after a 413 it can read
                self._refuse(exc.status, str(exc))
            except OSError as exc:
                self._answer(503, str(exc), retry_after="1")
            else:
                self._send(200, b'{"accepted":%d,"duplicates":0}' % n)

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

        def _answer(self, status: int, message: str, retry_after: str | None = None) -> None:
            self._send(status, json.dumps({"error": {"code": "relay", "message": message}}).encode(), retry_after)

        def _send(self, status: int, body: bytes, retry_after: str | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            if retry_after:
                self.send_header("Retry-After", retry_after)
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # a line per request on stderr would drown the training log

    return Handler
