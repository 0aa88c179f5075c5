"""Framework callbacks against the real libraries, in this process (CPU, tiny models, synthetic data).

The multi-process, killed-and-relaunched runs are in tests/torchrun/test_lightning.py and test_huggingface.py.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from ingest_client.transport import InMemoryTransport
from ingest_client.worker.generation import LAUNCH_ID_ENV


def _pairs(transport: InMemoryTransport) -> dict[int, tuple[float, float]]:
    """step -> (first checkpoint_start, last checkpoint_end)."""
    out: dict[int, tuple[float, float]] = {}
    for start in transport.of_kind("checkpoint_start"):
        lo, hi = out.get(start["step"], (start["time"], start["time"]))
        out[start["step"]] = (min(lo, start["time"]), hi)
    for end in transport.of_kind("checkpoint_end"):
        lo, hi = out[end["step"]]
        out[end["step"]] = (lo, max(hi, end["time"]))
    return out


def test_lightning_callback_reports_optimizer_steps_with_loss_and_lr_checkpoints_and_digests(
        tmp_path: Path, make_tracker: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("lightning")
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from ingest_client.integrations.lightning import GoodputCallback

    monkeypatch.setenv(LAUNCH_ID_ENV, "test")
    saves: list[tuple[int, float, float]] = []

    class Timed(ModelCheckpoint):
        def _save_checkpoint(self, trainer: Any, filepath: str) -> None:
            import time
            start = time.time()
            super()._save_checkpoint(trainer, filepath)
            saves.append((trainer.global_step, start, time.time()))

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(4, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return nn.functional.mse_loss(self.net(batch[0]), batch[1])

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    transport = InMemoryTransport()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=6, accumulate_grad_batches=2, logger=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                        callbacks=[GoodputCallback(tracker=make_tracker(transport=transport), digest_every_n_steps=2),
                                   Timed(dirpath=tmp_path / "ckpt", every_n_train_steps=3, save_top_k=-1,
                                         save_last=True)])
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    trainer.fit(Tiny(), DataLoader(data, batch_size=4))

    assert transport.of_kind("resume")[0]["step"] == 0
    steps = [row for batch in transport.of_kind("steps")
             for row in zip(batch["step"], batch["loss"], batch["lr"], strict=True)]
    assert [s for s, _, _ in steps] == [1, 2, 3, 4, 5, 6]  # one per optimizer step, 2 micro-batches each
    assert all(loss is not None and lr == pytest.approx(0.1) for _, loss, lr in steps), steps
    assert [d["step"] for d in transport.of_kind("digest")] == [2, 3, 4, 6]  # every 2 steps, and each checkpoint
    spans = _pairs(transport)
    assert sorted(spans) == sorted({s for s, _, _ in saves}) == [3, 6]  # save_last's copy is the same checkpoint
    for step, (lo, hi) in spans.items():
        written = [(a, b) for s, a, b in saves if s == step]  # the job's timing encloses trainer.save_checkpoint
        first, last = min(a for a, _ in written), max(b for _, b in written)
        assert lo == pytest.approx(first, abs=0.01) and hi == pytest.approx(last, abs=0.01), (lo, hi, written)


def test_lightning_reports_the_trainers_rank_when_the_environment_has_none(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("lightning")
    import types

    import ingest_client
    from ingest_client.integrations.lightning import GoodputCallback

    monkeypatch.setenv(LAUNCH_ID_ENV, "test")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.setenv(name, "0")
        monkeypatch.delenv(name)
    monkeypatch.setenv("GOODPUT_MODE", "offline")
    monkeypatch.setenv("GOODPUT_SPOOL_DIR", str(tmp_path / "spool"))
    callback = GoodputCallback(run_id="rank-from-trainer", install_handlers=False)
    trainer = types.SimpleNamespace(global_rank=1, world_size=2, local_rank=1,
                                    save_checkpoint=lambda *a, **k: None, global_step=0)
    callback.setup(trainer, None, "fit")
    tracker = ingest_client.get_tracker()
    assert tracker is not None and (tracker.context.rank, tracker.context.world_size) == (1, 2)


def test_a_callback_built_outside_torchrun_names_the_launch_its_spawned_ranks_inherit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("lightning")
    from ingest_client.integrations.lightning import GoodputCallback

    monkeypatch.setenv(LAUNCH_ID_ENV, "x")
    monkeypatch.delenv(LAUNCH_ID_ENV)
    GoodputCallback()
    first = os.environ[LAUNCH_ID_ENV]
    GoodputCallback()  # a second callback (or the spawned rank re-running the script) keeps it
    assert os.environ[LAUNCH_ID_ENV] == first


def test_huggingface_callback_reports_steps_with_logged_loss_and_lr_and_times_each_save(
        tmp_path: Path, make_tracker: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    import time

    import torch
    import transformers

    from ingest_client.integrations.huggingface import GoodputCallback

    monkeypatch.setenv(LAUNCH_ID_ENV, "test")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    saves: list[tuple[int, float, float]] = []

    class Timed(transformers.Trainer):
        def _save_checkpoint(self, model: Any, trial: Any) -> None:
            start = time.time()
            super()._save_checkpoint(model, trial)
            saves.append((self.state.global_step, start, time.time()))

    config = transformers.GPT2Config(vocab_size=32, n_positions=8, n_embd=16, n_layer=1, n_head=2)
    ids = torch.randint(0, 32, (32, 8), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": row, "labels": row} for row in ids]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=4, save_steps=2, logging_steps=1, per_device_train_batch_size=4,
        gradient_accumulation_steps=2, report_to=[], use_cpu=True, disable_tqdm=True)
    transport = InMemoryTransport()
    trainer = Timed(model=transformers.GPT2LMHeadModel(config), args=args, train_dataset=data,
                    callbacks=[GoodputCallback(tracker=make_tracker(transport=transport), digest_every_n_steps=2)])
    trainer.train()

    assert transport.of_kind("resume")[0]["step"] == 0
    steps = [row for batch in transport.of_kind("steps")
             for row in zip(batch["step"], batch["loss"], batch["lr"], strict=True)]
    assert [s for s, _, _ in steps] == [1, 2, 3, 4]
    assert all(loss is not None and lr is not None for _, loss, lr in steps), steps
    assert [d["step"] for d in transport.of_kind("digest")] == [2, 4]
    spans = _pairs(transport)
    assert sorted(spans) == [s for s, _, _ in saves] == [2, 4]
    for step, start, end in saves:
        lo, hi = spans[step]
        assert lo <= start and hi >= end and hi - lo < (end - start) + 0.05  # the write, not the step before it


def test_lightning_resume_reports_the_loaded_state_s_digest_equal_to_the_one_taken_when_it_was_saved(
        tmp_path: Path, make_tracker: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("lightning")
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from ingest_client.integrations.lightning import GoodputCallback

    monkeypatch.setenv(LAUNCH_ID_ENV, "test")

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(4, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return nn.functional.mse_loss(self.net(batch[0]), batch[1])

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))

    def fit(max_steps: int, transport: InMemoryTransport, ckpt_path: str | None) -> None:
        trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=max_steps, logger=False,
                            enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                            callbacks=[GoodputCallback(tracker=make_tracker(transport=transport),
                                                       digest_every_n_steps=2),
                                       ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=3,
                                                       save_top_k=-1)])
        trainer.fit(Tiny(), DataLoader(data, batch_size=4), ckpt_path=ckpt_path)

    first, second = InMemoryTransport(), InMemoryTransport()
    fit(3, first, None)
    (saved,) = (d["value"] for d in first.of_kind("digest") if d["step"] == 3)  # at the checkpoint (3 % 2 != 0)
    (path,) = (tmp_path / "ckpt").glob("*step=3*.ckpt")
    fit(5, second, str(path))
    (resume,) = second.of_kind("resume")
    assert (resume["step"], resume["checkpoint_step"]) == (3, 3)
    assert resume["digest"] == saved
    fresh = InMemoryTransport()
    fit(2, fresh, None)
    assert [r.get("digest") for r in fresh.of_kind("resume")] == [None]  # a fresh start loaded nothing


def test_huggingface_resume_reports_the_loaded_state_s_digest_equal_to_the_one_taken_when_it_was_saved(
        tmp_path: Path, make_tracker: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    import torch
    import transformers

    from ingest_client.integrations.huggingface import GoodputCallback

    monkeypatch.setenv(LAUNCH_ID_ENV, "test")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config = transformers.GPT2Config(vocab_size=32, n_positions=8, n_embd=16, n_layer=1, n_head=2)
    ids = torch.randint(0, 32, (32, 8), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": row, "labels": row} for row in ids]

    def train(max_steps: int, transport: InMemoryTransport, resume: str | None) -> None:
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path / "out"), max_steps=max_steps, save_steps=3, logging_steps=1,
            per_device_train_batch_size=4, report_to=[], use_cpu=True, disable_tqdm=True, seed=0)
        trainer = transformers.Trainer(
            model=transformers.GPT2LMHeadModel(config), args=args, train_dataset=data,
            callbacks=[GoodputCallback(tracker=make_tracker(transport=transport), digest_every_n_steps=2)])
        trainer.train(resume_from_checkpoint=resume)

    first, second = InMemoryTransport(), InMemoryTransport()
    train(3, first, None)
    assert [d["step"] for d in first.of_kind("digest")] == [2, 3]  # every 2 steps, and the save at 3
    saved = first.of_kind("digest")[1]["value"]
    train(5, second, str(tmp_path / "out" / "checkpoint-3"))
    (resume,) = second.of_kind("resume")
    assert (resume["step"], resume["checkpoint_step"]) == (3, 3)
    assert resume["digest"] == saved
