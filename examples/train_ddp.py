"""A small data-parallel training job for torchrun (CPU, gloo), instrumented with goodput.

    goodput launch -- torchrun --standalone --nproc-per-node 2 --max-restarts 3 \
        examples/train_ddp.py --steps 200 --checkpoint-every 20 --ckpt-dir /tmp/ckpt --log-dir /tmp/logs

What it shows, besides the goodput calls (marked ``# goodput``):

- Atomic checkpoints: rank 0 writes into a temporary directory, fsyncs the files, writes a manifest of their
  sha256 hashes last, fsyncs it and publishes the directory with ``os.rename`` to ``ckpt-<step>``; the last
  ``--keep`` are kept. The loader takes the newest checkpoint whose manifest verifies and skips (and logs) the
  rest, so a write killed half-way is never loaded.
- Exact resume: parameters, Adam state, step, every rank's RNG state and the data position are saved, so a job
  killed and resumed ends with the same model digest as an uninterrupted one.
- Fault injection for tests and demos: ``--straggler-rank``, ``--hang-at-step``, ``--slow-checkpoint``,
  ``--kill-after-checkpoint`` (a rank SIGKILLed a moment after a checkpoint completed), ``--kill-after-step`` (a
  rank SIGKILLed right after a step) with ``--die-before-init-after-kill`` (every worker started after that kill
  dies before it joins the process group, so torchrun gives up: a job that fails for good), and
  ``--lose-on-resume optimizer|rng|data|step`` (a resume that restores only part of the state, which
  ``--digest-every N`` digests and the collector's resume check catch: every rank digests its complete state every
  N steps and at every checkpoint, and passes the loaded state's digest to ``tracker.resumed``, so a resume is
  checked the moment it loads).

Each rank appends one JSON line per notable event to ``<log-dir>/rank<R>.jsonl`` (``start``, ``resumed``,
``skipped_checkpoint``, ``step``, ``checkpoint``, ``hang``, ``killed``, ``died_before_init``, ``error``, ``done``) so
that tests can compare the goodput ledger with what the job itself saw.

Run end: ``tracker.finish()``. Under ``goodput launch`` the launcher reports ``run_end`` from torchrun's exit code
(it sees every restart and the final outcome); under plain torchrun ``finish()`` on rank 0 reports the run finished.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import ingest_client as goodput

MANIFEST = "manifest.json"
STATE_FILE = "state.pt"
CKPT_PREFIX = "ckpt-"
TMP_PREFIX = ".tmp-ckpt-"
KILLED_MARKER = "killed"  # in the log dir, once --kill-after-step has fired


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--steps", type=int, default=200, help="optimizer steps to train")
    p.add_argument("--checkpoint-every", type=int, default=20, help="steps between checkpoints; 0 = never")
    p.add_argument("--keep", type=int, default=3, help="published checkpoints to keep")
    p.add_argument("--ckpt-dir", type=Path, default=Path("checkpoints"))
    p.add_argument("--log-dir", type=Path, default=Path("logs"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="where the model and data live; cuda: GPU <local rank> modulo the GPUs present (ranks share "
                        "a GPU when there are fewer GPUs than ranks), collectives still over gloo")
    p.add_argument("--step-sleep", type=float, default=0.0, help="extra compute per step (seconds, every rank)")
    p.add_argument("--straggler-rank", type=int, help="this rank sleeps --straggler-sleep before every forward")
    p.add_argument("--straggler-sleep", type=float, default=0.0)
    p.add_argument("--hang-at-step", type=int, help="--hang-rank stops before this step's forward (first attempt)")
    p.add_argument("--hang-rank", type=int, default=0)
    p.add_argument("--hang-mode", choices=["stop", "sleep"], default="stop",
                   help="stop: SIGSTOP itself (a process stuck outside Python); sleep: sleep forever")
    p.add_argument("--slow-checkpoint", type=float, default=0.0,
                   help="seconds the checkpoint write takes extra (between the data files and the manifest)")
    p.add_argument("--timeout-s", type=float, default=60.0, help="gloo collective timeout")
    p.add_argument("--digest-every", type=int, default=0,
                   help="report a digest of the complete state (parameters, optimizer, data position, RNG, step) "
                        "every N steps and at every checkpoint (tracker.digest), and of the state loaded "
                        "(tracker.resumed's digest); 0 = never")
    p.add_argument("--lose-on-resume", choices=["optimizer", "rng", "data", "step"],
                   help="fault injection: when loading a checkpoint, drop this part of it (a fresh optimizer, the "
                        "RNG as at a fresh start, the data from its first batch, the step counter back to 0)")
    p.add_argument("--kill-after-checkpoint", type=int,
                   help="fault injection: --kill-rank SIGKILLs itself --kill-delay-s after the checkpoint of this step "
                        "completed (first attempt only)")
    p.add_argument("--kill-after-step", type=int,
                   help="fault injection: --kill-rank SIGKILLs itself right after this step (once per job: "
                        "<log-dir>/killed marks it)")
    p.add_argument("--die-before-init-after-kill", action="store_true",
                   help="fault injection: every worker started after --kill-after-step fired raises before "
                        "init_process_group (a restart that never gets going), until torchrun gives up")
    p.add_argument("--kill-rank", type=int, default=0)
    p.add_argument("--kill-delay-s", type=float, default=0.0)
    p.add_argument("--honor-checkpoint-requests", action="store_true",
                   help="also checkpoint when a scheduler asked for it (POST /v1/runs/{id}/checkpoint-request): "
                        "rank 0 learns of it, one all_reduce(MAX) per step makes every rank agree on the step")
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error(f"--steps must be >= 1, got {args.steps}")
    if args.digest_every < 0:
        p.error(f"--digest-every must be >= 0, got {args.digest_every}")
    if args.checkpoint_every < 0 or args.keep < 1:
        p.error(f"--checkpoint-every must be >= 0 and --keep >= 1, got {args.checkpoint_every} and {args.keep}")
    return args


# -- logging ------------------------------------------------------------------------------------


class EventLog:
    """One JSON object per line, appended to ``<log-dir>/rank<R>.jsonl`` (shared by every attempt)."""

    def __init__(self, log_dir: Path, rank: int, attempt: int) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        # Open for the process' life: the exit closes it (line-buffered, so a killed worker's lines are written).
        self._file = open(log_dir / f"rank{rank}.jsonl", "a", buffering=1, encoding="utf-8")  # noqa: SIM115
        self._common = {"rank": rank, "attempt": attempt}

    def write(self, event: str, **fields: Any) -> None:
        line = json.dumps({"event": event, **self._common, "time": time.time(), **fields})
        self._file.write(line + "\n")  # line-buffered: on disk (page cache) even if the process is killed next


# -- data ---------------------------------------------------------------------------------------


def make_dataset(seed: int, n: int = 4096, features: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """A synthetic regression task, the same on every rank for a given seed."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    w = torch.randn(features, 1, generator=g)
    y = torch.tanh(x @ w) + 0.05 * torch.randn(n, 1, generator=g)
    return x, y


