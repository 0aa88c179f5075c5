from __future__ import annotations

from pathlib import Path

import pytest

import ingest_client as goodput
from ingest_client.common.config import ClientConfig, Mode
from ingest_client.worker.context import context_from_env
from ingest_client.worker.spool import run_dir_name


def test_argument_beats_environment_beats_default(tmp_path: Path) -> None:
    env = {"GOODPUT_URL": "http://env:1", "GOODPUT_QUEUE_CAPACITY": "500", "GOODPUT_SPOOL_DIR": str(tmp_path)}
    config = ClientConfig.from_env(env, url="http://arg:2")
    assert config.url == "http://arg:2" and config.queue_capacity == 500 and config.spool_dir == tmp_path
    assert config.mode is Mode.ONLINE and config.events_url == "http://arg:2/v1/events"
    default = ClientConfig.from_env({})
    assert default.mode is Mode.OFFLINE and default.spool_dir == Path("~/.cache/goodput/spool").expanduser()


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"GOODPUT_MODE": "sometimes"}, "GOODPUT_MODE"),
        ({"GOODPUT_MODE": "online"}, "GOODPUT_URL"),
        ({"GOODPUT_QUEUE_CAPACITY": "10"}, "queue_capacity must be at least 64, got 10"),
        ({"GOODPUT_QUEUE_CAPACITY": "lots"}, "GOODPUT_QUEUE_CAPACITY"),
        ({"GOODPUT_SIGTERM_REASON": "bored"}, "sigterm_reason"),
        ({"GOODPUT_URL": "collector:80"}, "http://"),
    ],
)
def test_bad_configuration_names_the_field_and_the_env_var(env: dict[str, str], needle: str) -> None:
    with pytest.raises(goodput.ConfigError, match=needle):
        ClientConfig.from_env(env)


def test_context_reads_torchrun_environment_and_attempt_base() -> None:
    env = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "TORCHELASTIC_RESTART_COUNT": "2",
           "TORCHELASTIC_RUN_ID": "elastic-id"}
    ctx = context_from_env(run_id=None, attempt_base=10, environ=env)
    assert (ctx.run_id, ctx.rank, ctx.local_rank, ctx.world_size, ctx.attempt) == ("elastic-id", 3, 1, 8, 12)
    assert context_from_env(run_id="mine", attempt_base=0, environ=env).run_id == "mine"


def test_multi_rank_job_without_a_run_id_is_a_config_error() -> None:
    with pytest.raises(goodput.ConfigError, match="GOODPUT_RUN_ID"):
        context_from_env(run_id=None, attempt_base=0, environ={"WORLD_SIZE": "2", "RANK": "1",
                                                              "TORCHELASTIC_RUN_ID": "none"})
    assert context_from_env(run_id=None, attempt_base=0, environ={}).run_id.startswith("local-")


def test_init_reads_goodput_env_and_returns_one_tracker_per_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GOODPUT_MODE", "offline")
    monkeypatch.setenv("GOODPUT_SPOOL_DIR", str(tmp_path))
    monkeypatch.setenv("GOODPUT_RUN_ID", "from-env")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "loses")
    monkeypatch.setenv("GOODPUT_ATTEMPT_BASE", "4")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    tracker = goodput.init(install_handlers=False)
    assert tracker.context.run_id == "from-env" and tracker.context.attempt == 5
    assert goodput.init() is tracker and goodput.get_tracker() is tracker
    assert tracker.spool_dir is not None and tracker.spool_dir.startswith(str(tmp_path))


def test_init_raises_config_error_only_at_init(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "not-a-number")
    with pytest.raises(goodput.ConfigError, match="RANK"):
        goodput.init(mode="offline")
    with pytest.raises(goodput.ConfigError, match="unknown init"):
        goodput.init(mode="offline", queue_size=5)


def test_attempt_is_the_base_plus_the_larger_of_restart_count_and_generation() -> None:
    env = {"RANK": "2", "WORLD_SIZE": "4", "TORCHELASTIC_RESTART_COUNT": "0", "GOODPUT_RUN_ID": "r"}
    # A node restarted for another node's failure: its restart count stayed 0, its generation is 2.
    ctx = context_from_env(run_id="r", attempt_base=10, environ=env, generation_of=lambda run_id: 2)
    assert (ctx.attempt, ctx.restart_count, ctx.generation) == (12, 0, 2)
    assert ctx.attempt_start_fields()["restart_count"] == 0 and ctx.attempt_start_fields()["generation"] == 2
    counted = context_from_env(run_id="r", attempt_base=0, environ={**env, "TORCHELASTIC_RESTART_COUNT": "3"},
                               generation_of=lambda run_id: 1)
    assert counted.attempt == 3, "a lost count never lowers the attempt below torchrun's restart count"
    unknown = context_from_env(run_id="r", attempt_base=0, environ=env, generation_of=lambda run_id: None)
    assert unknown.attempt == 0 and "generation" not in unknown.attempt_start_fields()


def _worker_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, restart_count: int = 0) -> None:
    for name, value in {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "GOODPUT_RUN_ID": "gen-run",
                        "TORCHELASTIC_RESTART_COUNT": str(restart_count), "GOODPUT_MODE": "offline",
                        "GOODPUT_SPOOL_DIR": str(tmp_path), "GOODPUT_LAUNCH_ID": "launchA"}.items():
        monkeypatch.setenv(name, value)
    for name in ("GOODPUT_GENERATION", "GOODPUT_WORKER_PID"):  # set by init(); undone after the test
        monkeypatch.delenv(name, raising=False)


def test_each_worker_process_claims_the_next_generation_once_and_passes_it_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ingest_client.worker import api

    seen = []
    for _ in range(3):  # three worker processes of one local rank, one per round, on a node whose count stays 0
        _worker_env(monkeypatch, tmp_path)
        tracker = goodput.init(install_handlers=False)
        seen.append((tracker.context.attempt, tracker.context.generation, tracker.context.restart_count))
        assert goodput.init() is tracker
        api.reset_for_tests()
    assert seen == [(0, 0, 0), (1, 1, 0), (2, 2, 0)]
    # A subprocess of the last worker (same environment) or a second tracker reuses its generation.
    tracker = goodput.init(install_handlers=False)
    assert tracker.context.generation == 2
    counts = list((tmp_path / run_dir_name("gen-run") / "generations").glob("*launchA-local1.starts"))
    assert len(counts) == 1 and len(counts[0].read_text().splitlines()) == 3
    # Another agent (another launch) on the same host counts for itself.
    api.reset_for_tests()
    _worker_env(monkeypatch, tmp_path)
    monkeypatch.setenv("GOODPUT_LAUNCH_ID", "launchB")
    assert goodput.init(install_handlers=False).context.generation == 0
