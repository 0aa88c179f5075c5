"""A tiny instrumented training loop for the Slurm tests: ``worker.py LOG STEPS STEP_S``.

Records each step through the client (``goodput.init()``, ``tracker.step``) and logs it to LOG (one JSON line
per event: ``start`` with its pid, ``step``, ``done``), the job's own record the tests compare with the ledger.
"""

from __future__ import annotations

import json
import os
import sys
import time

import ingest_client as goodput


def main() -> int:
    log_path, steps, step_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    with open(log_path, "a", buffering=1) as log:
        log.write(json.dumps({"event": "start", "pid": os.getpid(), "time": time.time()}) + "\n")
        tracker = goodput.init()
        tracker.resumed(0)
        for step in range(1, steps + 1):
            with tracker.step(step):
                time.sleep(step_s)
            log.write(json.dumps({"event": "step", "step": step, "time": time.time()}) + "\n")
        tracker.finish()
        log.write(json.dumps({"event": "done", "time": time.time()}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
