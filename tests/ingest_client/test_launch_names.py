"""Every record of a rank names its launch (ingest_client.worker.generation.launch_name): the same name for every
process and round of one launch, another for any other launch, made without any file (docs/events.md, "Launches")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ingest_client.launcher.launch import worker_environment
from ingest_client.worker.generation import LAUNCH_ID_ENV, LAUNCH_NAME_ENV, launch_name
from tests.ingest_client.conftest import spooled_records

REPO = Path(__file__).resolve().parents[2]
WORKER = {"RANK": "0", "TORCHELASTIC_RESTART_COUNT": "0"}


def _name_in_child(env: dict[str, str], *, worker: bool) -> str:
    code = ("import os; from ingest_client.worker.generation import launch_name; "
            f"print(launch_name(dict(os.environ), torchrun_worker={worker}))")
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                          check=True, cwd=REPO).stdout.strip()


def test_the_workers_of_one_agent_share_a_name_and_processes_started_alone_do_not() -> None:
    # children of this process stand for the workers of one torchrun agent (their parent)
    workers = {_name_in_child(WORKER, worker=True) for _ in range(2)}
    alone = {_name_in_child({}, worker=False) for _ in range(2)}
    assert len(workers) == 1 and len(alone) == 2
    (name,) = workers
    assert f"-agent{os.getpid()}." in name and not name.endswith(".")


def test_goodput_launch_names_each_node_s_launch_and_the_name_holds_the_machine_s_boot() -> None:
    env = {LAUNCH_ID_ENV: "launchabc"}
    name = launch_name(env, torchrun_worker=True)
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:12]
    assert name.endswith(f"-launchabc.{boot}") and env[LAUNCH_NAME_ENV] == name
    assert launch_name({LAUNCH_NAME_ENV: name, LAUNCH_ID_ENV: "other"}, torchrun_worker=True) == name  # inherited
    child = worker_environment({**env, LAUNCH_NAME_ENV: name}, run_id="r", bootstrap=False)
    assert LAUNCH_NAME_ENV not in child  # a launch started from a worker's environment names itself anew


def test_records_of_a_rank_carry_the_launch_and_run_level_records_do_not(tmp_path: Path) -> None:
    code = ("import ingest_client as g; t = g.init(run_id='r', mode='offline', spool_dir=__import__('sys').argv[1]); "
            "t.resumed(0)\nwith t.step(1): pass\nt.finish('finished'); t.shutdown(2)")
    env = {**os.environ, LAUNCH_ID_ENV: "launchxyz"}
    env.pop(LAUNCH_NAME_ENV, None)
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env, check=True, cwd=REPO, timeout=60)
    records = spooled_records(tmp_path)
    kinds = {r["kind"]: r for r in records}
    assert {"attempt_start", "resume", "steps", "attempt_end", "run_end"} <= set(kinds), json.dumps(records)
    names = {r.get("launch") for r in records if "attempt" in r}
    assert len(names) == 1 and "-launchxyz." in str(names.pop())
    assert "launch" not in kinds["run_end"]
