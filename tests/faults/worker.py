"""One simulated training rank for the fault tests: `python tests/faults/worker.py STEPS PERIOD_S FLUSH_S`.

Uses the real client (RANK, WORLD_SIZE, GOODPUT_* from the environment), records STEPS steps of PERIOD_S each
(with loss and lr), then flushes (again and again) for at most FLUSH_S and prints one JSON line: the steps it
recorded, whether everything was acknowledged, its counters, and the slowest `tracker.step()` bookkeeping it saw.
"""

from __future__ import annotations

import json
import os
import sys
import time

import ingest_client as goodput


def main() -> int:
    steps, period_s, flush_s = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
    tracker = goodput.init()
    tracker.resumed(0)
    started = time.perf_counter()
    worst_overhead_s = 0.0
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        with tracker.step(step) as s:
            t1 = time.perf_counter()
            time.sleep(period_s)
            s.loss, s.lr = 1.0 / step, 0.001
            t2 = time.perf_counter()
        t3 = time.perf_counter()
        worst_overhead_s = max(worst_overhead_s, (t1 - t0) + (t3 - t2))
    loop_s = time.perf_counter() - started
    # tracker.flush() gives up at the first failed send (the events stay in the spool), so a job that wants
    # everything delivered before it exits asks again until its deadline.
    deadline = time.monotonic() + flush_s
    acknowledged = tracker.flush(min(flush_s, 10.0))
    while not acknowledged and time.monotonic() < deadline:
        time.sleep(0.5)
        acknowledged = tracker.flush(max(0.1, min(10.0, deadline - time.monotonic())))
    stats = tracker.stats()
    # one write(2) of the whole line: ranks launched together share one stdout pipe, and a print() may write
    # the text and its newline separately (unbuffered stdout), interleaving two ranks' lines
    line = json.dumps({"steps": steps, "acknowledged": acknowledged, "loop_s": loop_s,
                       "worst_step_overhead_s": worst_overhead_s,
                       "stats": None if stats is None else {k: getattr(stats, k) for k in stats.__slots__}})
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), (line + "\n").encode())
    tracker.end_attempt("completed")
    tracker.shutdown(min(flush_s, 10.0))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
