"""services.settings: every setting read from its documented variable, errors that name it, and the hand-off to
uvicorn's worker processes."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from pydantic_settings import BaseSettings

from services.settings import (
    ClientSettings,
    DashboardSettings,
    IngestSettings,
    LiveSettings,
    MetricsSettings,
    PlausibilitySettings,
    ServerSettings,
    ServiceSettings,
    worker_environment,
)

SECTIONS: tuple[type[BaseSettings], ...] = (ServerSettings, IngestSettings, PlausibilitySettings, LiveSettings,
                                            MetricsSettings, DashboardSettings, ClientSettings)


@pytest.mark.parametrize("section", SECTIONS, ids=lambda s: s.__name__)
def test_every_description_starts_with_the_variable_that_sets_it(section: type[BaseSettings]) -> None:
    for name, info in section.model_fields.items():
        assert isinstance(info.validation_alias, str) and info.validation_alias.startswith("GOODPUT_"), name
        assert (info.description or "").startswith(f"{info.validation_alias}: "), name


def test_the_documented_names_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable, value in {"GOODPUT_DATABASE_URL": "postgresql://u@h/db", "GOODPUT_DASHBOARD": "false",
                            "GOODPUT_HANG_FLOOR_S": "45", "GOODPUT_MAX_WORLD_SIZE": "1024",
                            "GOODPUT_METRICS_CACHE_TTL_S": "2", "GOODPUT_METRICS_MAX_RUNS": "",
                            "GOODPUT_DASHBOARD_TOKEN": "gpr_x",
                            "GOODPUT_MAX_INFLIGHT_BODY_BYTES_PER_CLIENT": "1000"}.items():
        monkeypatch.setenv(variable, value)
    settings = ServiceSettings()
    assert settings.server.database_url == "postgresql://u@h/db" and settings.server.serve_dashboard is False
    assert settings.live.hang_floor_s == 45.0 and settings.plausibility.max_world_size == 1024
    assert settings.metrics.cache_ttl_s == 2.0 and settings.metrics.max_runs == 200  # empty: unset
    assert settings.dashboard.token == "gpr_x" and "gpr_x" not in repr(settings)
    assert settings.ingest.max_inflight_body_bytes_per_client == 1000


def test_constructor_arguments_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOODPUT_DATABASE_URL", "postgresql://u@h/db")
    monkeypatch.setenv("GOODPUT_WARM_ANALYSES_S", "3")
    server = ServerSettings(database_url="sqlite://")
    assert server.database_url == "sqlite://" and server.warm_analyses_s == 3.0


@pytest.mark.parametrize(("variable", "value"), [("GOODPUT_METRICS_CACHE_TTL_S", "3601"),
                                                 ("GOODPUT_METRICS_RUN_WINDOW_H", "0"),
                                                 ("GOODPUT_METRICS_MAX_RUNS", "many"),
                                                 ("GOODPUT_HANG_FLOOR_S", "-1"),
                                                 ("GOODPUT_DASHBOARD_REFRESH_S", "0.5"),
                                                 ("GOODPUT_MAX_WORLD_SIZE", str(1 << 21))])
def test_a_bad_value_is_refused_with_the_variables_name(monkeypatch: pytest.MonkeyPatch, variable: str,
                                                        value: str) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValidationError, match=variable):
        ServiceSettings()


def test_a_worker_reads_back_exactly_the_settings_it_was_handed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOODPUT_DASHBOARD_TOKEN", "gpr_parent_only")  # the handed settings say: no token
    handed = ServiceSettings(server=ServerSettings(database_url="postgresql://u@h/db", serve_dashboard=False),
                             live=LiveSettings(hang_floor_s=0.1 + 0.2),
                             metrics=MetricsSettings(cache_ttl_s=1),
                             dashboard=DashboardSettings(api_url="http://collector:8000", token=None))
    for variable, value in worker_environment(handed).items():
        if value is None:
            monkeypatch.delenv(variable, raising=False)
        else:
            monkeypatch.setenv(variable, value)
    assert ServiceSettings() == handed
