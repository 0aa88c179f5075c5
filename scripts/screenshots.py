"""Refresh the documentation's screenshots (docs/images/) from the browser tests.

    python scripts/screenshots.py

The dashboard's browser tests (headless Chromium against a real `goodput serve` holding simulated runs) save a
screenshot of each page they check under artifacts/screenshots/. This runs the ones the docs show and copies them
to docs/images/ under the names the README and the guides use, so the pictures are the pages as they are.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHOTS = REPO / "artifacts" / "screenshots"
IMAGES = REPO / "docs" / "images"
# artifacts/screenshots/<test's name>.png -> docs/images/<doc's name>.png
PICTURES = {
    "fleet.png": "dashboard-fleet.png",
    "fleet-empty.png": "dashboard-empty.png",
    "run-restarts.png": "dashboard-run-restarts.png",
    "run-idle-gpus.png": "dashboard-run-idle-gpus.png",
    "run-rank-drill-down.png": "dashboard-run-rank.png",
    "run-stalled-live.png": "dashboard-run-hung.png",
    "run-curves.png": "dashboard-run-curves.png",
}
TESTS = ["tests/dashboards/test_browser.py", "tests/dashboards/test_run_page_browser.py",
         "tests/dashboards/test_curves_browser.py"]


def main() -> int:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "browser", *TESTS], cwd=REPO, env=env)
    missing = [shot for shot in PICTURES if not (SHOTS / shot).exists()]
    for shot, picture in PICTURES.items():
        if (SHOTS / shot).exists():
            shutil.copyfile(SHOTS / shot, IMAGES / picture)
            print(f"docs/images/{picture} <- artifacts/screenshots/{shot}")
    if missing:
        print(f"no screenshot for {', '.join(missing)}: the tests that take them did not run", file=sys.stderr)
    return done.returncode or (1 if missing else 0)


if __name__ == "__main__":
    raise SystemExit(main())
