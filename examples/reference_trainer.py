"""The reference resume experiment (../shared/reference/resume-experiments.md): a small deterministic NumPy trainer.

    python examples/reference_trainer.py --ckpt-dir /tmp/ckpt --log /tmp/train.jsonl [--crash-at 275]
    python examples/reference_trainer.py --ckpt-dir /tmp/ckpt --log /tmp/train.jsonl   # resumes from the newest

A 10-16-1 network (tanh hidden layer, dropout p = 0.2 on it, sigmoid output, binary cross-entropy), SGD with
momentum 0.9, learning rate halving every 200 steps, mini-batches drawn from a permutation seeded by the epoch.
The complete state, and nothing else: ``params``, ``mom``, ``step``, ``epoch``, ``pos``, ``drop_rng``. The loop runs
until the step counter reaches ``--steps``; every ``--checkpoint-every`` steps it saves the state.

Checkpoint writers:
- ``atomic`` (default): files into a temporary directory, fsync, a manifest of their sha256 hashes written last,
  publish by rename to ``step-<n>``; the loader skips a directory without a valid manifest and falls back to the
  previous one.
- ``naive``: overwrites the files of one directory in place, the metadata (step, epoch, pos, RNG) last; a write
  that dies half-way leaves the old metadata with half of the arrays already new.

Fault injection: ``--crash-at N`` (``os._exit(137)`` right after step N, as a SIGKILL would), ``--crash-in-checkpoint
N`` (dies half-way through the step-N checkpoint write), ``--discard momentum|rng|data|step`` (the resume drops
that piece of the loaded state).

goodput: ``goodput.init()`` at default client settings (GOODPUT_URL, GOODPUT_RUN_ID; TORCHELASTIC_RESTART_COUNT
numbers the attempt); ``tracker.step`` with loss and lr, ``tracker.checkpoint`` around every write,
``tracker.digest`` of the complete state every ``--digest-every`` steps and at every checkpoint (before it: the
checkpoint's durable write puts the digest on disk), and ``tracker.resumed(step, checkpoint_step=...,
checkpoint=..., digest=...)`` with the digest of the state loaded, by the same function: the collector compares
the two the moment the resume happens. Each event is also logged as a JSON line to ``--log`` (the ground truth for
tests).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import ingest_client as goodput

N_SAMPLES = 512
N_FEATURES = 10
N_HIDDEN = 16
BATCH = 32
DROPOUT = 0.2
MOMENTUM = 0.9
LR_START = 0.5
LR_HALVING_STEPS = 200
DATA_SEED = 1234
INIT_SEED = 0
DROPOUT_SEED = 42
PARAM_NAMES = ("W1", "b1", "W2", "b2")
MANIFEST = "manifest.json"
META = "meta.json"
STEP_PREFIX = "step-"
TMP_PREFIX = ".tmp-step-"
NAIVE_DIR = "latest"
KEEP = 3


@dataclass
class State:
    params: dict[str, np.ndarray]
    mom: dict[str, np.ndarray]
    step: int
    epoch: int
    pos: int
    drop_rng: np.random.Generator


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--steps", type=int, default=600, help="train until the step counter reaches this")
    p.add_argument("--checkpoint-every", type=int, default=50)
    p.add_argument("--ckpt-dir", type=Path, required=True)
    p.add_argument("--log", type=Path, required=True, help="JSON lines, appended (shared by every attempt)")
    p.add_argument("--writer", choices=["atomic", "naive"], default="atomic")
    p.add_argument("--crash-at", type=int, help="os._exit(137) right after this step (and its checkpoint, if any)")
    p.add_argument("--crash-in-checkpoint", type=int, help="die half-way through writing this step's checkpoint")
    p.add_argument("--discard", choices=["momentum", "rng", "data", "step"],
                   help="fault injection: the resume drops this piece of the loaded state")
    p.add_argument("--digest-every", type=int, default=5,
                   help="tracker.digest of the state every N steps and at every checkpoint, and the loaded state's "
                        "digest in tracker.resumed; 0 = never")
    p.add_argument("--step-sleep", type=float, default=0.02,
                   help="seconds of extra work per step (the real computation takes microseconds)")
    return p.parse_args(argv)


# -- model ------------------------------------------------------------------------------------------------------


def dataset() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(DATA_SEED)
    x = rng.standard_normal((N_SAMPLES, N_FEATURES))
    w = rng.standard_normal(N_FEATURES)
    y = ((x @ w + 0.5 * np.sin(3 * x[:, 0]) + 0.3 * rng.standard_normal(N_SAMPLES)) > 0).astype(np.float64)
    return x, y[:, None]


def fresh_state() -> State:
    rng = np.random.RandomState(INIT_SEED)
    params = {"W1": rng.standard_normal((N_FEATURES, N_HIDDEN)) * 0.5, "b1": np.zeros(N_HIDDEN),
              "W2": rng.standard_normal((N_HIDDEN, 1)) * 0.5, "b2": np.zeros(1)}
    return State(params=params, mom={k: np.zeros_like(v) for k, v in params.items()}, step=0, epoch=0, pos=0,
                 drop_rng=np.random.default_rng(DROPOUT_SEED))


def lr_at(step: int) -> float:
    """The learning rate of step `step` (counted from 1): halved every LR_HALVING_STEPS steps."""
    return LR_START * 0.5 ** ((step - 1) // LR_HALVING_STEPS)


def next_batch(state: State) -> np.ndarray:
    """Sample indices of the batch at (epoch, pos); advances the position (a new permutation each epoch)."""
    per_epoch = N_SAMPLES // BATCH
    order = np.random.default_rng(state.epoch).permutation(N_SAMPLES)
    idx = order[state.pos * BATCH:(state.pos + 1) * BATCH]
    state.pos += 1
    if state.pos == per_epoch:
        state.epoch, state.pos = state.epoch + 1, 0
    return idx


def train_step(state: State, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """One SGD-with-momentum step on the next batch; returns (loss before the update, lr)."""
    state.step += 1
    lr = lr_at(state.step)
    idx = next_batch(state)
    xb, yb = x[idx], y[idx]
    p = state.params
    h = np.tanh(xb @ p["W1"] + p["b1"])
    mask = (state.drop_rng.random(h.shape) >= DROPOUT) / (1.0 - DROPOUT)
    hd = h * mask
    out = 1.0 / (1.0 + np.exp(-(hd @ p["W2"] + p["b2"])))
    eps = 1e-12
    loss = float(-np.mean(yb * np.log(out + eps) + (1 - yb) * np.log(1 - out + eps)))
    dz = (out - yb) / len(idx)
    dpre = (dz @ p["W2"].T) * mask * (1 - h * h)
    grads = {"W2": hd.T @ dz, "b2": dz.sum(0), "W1": xb.T @ dpre, "b1": dpre.sum(0)}
    for name in PARAM_NAMES:
        state.mom[name] = MOMENTUM * state.mom[name] + grads[name]
        p[name] = p[name] - lr * state.mom[name]
    return loss, lr


def digest(state: State) -> str:
    """ingest_client.state_digest of the complete state (every array, the counters, the RNG's state)."""
    return goodput.state_digest({"params": state.params, "mom": state.mom, "step": state.step,
                                 "epoch": state.epoch, "pos": state.pos,
                                 "drop_rng": state.drop_rng.bit_generator.state})


def weights_digest(state: State) -> str:
    h = hashlib.sha256()
    for name in PARAM_NAMES:
        h.update(np.ascontiguousarray(state.params[name]).tobytes())
    return h.hexdigest()


# -- checkpoints --------------------------------------------------------------------------------------------------


def state_files(state: State) -> list[tuple[str, Callable[[Path], None]]]:
    """(file name, writer) of every piece of the state, arrays first, the metadata last."""
    files: list[tuple[str, Callable[[Path], None]]] = []
    for group, arrays in (("params", state.params), ("mom", state.mom)):
        for name in PARAM_NAMES:
            files.append((f"{group}.{name}.npy", functools.partial(_save_array, array=arrays[name])))
    meta = {"step": state.step, "epoch": state.epoch, "pos": state.pos,
            "drop_rng": state.drop_rng.bit_generator.state}
    files.append((META, lambda path: _write_synced(path, json.dumps(meta).encode())))
    return files


def _save_array(path: Path, array: np.ndarray) -> None:
    with open(path, "wb") as f:
        np.save(f, array)
        f.flush()
        os.fsync(f.fileno())


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def save_atomic(ckpt_dir: Path, state: State, crash_half_way: bool) -> Path:
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    tmp = ckpt_dir / f"{TMP_PREFIX}{state.step}-{os.getpid()}"
    tmp.mkdir()
    files = state_files(state)
    for i, (name, write) in enumerate(files):
        if crash_half_way and i == len(files) // 2:
            os._exit(137)
        write(tmp / name)
    manifest = {"step": state.step, "files": {name: _sha256(tmp / name) for name, _ in files}}
    _write_synced(tmp / MANIFEST, json.dumps(manifest).encode())
    _fsync_dir(tmp)
    final = ckpt_dir / f"{STEP_PREFIX}{state.step}"
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(ckpt_dir)
    for old in published(ckpt_dir)[KEEP:]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def save_naive(ckpt_dir: Path, state: State, crash_half_way: bool) -> Path:
    target = ckpt_dir / NAIVE_DIR
    target.mkdir(parents=True, exist_ok=True)
    files = state_files(state)
    for i, (name, write) in enumerate(files):
        if crash_half_way and i == len(files) // 2:
            os._exit(137)
        write(target / name)
    return target


def published(ckpt_dir: Path) -> list[Path]:
    """``step-<n>`` directories, newest first."""
    found = []
    for path in ckpt_dir.glob(f"{STEP_PREFIX}*") if ckpt_dir.is_dir() else ():
        suffix = path.name[len(STEP_PREFIX):]
        if suffix.isdigit():
            found.append((int(suffix), path))
    return [p for _, p in sorted(found, reverse=True)]


def valid(path: Path) -> bool:
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        return all(_sha256(path / name) == digest for name, digest in manifest["files"].items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def find_checkpoint(ckpt_dir: Path, writer: str, log: Callable[..., None]) -> Path | None:
    if writer == "naive":
        target = ckpt_dir / NAIVE_DIR
        return target if (target / META).exists() else None
    for path in sorted(ckpt_dir.glob(f"{TMP_PREFIX}*")) if ckpt_dir.is_dir() else ():
        log("skipped_checkpoint", path=path.name, reason="never published")
    for path in published(ckpt_dir):
        if valid(path):
            return path
        log("skipped_checkpoint", path=path.name, reason="no valid manifest")
    return None


def load(path: Path) -> State:
    meta = json.loads((path / META).read_text())
    rng = np.random.default_rng()
    rng.bit_generator.state = meta["drop_rng"]
    arrays = {group: {name: np.load(path / f"{group}.{name}.npy") for name in PARAM_NAMES}
              for group in ("params", "mom")}
    return State(params=arrays["params"], mom=arrays["mom"], step=int(meta["step"]), epoch=int(meta["epoch"]),
                 pos=int(meta["pos"]), drop_rng=rng)


def discard(state: State, what: str | None) -> None:
    """Fault injection: forget one piece of the loaded state (as a resume that does not restore it would)."""
    fresh = fresh_state()
    if what == "momentum":
        state.mom = fresh.mom
    elif what == "rng":
        state.drop_rng = fresh.drop_rng
    elif what == "data":
        state.epoch, state.pos = fresh.epoch, fresh.pos
    elif what == "step":
        state.step = fresh.step


# -- the loop -----------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    args.log.parent.mkdir(parents=True, exist_ok=True)
    log_file = open(args.log, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 (open for the process' life)

    def log(event: str, **fields: Any) -> None:
        log_file.write(json.dumps({"event": event, "attempt": attempt, "time": time.time(), **fields}) + "\n")

    log("start", pid=os.getpid())
    tracker = goodput.init()  # goodput: default client settings
    x, y = dataset()
    found = find_checkpoint(args.ckpt_dir, args.writer, log)
    if found is None:
        state = fresh_state()
        tracker.resumed(0)  # goodput: a fresh start
        log("resumed", step=0, checkpoint=None, checkpoint_step=None)
    else:
        state = load(found)
        checkpoint_step = state.step
        discard(state, args.discard)
        loaded_digest = digest(state)  # of the state the loop goes on from, as the writer digested it
        # goodput: checked at once against the digest the writer reported when it saved this checkpoint
        tracker.resumed(state.step, checkpoint_step=checkpoint_step, checkpoint=found.name,
                        digest=loaded_digest if args.digest_every else None)
        log("resumed", step=state.step, checkpoint=found.name, checkpoint_step=checkpoint_step,
            discarded=args.discard, digest=loaded_digest)
    save = save_atomic if args.writer == "atomic" else save_naive
    while state.step < args.steps:
        t0 = time.time()
        with tracker.step(state.step + 1) as s:  # goodput: one optimizer step
            loss, lr = train_step(state, x, y)
            if args.step_sleep:
                time.sleep(args.step_sleep)
            s.loss, s.lr = loss, lr
        step_digest = digest(state)
        checkpoint_due = bool(args.checkpoint_every) and state.step % args.checkpoint_every == 0
        if args.digest_every and (state.step % args.digest_every == 0 or checkpoint_due):
            tracker.digest(state.step, step_digest)  # goodput: compared across restarts, and with a resume's load
        log("step", step=state.step, loss=loss, lr=lr, digest=step_digest, start=t0, end=time.time())
        if checkpoint_due:
            torn = args.crash_in_checkpoint == state.step and attempt == 0
            if torn:
                log("crash", step=state.step, where="checkpoint")
            with tracker.checkpoint(state.step):  # goodput: checkpoint time
                path = save(args.ckpt_dir, state, torn)
            log("checkpoint", step=state.step, path=path.name)
        if args.crash_at == state.step and attempt == 0:
            log("crash", step=state.step, where="after step")
            os._exit(137)  # as a SIGKILL: no handler, no flush
    log("done", step=state.step, weights=weights_digest(state), digest=digest(state))
    tracker.finish()  # goodput: without `goodput launch`, rank 0 reports the run finished
    return 0


if __name__ == "__main__":
    sys.exit(main())
