"""A rank under `goodput launch` sends through its node relay, and to the collector once the relay is gone
(ingest_client/transport/relayed.py): only a refused connection means gone; a slow or busy relay is waited for."""

from __future__ import annotations

import socket
from collections.abc import Sequence

from ingest_client.transport.base import SendResult, SendStatus
from ingest_client.transport.http import HttpTransport
from ingest_client.transport.relayed import RelayedTransport


class _Recorder:
    def __init__(self, *answers: SendResult) -> None:
        self.answers = list(answers)
        self.sent: list[list[bytes]] = []

    def send(self, events: Sequence[bytes], /, *, timeout_s: float | None = None) -> SendResult:
        self.sent.append(list(events))
        return self.answers.pop(0) if self.answers else SendResult(status=SendStatus.OK, accepted=len(events))

    def close(self) -> None:
        pass


OK = SendResult(status=SendStatus.OK, accepted=1)


def test_a_refused_connection_sends_this_batch_and_every_later_one_to_the_collector() -> None:
    relay = _Recorder(OK, SendResult(status=SendStatus.RETRY, message="refused", refused_connection=True))
    direct = _Recorder()
    transport = RelayedTransport(relay, direct)
    assert transport.send([b"a"]).status is SendStatus.OK
    assert transport.send([b"b"]).status is SendStatus.OK and transport.relay_gone
    assert transport.send([b"c"]).status is SendStatus.OK
    assert relay.sent == [[b"a"], [b"b"]] and direct.sent == [[b"b"], [b"c"]]


def test_a_busy_or_slow_relay_is_not_given_up() -> None:
    relay = _Recorder(SendResult(status=SendStatus.RETRY, message="timed out"),
                      SendResult(status=SendStatus.RETRY, http_status=503, retry_after_s=1.0), OK)
    direct = _Recorder()
    transport = RelayedTransport(relay, direct)
    assert [transport.send([b"x"]).status for _ in range(3)] == [SendStatus.RETRY, SendStatus.RETRY, SendStatus.OK]
    assert direct.sent == [] and not transport.relay_gone


def test_the_http_transport_tells_a_refused_connection_from_a_timeout() -> None:
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    refused = HttpTransport(f"http://127.0.0.1:{port}/v1/events", timeout_s=2).send([b"{}"])
    assert refused.status is SendStatus.RETRY and refused.refused_connection
    with socket.socket() as silent:  # listens, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        port = silent.getsockname()[1]
        timed_out = HttpTransport(f"http://127.0.0.1:{port}/v1/events", timeout_s=0.3).send([b"{}"])
    assert timed_out.status is SendStatus.RETRY and not timed_out.refused_connection
