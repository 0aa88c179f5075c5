"""A relaunch of a run id is a new attempt: launches counted in the run's spool directory
(ingest_client.worker.generation)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ingest_client.worker.generation import LAUNCH_BASE_ENV, LAUNCH_ID_ENV, claim_launch_attempt


def _claim(run_dir: Path, env: dict[str, str], *, offset: int = 0, base: int = 0, worker: bool = False) -> int:
    return claim_launch_attempt(run_dir, env, torchrun_worker=worker, attempt_base=base, offset=offset)


def test_every_process_of_one_launch_gets_the_same_base_whatever_order_they_start_in(tmp_path: Path) -> None:
    first = _claim(tmp_path, {LAUNCH_ID_ENV: "launchA"})
    second = _claim(tmp_path, {LAUNCH_ID_ENV: "launchA"})
    assert (first, second) == (0, 0)
    assert _claim(tmp_path, {LAUNCH_ID_ENV: "launchA"}, offset=2) == 2  # torchrun's third round of that launch


def test_a_later_launch_starts_after_the_largest_attempt_of_the_earlier_ones(tmp_path: Path) -> None:
    for offset in range(3):  # launch A: rounds 0, 1, 2 (two restarts)
        _claim(tmp_path, {LAUNCH_ID_ENV: "launchA"}, offset=offset)
    # launchA's owner (this process, not a torchrun worker) is alive: pretend it ended by rewriting its owner
    path = next((tmp_path / "generations").glob("*launchA.launch"))
    lines = path.read_text().splitlines()
    head = lines[0].split()
    head[5], head[6] = "999999999", "1"  # a pid that is not running
    path.write_text("\n".join([" ".join(head), *lines[1:]]) + "\n")
    env: dict[str, str] = {LAUNCH_ID_ENV: "launchB"}
    assert _claim(tmp_path, env) == 3
    assert env[LAUNCH_BASE_ENV] == "3"


def test_a_launch_concurrent_with_a_live_one_on_this_host_joins_its_round(tmp_path: Path) -> None:
    assert _claim(tmp_path, {LAUNCH_ID_ENV: "nodeA"}, offset=0) == 0  # owner: this (live) process
    assert _claim(tmp_path, {LAUNCH_ID_ENV: "nodeB"}, offset=0) == 0


def test_goodput_attempt_base_is_the_lowest_base_and_a_relaunch_still_moves_past_it(tmp_path: Path) -> None:
    code = ("import sys; from pathlib import Path; "
            "from ingest_client.worker.generation import claim_launch_attempt as c; "
            "print(c(Path(sys.argv[1]), {}, torchrun_worker=False, attempt_base=int(sys.argv[2]), offset=0))")
    runs = [subprocess.run([sys.executable, "-c", code, str(tmp_path), "5"], capture_output=True, text=True,
                           check=True, cwd=Path(__file__).resolve().parents[2]).stdout.strip() for _ in range(3)]
    assert runs == ["5", "6", "7"]  # each `python train.py` is a launch of its own process, ended when it exits


def test_a_subprocess_that_inherited_the_base_reuses_it_without_the_files(tmp_path: Path) -> None:
    env = {LAUNCH_BASE_ENV: "4"}
    assert _claim(tmp_path / "missing", env, offset=1) == 5
    assert not (tmp_path / "missing").exists()


def test_a_torn_launch_file_is_ignored(tmp_path: Path) -> None:
    (tmp_path / "generations").mkdir()
    (tmp_path / "generations" / "h-launchX.launch").write_text("base 7 ho")
    assert _claim(tmp_path, {LAUNCH_ID_ENV: "launchY"}) == 0