class ShardedSampler:
    """Deterministic per-epoch shuffles, sharded by rank; its position (epoch, batch) is checkpointed."""

    def __init__(self, n: int, rank: int, world_size: int, batch_size: int, seed: int) -> None:
        self.n, self.rank, self.world_size, self.batch_size, self.seed = n, rank, world_size, batch_size, seed
        self.batches_per_epoch = (n // world_size) // batch_size
        self.epoch = 0
        self.batch = 0
        self._order = self._shard(0)

    def _shard(self, epoch: int) -> torch.Tensor:
        perm = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed * 100_003 + epoch))
        return perm[self.rank :: self.world_size]

    def next_indices(self) -> torch.Tensor:
        if self.batch == self.batches_per_epoch:
            self.epoch, self.batch = self.epoch + 1, 0
            self._order = self._shard(self.epoch)
        start = self.batch * self.batch_size
        self.batch += 1
        return self._order[start : start + self.batch_size]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batch": self.batch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.batch = int(state["epoch"]), int(state["batch"])
        self._order = self._shard(self.epoch)


# -- model --------------------------------------------------------------------------------------


def make_model(features: int = 16, hidden: int = 64) -> nn.Module:
    return nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Dropout(0.1),
                         nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))


def model_digest(model: nn.Module) -> str:
    """sha256 over the state_dict's names and tensor bytes, in name order."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def lr_at(step: int, base: float, warmup: int = 10) -> float:
    return base * min(1.0, step / warmup)


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_initialized():  # dropout on a GPU draws from the device's generator
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"])


def training_device(name: str) -> torch.device:
    if name == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("--device cuda: CUDA is not available (no GPU, or a CPU build of torch)")
    index = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


# -- checkpoints --------------------------------------------------------------------------------


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_checkpoint(ckpt_dir: Path, step: int, state: dict[str, Any], *, keep: int, slow_s: float = 0.0) -> Path:
    """Write ``state`` atomically to ``ckpt_dir/ckpt-<step>``: files, fsync, manifest last, rename."""
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    tmp = ckpt_dir / f"{TMP_PREFIX}{step}-{os.getpid()}"
    tmp.mkdir()
    torch.save(state, tmp / STATE_FILE)
    _fsync_path(tmp / STATE_FILE)
    if slow_s > 0:  # a slow file system; a kill here leaves a directory without a manifest
        time.sleep(slow_s)
    manifest = {"step": step, "files": {STATE_FILE: _sha256(tmp / STATE_FILE)}}
    (tmp / MANIFEST).write_text(json.dumps(manifest))
    _fsync_path(tmp / MANIFEST)
    _fsync_path(tmp)
    final = ckpt_dir / f"{CKPT_PREFIX}{step}"
    if final.exists():  # the same step saved by an earlier attempt: replace it
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_path(ckpt_dir)
    for old in published_checkpoints(ckpt_dir)[keep:]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def published_checkpoints(ckpt_dir: Path) -> list[Path]:
    """``ckpt-<step>`` directories, newest step first."""
    if not ckpt_dir.is_dir():
        return []
    found = []
    for path in ckpt_dir.iterdir():
        suffix = path.name[len(CKPT_PREFIX):]
        if path.name.startswith(CKPT_PREFIX) and suffix.isdigit() and path.is_dir():
            found.append((int(suffix), path))
    return [path for _, path in sorted(found, reverse=True)]


def verify_checkpoint(path: Path) -> str | None:
    """None if the manifest is present and every file matches its hash, else why not."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        return "no manifest"
    except (OSError, ValueError) as exc:
        return f"unreadable manifest: {exc}"
    files = manifest.get("files")
    if not isinstance(files, dict) or STATE_FILE not in files:
        return f"manifest lists no {STATE_FILE}"
    for name, digest in files.items():
        if not (path / name).is_file():
            return f"{name} missing"
        if _sha256(path / name) != digest:
            return f"{name} does not match its sha256 in the manifest"
    return None


