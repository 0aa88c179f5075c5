"""A small torchrun job (CPU, gloo) for the attempt tests: fails where asked, logs what each process saw.

Every worker process appends JSON lines to ``<log-dir>/<node>-local<L>.jsonl`` (``ATTEMPTS_JOB_NODE`` names the
node; ranks can move between nodes from one rendezvous round to the next, local ranks do not): ``start`` before
anything is imported (pid, rank, torchrun's restart count), ``init`` as it calls ``init_process_group``, ``joined``
once the process group is up, ``resumed``, ``step``, ``checkpoint``, ``failing`` and ``done``. A generation that
dies in ``init_process_group`` leaves only its ``start`` (and ``init``) lines. The job decides "first generation"
from a marker file it writes when it fails, so no count of goodput's decides what it does.

Faults (each in the first generation only):

- ``--die-in-init RANK``: that rank calls ``init_process_group`` on a port nobody listens on, with a short
  timeout, and raises there; its peers wait in their own ``init_process_group`` until torchrun stops them.
- ``--fail-at-step K``: on the node whose environment has ``ATTEMPTS_JOB_FAIL=1``, local rank 0 exits with code 1
  right after step K; every other rank spends ``--pause-s`` in local work after step K (an evaluation, a slow
  data loader; on NCCL a peer stuck in a collective with the dead rank looks the same to torchrun), so the other
  node's agent restarts its workers for the membership change, not for a failure of its own.
  ``ATTEMPTS_JOB_FAIL=kill``: that rank SIGKILLs itself instead (after its records reached the spool: the kill
  loses nothing the ledger could have seen).
- ``--hold-at-step K``: once some generation failed (the marker exists), every rank stops after step K for good
  (``halted`` in the log, once per job: a marker) and waits to be killed with the whole job, as when a node or
  the allocation is lost; a relaunch of the job then resumes from the last checkpoint.
- ``--hold-before-init NODE``: the worker on that node logs ``holding`` and waits before ``init_process_group``
  for a peer's signal that never comes (the test kills it and its agent: a peer that never comes); its peers wait in
  ``init_process_group`` until ``--init-timeout`` (20 s) and raise.

Goodput: only ``init()`` after the process group is up, as the README shows; under ``goodput launch`` the
bootstrap has already recorded the attempt.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

_T0 = time.time()
NODE = os.environ.get("ATTEMPTS_JOB_NODE", "node")
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", "0"))


class Log:
    def __init__(self, log_dir: str) -> None:
        os.makedirs(log_dir, exist_ok=True)
        path = os.path.join(log_dir, f"{NODE}-local{LOCAL_RANK}.jsonl")
        # Open for the process' life: line-buffered, so a killed worker's lines are already written.
        self._file = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
        self.common = {"node": NODE, "local_rank": LOCAL_RANK, "pid": os.getpid()}

    def write(self, event: str, **fields: object) -> None:
        self._file.write(json.dumps({"event": event, **self.common, "time": time.time(), **fields}) + "\n")


def _arg(name: str, default: str | None = None) -> str | None:
    argv = sys.argv[1:]
    return argv[argv.index(name) + 1] if name in argv else default


def main() -> int:
    log_dir = _arg("--log-dir")
    ckpt_dir = _arg("--ckpt-dir")
    assert log_dir and ckpt_dir, "--log-dir and --ckpt-dir are required"
    steps = int(_arg("--steps", "20") or 20)
    every = int(_arg("--checkpoint-every", "5") or 5)
    step_sleep = float(_arg("--step-sleep", "0.02") or 0.02)
    fail_at = int(_arg("--fail-at-step", "0") or 0)
    pause_s = float(_arg("--pause-s", "8") or 8)
    die_in_init = int(_arg("--die-in-init", "-1") or -1)
    hold_at = int(_arg("--hold-at-step", "0") or 0)
    hold_before_init = _arg("--hold-before-init")
    init_timeout_s = float(_arg("--init-timeout", "20") or 20)
    marker = os.path.join(log_dir, "failed-once")
    held = os.path.join(log_dir, "held-once")
    first = not os.path.exists(marker)
    hold = bool(hold_at) and not first and not os.path.exists(held)

    log = Log(log_dir)
    log.write("start", time=_T0, rank=int(os.environ["RANK"]),
              restart_count=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")), first=first)

    from datetime import timedelta

    import torch
    import torch.distributed as dist

    import ingest_client as goodput

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    if first and rank == die_in_init:
        open(marker, "w").close()
        log.write("failing", where="init_process_group", rank=rank)
        # Nobody listens on port 1: the store's connect is refused until the timeout, then it raises.
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:1", rank=rank, world_size=world,
                                timeout=timedelta(seconds=2))
        raise AssertionError("init_process_group on a closed port returned")
    if first and hold_before_init == NODE:
        log.write("holding", rank=rank)
        while True:  # a peer that never comes: nothing ends this but a kill
            time.sleep(1.0)
    log.write("init", rank=rank)
    dist.init_process_group("gloo", timeout=timedelta(seconds=init_timeout_s))
    log.common["rank"] = rank
    log.write("joined", world_size=world)

    tracker = goodput.init()
    os.makedirs(ckpt_dir, exist_ok=True)
    saved = sorted(int(name[5:]) for name in os.listdir(ckpt_dir) if name.startswith("ckpt-"))
    start_step = saved[-1] if saved else 0
    log.write("resumed", step=start_step)
    tracker.resumed(start_step)
    value = torch.zeros(4)
    for step in range(start_step + 1, steps + 1):
        t0 = time.time()
        with tracker.step(step):
            inner_start = time.time()  # the tracker's step holds [inner_start, inner_end] and is inside [t0, end]
            time.sleep(step_sleep)
            value += 1
            dist.all_reduce(value)
            inner_end = time.time()
        log.write("step", step=step, start=t0, end=time.time(), inner_start=inner_start, inner_end=inner_end)
        if every and step % every == 0:
            if rank == 0:
                with tracker.checkpoint(step):
                    path = os.path.join(ckpt_dir, f".tmp-{step}")
                    with open(path, "w") as f:
                        f.write(str(step))
                    os.rename(path, os.path.join(ckpt_dir, f"ckpt-{step}"))
                log.write("checkpoint", step=step)
            dist.barrier()
        if first and step == fail_at:
            fail = os.environ.get("ATTEMPTS_JOB_FAIL")
            if fail in ("1", "kill") and LOCAL_RANK == 0:
                open(marker, "w").close()
                log.write("failing", where="step", step=step)
                tracker.flush(2.0)
                if fail == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                os._exit(1)
            log.write("pause", step=step, seconds=pause_s)
            time.sleep(pause_s)
        if hold and step == hold_at:
            dist.barrier()
            if rank == 0:
                open(held, "w").close()
            tracker.flush(2.0)
            log.write("halted", step=step)
            time.sleep(3600)
    log.write("done", final_step=steps)
    tracker.finish()  # goodput launch reports run_end
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # see examples/train_ddp.py: skip torch's occasionally aborting teardown
