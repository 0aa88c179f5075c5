"""Client fixes found by the torchrun tests, reproduced in one real process each (fast, no torchrun)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.ingest_client.conftest import spooled_records
from tests.test_cli import env_with


def test_sigterm_after_the_attempt_ended_still_flushes_its_last_rows(tmp_path: Path) -> None:
    # torchrun SIGTERMs the surviving ranks right after one of them raised: the excepthook has ended the
    # attempt, and the last step and the attempt_end are still in memory when SIGTERM arrives.
    script = textwrap.dedent(f"""
        import os, signal
        import ingest_client as goodput
        tracker = goodput.init(run_id="sigterm-run", mode="offline", spool_dir={str(tmp_path)!r},
                               flush_interval_s=10.0)
        tracker.resumed(0)
        with tracker.step(1):
            pass
        tracker.end_attempt("failed", detail="RuntimeError: peer closed")  # what the excepthook does
        os.kill(os.getpid(), signal.SIGTERM)
        raise SystemExit("not reached: SIGTERM ends the process")
    """)
    proc = subprocess.run([sys.executable, "-c", script], check=False, env=env_with(), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == -signal.SIGTERM, proc.stderr
    records = spooled_records(tmp_path)
    ends = [r for r in records if r["kind"] == "attempt_end"]
    assert [(e["reason"], e.get("detail")) for e in ends] == [("failed", "RuntimeError: peer closed")]
    assert [s for r in records if r["kind"] == "steps" for s in r["step"]] == [1]
