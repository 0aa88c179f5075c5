"""Tokens stay off command lines (issue 31, point 4): every user of a machine reads every process's command line
(`ps`, /proc/PID/cmdline) for as long as it runs. A token comes from a file (`--token-file`, GOODPUT_TOKEN_FILE)
or the environment; one given on a command line still works and is warned about; `goodput launch` hands it to the
command through its environment only. Real processes: `goodput launch` with a real client rank under it and its
node relay, `goodput sync`, `goodput simulate`, each against a fake collector that requires the token."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ingest_client.common.config import ClientConfig
from ingest_client.common.errors import ConfigError
from tests.ingest_client.conftest import GOODPUT, child_env
from tests.ingest_client.fake_collector import FakeCollector

TOKEN = "gpw_0123456789ab_tokenfilesecret"
WARNING = "puts the token on the command line"

# Under `goodput launch`: records what this process and every other one on the machine show on their command
# lines, and its own token variables, then trains 20 steps as rank 0 with the real client (through the relay).
PROBE = """
import json, os, pathlib, sys, time
token = pathlib.Path(sys.argv[2]).read_text().strip()
exposed = []
for proc in pathlib.Path("/proc").iterdir():
    try:
        if proc.name.isdigit() and token.encode() in (proc / "cmdline").read_bytes():
            exposed.append(proc.name)
    except OSError:
        pass
import ingest_client as goodput
tracker = goodput.init()
tracker.resumed(0)
for step in range(1, 21):
    with tracker.step(step):
        time.sleep(0.01)
