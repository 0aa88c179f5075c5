"""tracker.digest(step, value) and state_digest(): a cheap hot-path call, and a hash that sees every tensor."""

from __future__ import annotations

from typing import Any

import pytest

import ingest_client as goodput
from ingest_client.transport import InMemoryTransport
from tests.ingest_client.wire import validate_event


def test_digest_is_sent_as_a_digest_event_of_the_step(make_tracker: Any) -> None:
    transport = InMemoryTransport()
    tracker = make_tracker(transport=transport)
    tracker.resumed(0)
    with tracker.step(1) as s:
        s.loss = 0.5
    tracker.digest(1, "0123abcd")
    assert tracker.flush(5.0)
    (digest,) = transport.of_kind("digest")
    assert (digest["step"], digest["value"], digest["attempt"], digest["rank"]) == (1, "0123abcd", 0, 0)
    assert all(validate_event(e) is None for e in transport.events)


@pytest.mark.parametrize("value", ["", "x" * 129, "tab\there", None, 42])
def test_an_invalid_digest_is_dropped_on_the_flusher_and_the_rest_of_the_batch_goes_through(
    make_tracker: Any, value: Any
) -> None:
    transport = InMemoryTransport()
    tracker = make_tracker(transport=transport)
    tracker.digest(3, value)
    tracker.digest(4, "f" * 128)
    assert tracker.flush(5.0)
    assert [(d["step"], d["value"]) for d in transport.of_kind("digest")] == [(4, "f" * 128)]
    assert all(validate_event(e) is None for e in transport.events)


def test_state_digest_of_plain_state_is_stable_and_sees_every_value() -> None:
    state = {"step": 3, "names": ["a", "b"], "lr": 1e-3}
    assert goodput.state_digest(state) == goodput.state_digest({"lr": 1e-3, "names": ["a", "b"], "step": 3})
    assert goodput.state_digest(state) != goodput.state_digest({**state, "step": 4})
    assert len(goodput.state_digest(state)) == 32 and len(goodput.state_digest(state, length=8)) == 8
    with pytest.raises(ValueError, match="length must be between 1 and 64"):
        goodput.state_digest(state, length=65)


def test_state_digest_of_a_module_and_optimizer_changes_with_an_optimizer_step() -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    before = goodput.state_digest(model, optimizer)
    twin = torch.nn.Linear(4, 2)
    twin.load_state_dict(model.state_dict())
    assert goodput.state_digest(twin, torch.optim.Adam(twin.parameters(), lr=0.1)) == before
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    after = goodput.state_digest(model, optimizer)
    assert after != before
    assert goodput.state_digest(model) != after, "the optimizer's moments are part of the digest"
    assert goodput.state_digest(torch.zeros(2, dtype=torch.float32)) != goodput.state_digest(
        torch.zeros(2, dtype=torch.float64)), "dtype counts"
    assert goodput.state_digest(torch.zeros(2, dtype=torch.bfloat16))  # dtypes numpy lacks are hashed too
