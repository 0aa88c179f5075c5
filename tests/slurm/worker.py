"""A tiny instrumented training loop for the Slurm tests.

``worker.py LOG STEPS STEP_S [CKPT_FILE CKPT_EVERY honour|ignore]``: records each step through the client
(``goodput.init()``, ``tracker.step``) and logs it to LOG (one JSON line per event: ``start`` with its pid and
Slurm restart count, ``resumed``, ``step``, ``checkpoint``, ``done``), the job's own record the tests compare
with the ledger. With a checkpoint file it resumes from the step saved there and saves every CKPT_EVERY steps;
``honour``: when ``tracker.should_checkpoint()`` says a checkpoint was requested (a preemption warning), it saves
at once and then waits, stepping no more, for the preemption to end it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import ingest_client as goodput


def main() -> int:
    log_path, steps, step_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    ckpt = Path(sys.argv[4]) if len(sys.argv) > 4 else None
    every = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    honour = len(sys.argv) > 6 and sys.argv[6] == "honour"
    with open(log_path, "a", buffering=1) as log:
        def note(event: str, **fields: object) -> None:
            log.write(json.dumps({"event": event, "time": time.time(), **fields}) + "\n")

        note("start", pid=os.getpid(), restarts=int(os.environ.get("SLURM_RESTART_COUNT", "0")))
        tracker = goodput.init()
        start = int(ckpt.read_text()) if ckpt is not None and ckpt.exists() else 0
        if start:
            tracker.resumed(start, checkpoint_step=start, checkpoint=str(ckpt))
        else:
            tracker.resumed(0)
        note("resumed", step=start)

        def save(step: int, requested: bool) -> None:
            assert ckpt is not None
            with tracker.checkpoint(step):
                tmp = ckpt.with_suffix(".tmp")
                tmp.write_text(str(step))
                os.replace(tmp, ckpt)
            note("checkpoint", step=step, requested=requested)

        for step in range(start + 1, steps + 1):
            with tracker.step(step):
                time.sleep(step_s)
            note("step", step=step)
            if honour and tracker.should_checkpoint():
                save(step, requested=True)
                while True:  # the preemption ends this allocation; no step now would survive it
                    time.sleep(0.1)
            if ckpt is not None and every and step % every == 0:
                save(step, requested=False)
        tracker.finish()
        note("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