acknowledged = tracker.flush(10.0)
pathlib.Path(sys.argv[1]).write_text(json.dumps({
    "exposed": exposed, "argv": sys.argv, "acknowledged": acknowledged,
    "env": {k: v for k, v in os.environ.items() if k.startswith("GOODPUT_TOKEN")},
}))
tracker.end_attempt("completed")
tracker.shutdown(10.0)
"""


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "goodput-token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


def test_a_token_file_gives_the_token_and_the_config_never_shows_it(token_file: Path) -> None:
    config = ClientConfig.from_env({"GOODPUT_URL": "http://collector:8000", "GOODPUT_TOKEN_FILE": str(token_file)})
    assert config.token == TOKEN and config.token_file == token_file
    assert TOKEN not in repr(config)
    assert ClientConfig.from_env({"GOODPUT_TOKEN_FILE": str(token_file)}, token="from-init").token == "from-init"
    assert ClientConfig.from_env({"GOODPUT_TOKEN": "from-env"}, token_file=str(token_file)).token == TOKEN


def test_two_token_variables_or_a_file_without_a_token_are_refused_by_name(token_file: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="both GOODPUT_TOKEN and GOODPUT_TOKEN_FILE are set"):
        ClientConfig.from_env({"GOODPUT_TOKEN": "x", "GOODPUT_TOKEN_FILE": str(token_file)})
    with pytest.raises(ConfigError, match=r"cannot read the token file .*missing.* \(set by init\(token_file=\.\.\.\) "
                                          r"or GOODPUT_TOKEN_FILE\)"):
        ClientConfig.from_env({"GOODPUT_TOKEN_FILE": str(tmp_path / "missing")})
    (tmp_path / "empty").write_text("\n\n")
    with pytest.raises(ConfigError, match="holds no token"):
        ClientConfig.from_env({"GOODPUT_TOKEN_FILE": str(tmp_path / "empty")})


def _launch(tmp_path: Path, collector: FakeCollector, *token_args: str, **env: str) -> tuple[dict[str, object], str]:
    token_copy = tmp_path / "probe-token"  # the probe's own copy, to look for the token in command lines
    token_copy.write_text(TOKEN)
    out = tmp_path / "probe.json"
    launched = subprocess.run(
        [*GOODPUT, "launch", "--run-id", "tokens", "--gpus", "1", *token_args, "--",
         sys.executable, "-c", PROBE, str(out), str(token_copy)],
        env=child_env(GOODPUT_URL=collector.url, GOODPUT_SPOOL_DIR=str(tmp_path / "spool"), RANK="0", LOCAL_RANK="0",
                     WORLD_SIZE="1", TORCHELASTIC_RESTART_COUNT="0", **env),
        capture_output=True, text=True, timeout=300)
    assert launched.returncode == 0, launched.stderr[-3000:]
    return json.loads(out.read_text()), launched.stderr


def _everything_arrived_with_the_token(collector: FakeCollector) -> None:
    assert collector.wait_for(lambda c: c.of_kind("run_end"), timeout_s=30)
    assert collector.step_numbers() == list(range(1, 21))
    assert {r["auth"] for r in collector.requests} == {f"Bearer {TOKEN}"}


def test_launch_hands_a_token_file_to_the_command_through_its_environment_only(token_file: Path,
                                                                                tmp_path: Path) -> None:
    collector = FakeCollector(token=TOKEN)
    try:
        probe, stderr = _launch(tmp_path, collector, "--token-file", str(token_file), GOODPUT_TOKEN="stale")
        assert probe["exposed"] == [], "a process shows the token on its command line"
        assert probe["env"] == {"GOODPUT_TOKEN_FILE": str(token_file)}
        assert probe["acknowledged"] is True
        assert WARNING not in stderr
        _everything_arrived_with_the_token(collector)
    finally:
        collector.stop()


def test_launch_takes_the_token_from_the_environment_and_passes_it_on_unseen(tmp_path: Path) -> None:
    collector = FakeCollector(token=TOKEN)
    try:
        probe, stderr = _launch(tmp_path, collector, GOODPUT_TOKEN=TOKEN)
        assert probe["exposed"] == [] and probe["env"] == {"GOODPUT_TOKEN": TOKEN}
        assert WARNING not in stderr
        _everything_arrived_with_the_token(collector)
    finally:
        collector.stop()


def test_launch_with_a_token_in_its_argv_warns_and_keeps_it_off_the_commands(tmp_path: Path) -> None:
    collector = FakeCollector(token=TOKEN)
    try:
        probe, stderr = _launch(tmp_path, collector, "--token", TOKEN)
        assert WARNING in stderr and "--token-file" in stderr
        exposed = probe["exposed"]
        assert isinstance(exposed, list) and len(exposed) == 1, "only the launcher itself shows it"
        assert TOKEN not in json.dumps(probe["argv"])
        assert probe["env"] == {"GOODPUT_TOKEN": TOKEN}
        _everything_arrived_with_the_token(collector)
    finally:
        collector.stop()


def test_launch_refuses_an_unreadable_token_file_before_starting_the_command(tmp_path: Path) -> None:
    launched = subprocess.run(
        [*GOODPUT, "launch", "--token-file", str(tmp_path / "missing"), "--", sys.executable, "-c",
         f"open({str(tmp_path / 'ran')!r}, 'w')"], env=child_env(), capture_output=True, text=True, timeout=120)
    assert launched.returncode == 2 and "cannot read the token file" in launched.stderr
    assert not (tmp_path / "ran").exists()


def _offline_spool(tmp_path: Path) -> Path:
    spool = tmp_path / "spool"
    code = ("import ingest_client as g, time\nt = g.init()\nt.resumed(0)\n"
            "for s in range(1, 6):\n    t.record_step(s, time.time() - 1, time.time())\nt.finish('finished')\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120,
                   env=child_env(GOODPUT_MODE="offline", GOODPUT_SPOOL_DIR=str(spool), GOODPUT_RUN_ID="synced"))
    return spool


@pytest.mark.parametrize("how", ["--token-file", "GOODPUT_TOKEN_FILE", "GOODPUT_TOKEN", "--token"])
def test_goodput_sync_takes_the_token_from_a_file_or_the_environment(how: str, token_file: Path,
                                                                     tmp_path: Path) -> None:
    spool = _offline_spool(tmp_path)
    args = {"--token-file": ["--token-file", str(token_file)], "--token": ["--token", TOKEN]}.get(how, [])
    env = {"GOODPUT_TOKEN_FILE": str(token_file), "GOODPUT_TOKEN": TOKEN}
    collector = FakeCollector(token=TOKEN)
    try:
        synced = subprocess.run([*GOODPUT, "sync", str(spool), "--url", collector.url, *args],
                                env=child_env(**({how: env[how]} if how in env else {})), capture_output=True,
                                text=True, timeout=120)
        assert synced.returncode == 0, synced.stdout + synced.stderr
        assert collector.step_numbers() == [1, 2, 3, 4, 5] and collector.of_kind("run_end")
        assert (WARNING in synced.stderr) is (how == "--token")
    finally:
        collector.stop()


def test_goodput_sync_refuses_two_token_variables(token_file: Path, tmp_path: Path) -> None:
    synced = subprocess.run([*GOODPUT, "sync", str(tmp_path), "--url", "http://127.0.0.1:9"], capture_output=True,
                            text=True, timeout=120,
                            env=child_env(GOODPUT_TOKEN=TOKEN, GOODPUT_TOKEN_FILE=str(token_file)))
    assert synced.returncode == 2 and "both GOODPUT_TOKEN and GOODPUT_TOKEN_FILE are set" in synced.stderr


@pytest.mark.parametrize("how", ["--token-file", "GOODPUT_TOKEN_FILE", "--token"])
def test_goodput_simulate_takes_the_token_from_a_file(how: str, token_file: Path) -> None:
    pytest.importorskip("httpx")  # the simulator is the server side's
    args = {"--token-file": ["--token-file", str(token_file)], "--token": ["--token", TOKEN]}.get(how, [])
    collector = FakeCollector(token=TOKEN)
    try:
        started = time.monotonic()
        simulated = subprocess.run(
            [*GOODPUT, "simulate", "--url", collector.url, "--hours", "0.01", "--ranks", "2", "--mtbf", "0",
             "--step-seconds", "10", *args],
            env=child_env(**({"GOODPUT_TOKEN_FILE": str(token_file)} if how == "GOODPUT_TOKEN_FILE" else {})),
            capture_output=True, text=True, timeout=300)
        assert simulated.returncode == 0, simulated.stdout + simulated.stderr
        assert collector.of_kind("run_end") and {r["auth"] for r in collector.requests} == {f"Bearer {TOKEN}"}
        assert (WARNING in simulated.stderr) is (how == "--token")
        assert time.monotonic() - started < 120
    finally:
        collector.stop()


def test_under_torchrun_no_agent_or_worker_shows_the_token(token_file: Path, tmp_path: Path) -> None:
    """torchrun's agent and its two workers (the real client, started by the bootstrap, sending through the relay)
    under `goodput launch --token-file`: none has the token on its command line, each finds the file's path in its
    environment, and every record reaches the collector with the token."""
    pytest.importorskip("torch")
    token_copy = tmp_path / "probe-token"
    token_copy.write_text(TOKEN)
    script = tmp_path / "probe.py"
    script.write_text(PROBE.replace('pathlib.Path(sys.argv[1])', 'pathlib.Path(sys.argv[1] + os.environ["RANK"])'))
    collector = FakeCollector(token=TOKEN)
    try:
        launched = subprocess.run(
            [*GOODPUT, "launch", "--run-id", "tokens-torchrun", "--token-file", str(token_file), "--",
             sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--nnodes", "1", "--standalone",
             "--max-restarts", "0", str(script), str(tmp_path / "probe-rank"), str(token_copy)],
            env=child_env(GOODPUT_URL=collector.url, GOODPUT_SPOOL_DIR=str(tmp_path / "spool")),
            capture_output=True, text=True, timeout=600)
        assert launched.returncode == 0, launched.stderr[-3000:]
        for rank in range(2):
            probe = json.loads((tmp_path / f"probe-rank{rank}").read_text())
            assert probe["exposed"] == [] and probe["env"] == {"GOODPUT_TOKEN_FILE": str(token_file)}
            assert probe["acknowledged"] is True
        assert collector.wait_for(lambda c: c.of_kind("run_end"), timeout_s=30)
        steps = {(e["rank"], s) for e in collector.of_kind("steps") for s in e["step"]}
        assert steps == {(rank, s) for rank in range(2) for s in range(1, 21)}
        assert {r["auth"] for r in collector.requests} == {f"Bearer {TOKEN}"}
    finally:
        collector.stop()