def find_checkpoint(ckpt_dir: Path, log: EventLog | None = None) -> Path | None:
    """The newest published checkpoint that verifies; unpublished or bad ones are logged and skipped."""
    if ckpt_dir.is_dir() and log is not None:
        for path in sorted(ckpt_dir.glob(f"{TMP_PREFIX}*")):
            log.write("skipped_checkpoint", path=path.name, reason="never published (write interrupted)")
    for path in published_checkpoints(ckpt_dir):
        reason = verify_checkpoint(path)
        if reason is None:
            return path
        if log is not None:
            log.write("skipped_checkpoint", path=path.name, reason=reason)
    return None


def remove_unpublished(ckpt_dir: Path) -> None:
    for path in ckpt_dir.glob(f"{TMP_PREFIX}*"):
        shutil.rmtree(path, ignore_errors=True)


# -- training -----------------------------------------------------------------------------------


def init_distributed(restart: int, timeout: timedelta) -> None:
    """``init_process_group("gloo")`` with the store's keys namespaced by the worker group's round.

    torchrun keeps its TCP store across restarts of the worker group; without a prefix, a restarted
    group can read the previous group's gloo addresses and fail with "Connection refused". The round is
    goodput's generation when `goodput launch` started the job (it agrees on every node), else torchrun's
    restart count (per node: on a multi-node job it does not move on a node whose workers were restarted
    only because another node's failed).
    """
    store, rank, world_size = next(dist.rendezvous("env://", timeout=timeout))
    round_no = os.environ.get("GOODPUT_GENERATION") or str(restart)
    store = dist.PrefixStore(f"restart{round_no}", store)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timeout)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    device = training_device(args.device)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if args.die_before_init_after_kill and (args.log_dir / KILLED_MARKER).exists():
        EventLog(args.log_dir, int(os.environ.get("RANK", "0")), attempt).write("died_before_init", pid=os.getpid())
        raise RuntimeError("fault injection (--die-before-init-after-kill): this worker dies before it joins the "
                           "process group")
    init_distributed(attempt, timedelta(seconds=args.timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    log = EventLog(args.log_dir, rank, attempt)
    log.write("start", world_size=world, pid=os.getpid())

    tracker = goodput.init()  # goodput: run id and collector URL from GOODPUT_RUN_ID / GOODPUT_URL

    torch.manual_seed(args.seed)  # the same initial weights on every rank
    x_all, y_all = (t.to(device) for t in make_dataset(args.seed))
    model = nn.parallel.DistributedDataParallel(make_model(x_all.shape[1]).to(device))
    tracker.time_collectives(model)  # goodput: time spent in all-reduce (a comm hook on gloo, NCCL's timers on GPUs)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    sampler = ShardedSampler(len(x_all), rank, world, args.batch_size, args.seed)
    torch.manual_seed(args.seed * 1000 + rank + 1)  # per-rank dropout masks (seeds the GPU's generator too)
    random.seed(args.seed * 1000 + rank + 1)

    # Rank 0 picks the checkpoint, so every rank loads the same one.
    choice: list[str | None] = [None]
    if rank == 0:
        found = find_checkpoint(args.ckpt_dir, log)
        choice[0] = str(found) if found is not None else None
    dist.broadcast_object_list(choice, src=0)
    start_step = 0
    loaded_step: int | None = None
    if choice[0] is not None:
        state = torch.load(Path(choice[0]) / STATE_FILE, weights_only=False, map_location="cpu")
        lose = args.lose_on_resume  # fault injection: a resume that restores only part of the state
        model.module.load_state_dict(state["model"])
        if lose != "optimizer":
            optimizer.load_state_dict(state["optimizer"])
        if lose != "data":
            sampler.load_state_dict(state["sampler"])
        if lose != "rng":
            set_rng_state(state["rng"][rank])
        loaded_step = int(state["step"])
        start_step = 0 if lose == "step" else loaded_step
    checkpoint_name = Path(choice[0]).name if choice[0] else None
    loaded_digest = (state_digest(model, optimizer, sampler, start_step)
                     if args.digest_every and choice[0] is not None else None)
    log.write("resumed", step=start_step, checkpoint=checkpoint_name, lost=args.lose_on_resume if choice[0] else None,
              digest=loaded_digest)
    # goodput: 0 = fresh start; name the checkpoint loaded, so the collector knows it existed whatever else arrived,
    # and the loaded state's digest, which it compares with the one reported when that checkpoint was saved
    tracker.resumed(start_step, checkpoint_step=loaded_step, checkpoint=checkpoint_name, digest=loaded_digest)

    step = start_step
    try:
        for step in range(start_step + 1, args.steps + 1):
            lr = lr_at(step, args.lr)
            for group in optimizer.param_groups:
                group["lr"] = lr
            t0 = time.time()
            with tracker.step(step) as s:  # goodput: one optimizer step
                if rank == args.straggler_rank:
                    time.sleep(args.straggler_sleep)
                if step == args.hang_at_step and rank == args.hang_rank and attempt == 0:
                    hang(log, step, args.hang_mode)
                idx = sampler.next_indices()
                loss = nn.functional.mse_loss(model(x_all[idx]), y_all[idx])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                if args.step_sleep:
                    time.sleep(args.step_sleep)
                s.loss, s.lr = loss.item(), lr  # goodput
            log.write("step", step=step, start=t0, end=time.time())
            requested = args.honor_checkpoint_requests and checkpoint_requested(tracker)
            if requested:
                log.write("checkpoint_requested", step=step)
            checkpoint_due = requested or bool(args.checkpoint_every and step % args.checkpoint_every == 0)
            if args.digest_every and (step % args.digest_every == 0 or checkpoint_due):
                # goodput: compared across restarts, and (taken before the checkpoint) with a resume's load
                tracker.digest(step, state_digest(model, optimizer, sampler, step))
            if checkpoint_due:
                checkpoint(args, log, tracker, step, model, optimizer, sampler, rank)
            if step == args.kill_after_step and rank == args.kill_rank and not (args.log_dir / KILLED_MARKER).exists():
                (args.log_dir / KILLED_MARKER).touch()
                log.write("killed", step=step, pid=os.getpid())
                os.kill(os.getpid(), signal.SIGKILL)
    except Exception as exc:
        log.write("error", step=step, error=f"{type(exc).__name__}: {exc}"[:500])
        raise  # goodput's excepthook records attempt_end(failed); torchrun restarts the group

    digest = model_digest(model.module)
    log.write("done", final_step=step, digest=digest)
    # goodput: rank 0 reports the run finished, unless `goodput launch` does (it knows torchrun's exit code)
    tracker.finish()
    dist.barrier()  # no rank tears gloo down while a peer still uses it
    dist.destroy_process_group()
    log.write("exit")
    return 0


def checkpoint(args: argparse.Namespace, log: EventLog, tracker: goodput.Tracker, step: int,
               model: nn.parallel.DistributedDataParallel, optimizer: torch.optim.Optimizer,
               sampler: ShardedSampler, rank: int) -> None:
    """Every rank hands its RNG state to rank 0, which writes; all ranks wait at the barrier.

    Only the writer records the checkpoint span: the ledger charges it on the whole world, and a
    writer killed mid-write leaves no ``checkpoint_end`` at all (a torn checkpoint), not a failed one.
    """
    rng_states: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(rng_states, rng_state())
    if rank == 0:
        with tracker.checkpoint(step):  # goodput: checkpoint time
            state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                     "sampler": sampler.state_dict(), "rng": rng_states}
            path = save_checkpoint(args.ckpt_dir, step, state, keep=args.keep, slow_s=args.slow_checkpoint)
        remove_unpublished(args.ckpt_dir)
        log.write("checkpoint", step=step, path=path.name)
    if step == args.kill_after_checkpoint and rank == args.kill_rank and attempt_number() == 0:
        # The checkpoint is complete (its files and manifest published, tracker.checkpoint returned): die a moment
        # later from another thread, wherever the training loop is by then.
        log.write("kill_scheduled", step=step, delay_s=args.kill_delay_s, pid=os.getpid())
        threading.Timer(args.kill_delay_s, os.kill, (os.getpid(), signal.SIGKILL)).start()
    dist.barrier()


def state_digest(model: nn.parallel.DistributedDataParallel, optimizer: torch.optim.Optimizer,
                 sampler: ShardedSampler, step: int) -> str:
    """goodput.state_digest of this rank's complete state, what a checkpoint saves of it and nothing else."""
    return goodput.state_digest(model.module, optimizer, sampler, rng_state(), {"step": step})


def attempt_number() -> int:
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def checkpoint_requested(tracker: goodput.Tracker) -> bool:
    """Whether any rank's tracker saw a pending checkpoint request (only rank 0 polls, by default): every rank
    calls this at the same step and gets the same answer, so they all checkpoint together."""
    flag = torch.tensor([1 if tracker.should_checkpoint() else 0])  # goodput: a non-blocking read
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def hang(log: EventLog, step: int, mode: str) -> None:
    log.write("hang", step=step, mode=mode, pid=os.getpid())
    if mode == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)  # like a process stuck in a driver call: no signal handler runs
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    code = main()
    # Everything is saved and reported by now. torch 2.13 (CPU, gloo) sometimes aborts in a C++ destructor at
    # interpreter exit ("terminate called without an active exception", about 1 run in 10 on our CI machine),
    # which torchrun would count as a failed attempt: skip the interpreter's teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
