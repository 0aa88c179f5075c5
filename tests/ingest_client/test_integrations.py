"""Framework callbacks, against stand-in base classes (lightning/transformers are not installed)."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from ingest_client.transport import InMemoryTransport


class _Base:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass


def _fake_module(monkeypatch: pytest.MonkeyPatch, name: str, **attrs: Any) -> None:
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        monkeypatch.setitem(sys.modules, ".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
    for key, value in attrs.items():
        setattr(sys.modules[name], key, value)


def test_lightning_callback_records_one_step_per_optimizer_step(monkeypatch: pytest.MonkeyPatch,
                                                                 make_tracker: Any) -> None:
    _fake_module(monkeypatch, "lightning.pytorch.callbacks", Callback=_Base)
    monkeypatch.delitem(sys.modules, "ingest_client.integrations.lightning", raising=False)
    from ingest_client.integrations.lightning import GoodputCallback

    transport = InMemoryTransport()
    callback = GoodputCallback(tracker=make_tracker(transport=transport))
    trainer = types.SimpleNamespace(global_step=10)
    callback.on_train_start(trainer, None)
    for micro in range(6):  # 3 optimizer steps of 2 micro-batches
        callback.on_train_batch_start(trainer, None, None, micro)
        if micro % 2 == 1:
            trainer.global_step += 1
        callback.on_train_batch_end(trainer, None, None, None, micro)
    callback.on_train_end(trainer, None)
    assert transport.of_kind("resume")[0]["step"] == 10
    assert transport.of_kind("steps")[0]["step"] == [11, 12, 13]


def test_huggingface_callback_records_steps(monkeypatch: pytest.MonkeyPatch, make_tracker: Any) -> None:
    _fake_module(monkeypatch, "transformers", TrainerCallback=_Base)
    monkeypatch.delitem(sys.modules, "ingest_client.integrations.huggingface", raising=False)
    from ingest_client.integrations.huggingface import GoodputCallback

    transport = InMemoryTransport()
    callback = GoodputCallback(tracker=make_tracker(transport=transport))
    state = types.SimpleNamespace(global_step=0)
    callback.on_train_begin(None, state, None)
    for _ in range(3):
        callback.on_step_begin(None, state, None)
        state.global_step += 1
        callback.on_step_end(None, state, None)
    callback.on_train_end(None, state, None)
    assert transport.of_kind("resume")[0]["step"] == 0
    assert transport.of_kind("steps")[0]["step"] == [1, 2, 3]
