"""The services' one configuration, and the only reader of the environment.

Settings come in sections. A section reads each field from one variable, its prefix plus the field's name in
capitals (`LiveSettings.hang_floor_s` is GOODPUT_HANG_FLOOR_S, `MetricsSettings.cache_ttl_s` is
GOODPUT_METRICS_CACHE_TTL_S); every field's description starts with its variable. Precedence: constructor
arguments, then the environment, then the defaults; an empty variable counts as unset. A variable that fails
validation stops the process at start-up with an error that names the variable.

A process loads what it uses: the collector `ServiceSettings()` (every section of the server), the CLI's
client commands `ClientSettings()`, `goodput db` and `goodput token` `ServerSettings()`, a standalone dashboard
`DashboardSettings()`; so a mistake in one section never stops a process that does not read it.

`goodput serve` hands its settings (command-line options included) to uvicorn's worker processes with
`hand_to_worker_processes`. The one variable read elsewhere is prometheus_client's own PROMETHEUS_MULTIPROC_DIR
(services.metrics.instruments).
"""

from __future__ import annotations

import math
import os
from typing import Literal

from pydantic import AliasGenerator, BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class _Section(BaseSettings):
    """Constructor arguments by field name, the environment by variable (each section names its prefix)."""

    model_config = SettingsConfigDict(populate_by_name=True, env_ignore_empty=True, extra="ignore", frozen=True)


def _read_from(prefix: str) -> SettingsConfigDict:
    """A section's fields read from `prefix` + NAME."""
    return SettingsConfigDict(alias_generator=AliasGenerator(validation_alias=lambda name: prefix + name.upper()))


class ServerSettings(_Section):
    """What `goodput serve` runs: its database, address, dashboard and background work."""

    model_config = _read_from("GOODPUT_")

    database_url: str = Field("sqlite:///goodput.db", description=(
        "GOODPUT_DATABASE_URL: SQLAlchemy URL; a SQLite file by default, postgresql://user@host/db in production"))
    host: str = Field("127.0.0.1", description="GOODPUT_HOST: address `goodput serve` listens on")
    port: int = Field(8000, description="GOODPUT_PORT: port `goodput serve` listens on")
    serve_dashboard: bool = Field(True, validation_alias="GOODPUT_DASHBOARD", description=(
        "GOODPUT_DASHBOARD: serve the dashboard under /dashboard/"))
    auth_cache_ttl_s: float = Field(5.0, ge=0, description=(
        "GOODPUT_AUTH_CACHE_TTL_S: seconds a collector process caches token lookups (a revoked token, or the first "
        "token created, takes effect within this time)"))
    warm_analyses_s: float = Field(15.0, ge=0, description=(
        "GOODPUT_WARM_ANALYSES_S: every this many seconds one background thread re-analyses the runs that changed "
        "(those opened on the dashboard first), using at most a quarter of that time, so run pages open on a "
        "stored analysis; 0 turns it off (pages then build an analysis the first time they need it)"))
    analysis_cache_mb: int = Field(1024, ge=0, description=(
        "GOODPUT_ANALYSIS_CACHE_MB: MiB of decoded step-block summaries and runs' control events each collector "
        "process keeps, so that a live run's next analysis reads only what changed; least recently used out "
        "first. A fleet's live runs fill it in proportion to their ranks x steps; 0 keeps none (every analysis "
        "reads its whole run again)"))
    raw_retention_days: float = Field(30.0, description=(
        "GOODPUT_RAW_RETENTION_DAYS: a run's raw rows (steps, collectives, step and heartbeat events) are deleted "
        "once it has received nothing for this many days; its ledger, views, straggler report and resume check "
        "are stored first and kept for good, with what its analysis is built from (step blocks). 0 keeps raw rows "
        "forever"))
    prune_interval_s: float = Field(3600.0, description=(
        "GOODPUT_PRUNE_INTERVAL_S: every this many seconds one collector process creates the coming days' "
        "partitions (PostgreSQL) and prunes raw rows past GOODPUT_RAW_RETENTION_DAYS (as `goodput db prune`); "
        "0 turns the background job off"))
    analyst: Literal["auto", "process", "thread", "elsewhere"] = Field("auto", description=(
        "GOODPUT_ANALYST: where `goodput serve` runs the background analyses and retention: `process`, one "
        "process of their own beside the workers (`goodput analyst`, restarted if it dies), so that building "
        "analyses never holds a worker's interpreter lock while it answers requests (PostgreSQL only); `thread`, "
        "a thread in each worker (one worker at a time runs a round); `auto`, process on PostgreSQL and thread on "
        "SQLite (one writer); `elsewhere`, none here: a `goodput analyst` run apart (a container of its own) keeps "
        "the stored analyses, and what is polled (`/metrics`, the live answers, fleet-wide estimates) serves them "
        "as stored instead of rebuilding them in a collector (what `goodput serve` gives its workers beside its "
        "analyst process); run pages still rebuild the run they show"))
    opentelemetry: bool = Field(False, description=(
        "GOODPUT_OPENTELEMETRY: FastAPI's native OpenTelemetry (spans, metrics, logs to the process's global "
        "providers); off by default: it looks up the providers on every request, about a fifth of a small "
        "ingest request's cost, and the collector's own metrics are on /metrics"))

    @field_validator("raw_retention_days")
    @classmethod
    def _retention_days(cls, days: float) -> float:
        return check_retention_days(days, setting="GOODPUT_RAW_RETENTION_DAYS")

    @field_validator("prune_interval_s")
    @classmethod
    def _prune_interval(cls, seconds: float) -> float:
        return check_prune_interval_s(seconds, setting="GOODPUT_PRUNE_INTERVAL_S")


def check_retention_days(days: float, *, setting: str) -> float:
    """The rule for a raw retention in days, wherever it is set (the variable, `goodput db prune --days`, a caller
    of retention): a finite number >= 0. NaN or infinity would make a cutoff that matches every run or none (a
    NaN sorts above every number in PostgreSQL)."""
    if not (math.isfinite(days) and days >= 0):
        raise ValueError(f"{setting} must be a finite number of days >= 0 (0 keeps raw rows forever), got {days!r}")
    return days


def check_prune_interval_s(seconds: float, *, setting: str) -> float:
    """The rule for the interval of the collector's retention job: a finite number of seconds >= 0."""
    if not (math.isfinite(seconds) and seconds >= 0):
        raise ValueError(f"{setting} must be a finite number of seconds >= 0 (0 turns the collector's retention job "
                         f"off), got {seconds!r}")
    return seconds


class IngestSettings(_Section):
    """What one request to `POST /v1/events` may send, and what the collector holds at once."""

    model_config = _read_from("GOODPUT_")

    max_body_bytes: int = Field(32 << 20, description="GOODPUT_MAX_BODY_BYTES: request body cap, compressed or not")
    max_events_per_batch: int = Field(20_000, description="GOODPUT_MAX_EVENTS_PER_BATCH: events (records) per batch")
    max_rows_per_batch: int = Field(2_000_000, description=(
        "GOODPUT_MAX_ROWS_PER_BATCH: step and collective rows per batch"))
    max_inflight_body_bytes: int = Field(256 << 20, description=(
        "GOODPUT_MAX_INFLIGHT_BODY_BYTES: request body bytes read, inflated and parsed at once across all ingest "
        "requests; beyond it ingestion answers 503 with Retry-After"))
    max_inflight_body_bytes_per_client: int = Field(64 << 20, gt=0, description=(
        "GOODPUT_MAX_INFLIGHT_BODY_BYTES_PER_CLIENT: the share of GOODPUT_MAX_INFLIGHT_BODY_BYTES one client (one "
        "token; without tokens, one address) may hold at once, so that one client's uploads never starve the "
        "others; a client's single request always fits"))
    body_timeout_s: float = Field(30.0, gt=0, description=(
        "GOODPUT_BODY_TIMEOUT_S: seconds a client has to send a request's whole body once the request has started; "
        "a slower upload gets 408 and frees what it held (the client resends it)"))
    # Parsed rows take 40-460 bytes each (big records to one-rank records of 3 steps): 500k rows stay under ~230 MB
    # per process. 4M let an overloaded collector hold GBs and minutes of backlog that its clients' spools keep
    # safer (benchmarks.load at 10,240 ranks on a busy machine: 4 GiB per worker).
    writer_max_pending_events: int = Field(500_000, description=(
        "GOODPUT_WRITER_MAX_PENDING_EVENTS: rows (and records) parsed and waiting for the database, per process, "
        "before ingestion answers 503 with Retry-After (the clients keep them in their spools meanwhile), "
        "whatever GOODPUT_WRITER_MAX_QUEUE_S allows"))
    writer_max_queue_s: float = Field(1.0, gt=0, le=600, description=(
        "GOODPUT_WRITER_MAX_QUEUE_S: seconds of writing (at the pace the writer is measured to write) that the rows "
        "waiting for the database may hold, per process, before ingestion answers 503 with Retry-After. Keep it "
        "well below the clients' GOODPUT_HTTP_TIMEOUT_S (2 s): an answer later than that is sent again, and an "
        "overloaded collector then writes everything twice"))
    writer_linger_s: float = Field(0.05, ge=0, le=1, description=(
        "GOODPUT_WRITER_LINGER_S: while several senders post, how long after a small group's first batch arrived "
        "the writer waits for more to write in the same transaction (ending sooner when they stop coming). A "
        "transaction's fixed cost is then shared by more requests (benchmarks.load); each answer comes up to this "
        "much later. While the senders are paced (Goodput-Send-Interval) it waits up to 4 % of the pace if that is "
        "longer, at most 0.25 s. 0: never wait"))
    target_requests_per_s: float = Field(400.0, gt=0, description=(
        "GOODPUT_TARGET_REQUESTS_PER_S: ingest requests per second one collector process aims to receive. Every "
        "answer asks each sender to wait senders-seen-in-the-last-10-s / this between posts "
        "(Goodput-Send-Interval), so a big fleet sends fewer, fuller batches instead of queueing"))
    max_send_interval_s: float = Field(5.0, ge=0, le=60, description=(
        "GOODPUT_MAX_SEND_INTERVAL_S: the longest interval between posts the collector asks for: what it costs in "
        "freshness (a live figure lags its events by up to this). Keep it below 3 heartbeats "
        "(GOODPUT_HEARTBEAT_INTERVAL_S), after which a silent rank is a hang suspect"))


class PlausibilitySettings(_Section):
    """What one event may claim (docs/events.md, "Plausibility limits"). Costs follow what the run reported,
    never what it claimed; these keep the claims themselves (and the GPU-seconds they book) sane."""

    model_config = _read_from("GOODPUT_")

    max_world_size: int = Field(65_536, ge=1, le=1 << 20, description=(
        "GOODPUT_MAX_WORLD_SIZE: largest world size, rank + 1 and GPU count (allocation_start, run_submitted) an "
        "event may claim; more gets 422. 65,536 is four times the largest published training job (16,384 GPUs) "
        "and below the wire format's ceiling of 1,048,576"))
    max_step_s: float = Field(86_400.0, gt=0, description=(
        "GOODPUT_MAX_STEP_S: longest step or collective (end - start) accepted, in seconds; longer gets 422. One "
        "optimizer step that lasts a day is a broken clock, not a step (a day on 65,536 GPUs is 5.7e9 GPU-s)"))
    max_future_s: float = Field(86_400.0, gt=0, description=(
        "GOODPUT_MAX_FUTURE_S: how far after the collector's clock an event's time (and a step's or collective's "
        "start and end) may lie, in seconds; later gets 422. A day absorbs any clock skew and time zone mistake "
        "of a host whose clock is set at all"))


class LiveSettings(_Section):
    """Live hang detection (docs/ledger.md, "Live hang detection")."""

    model_config = _read_from("GOODPUT_")

    hang_floor_s: float = Field(30.0, gt=0, description=(
        "GOODPUT_HANG_FLOOR_S: a running run is hung after max(this, GOODPUT_HANG_STEP_FACTOR x its recent "
        "median step time) without progress"))
    hang_step_factor: float = Field(10.0, gt=0, description="GOODPUT_HANG_STEP_FACTOR: see GOODPUT_HANG_FLOOR_S")
    hang_startup_floor_s: float = Field(300.0, ge=0, description=(
        "GOODPUT_HANG_STARTUP_FLOOR_S: before an attempt's first step (loading, waiting for peers in "
        "init_process_group), and while a checkpoint write or an evaluation is in progress, a run is hung only "
        "after at least this long without progress"))
    heartbeat_interval_s: float = Field(5.0, gt=0, description=(
        "GOODPUT_HEARTBEAT_INTERVAL_S: the clients' heartbeat interval; a rank silent for 3 of them is a hang "
        "suspect"))


class MetricsSettings(_Section):
    """`GET /metrics`: how often the run series are read and which runs get their own."""

    model_config = _read_from("GOODPUT_METRICS_")

    cache_ttl_s: float = Field(10.0, ge=0, le=3600, description=(
        "GOODPUT_METRICS_CACHE_TTL_S: seconds a process keeps the run metrics it read from the database before "
        "reading them again; a scrape every 15 s therefore costs one snapshot per scrape at most, and nothing "
        "between scrapes"))
    run_window_h: float = Field(24.0, gt=0, description=(
        "GOODPUT_METRICS_RUN_WINDOW_H: a run gets its own run_id series while it is running or had an event in "
        "the last this-many hours"))
    max_runs: int = Field(200, ge=0, le=10_000, description=(
        "GOODPUT_METRICS_MAX_RUNS: at most this many runs get a run_id label, running runs first, then the most "
        "recently active; the rest still count in the goodput_fleet_* series"))
    refresh_budget_s: float = Field(3.0, ge=0, description=(
        "GOODPUT_METRICS_REFRESH_BUDGET_S: seconds a snapshot may spend recomputing ledgers whose run received "
        "events since they were stored; past the budget it serves the previous stored ledger of the run, so a "
        "scrape never runs the analysis of every busy run at once (the next snapshot continues where this one "
        "stopped). 0 beside an analyst unless set (GOODPUT_ANALYST=elsewhere, what `goodput serve` on PostgreSQL "
        "gives its workers beside its analyst process): the analyst keeps the stored ledgers, and a scrape serves "
        "them"))


class DashboardSettings(_Section):
    """The dashboard, embedded in the collector or standalone (`python -m dashboards`, dashboards.wsgi)."""

    model_config = _read_from("GOODPUT_DASHBOARD_")

    api_url: str | None = Field(None, description=(
        "GOODPUT_DASHBOARD_API_URL: the collector's base URL. Unset in the embedded mode: the dashboard then calls "
        "the server that received the browser's request (its local address)"))
    refresh_s: float = Field(5.0, ge=1, description=(
        "GOODPUT_DASHBOARD_REFRESH_S: seconds between automatic refreshes of a page (`--refresh` of a standalone "
        "dashboard)"))
    timeout_s: float = Field(60.0, gt=0, description=(
        "GOODPUT_DASHBOARD_TIMEOUT_S: seconds the dashboard waits for one API answer"))
    token: str | None = Field(None, repr=False, description=(
        "GOODPUT_DASHBOARD_TOKEN: read token (gpr_...) the dashboard sends to the collector for a browser on the "
        "dashboard's own host that sent none (standalone mode; dashboards.access). Every other browser signs in "
        "(HTTP Basic, the token as password) and its credential is forwarded instead, so each user sees only "
        "their token's project"))


class ClientSettings(_Section):
    """The CLI's commands that call a collector (`goodput runs`, `ledger`, `report`, `advise`, `simulate`).
    GOODPUT_URL and GOODPUT_TOKEN are the training client's variables too (ingest_client.common.config reads them
    itself: it runs where only the standard library is)."""

    model_config = _read_from("GOODPUT_")

    url: str = Field("http://127.0.0.1:8000", description="GOODPUT_URL: the collector's base URL (`--url`)")
    token: str | None = Field(None, repr=False, description=(
        "GOODPUT_TOKEN: write token `goodput simulate` sends (`--token`)"))
    token_file: str | None = Field(None, description=(
        "GOODPUT_TOKEN_FILE: a file whose first line is that write token, instead of GOODPUT_TOKEN (`--token-file`)"))
    read_token: str | None = Field(None, repr=False, description=(
        "GOODPUT_READ_TOKEN: read token the CLI's read commands send"))


class ServiceSettings(BaseModel):
    """Every section of the collector; a section not given is read from the environment."""

    model_config = ConfigDict(frozen=True)

    server: ServerSettings = Field(default_factory=ServerSettings)
    ingest: IngestSettings = Field(default_factory=IngestSettings)
    plausibility: PlausibilitySettings = Field(default_factory=PlausibilitySettings)
    live: LiveSettings = Field(default_factory=LiveSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    dashboard: DashboardSettings = Field(default_factory=DashboardSettings)


def beside_an_analyst(settings: ServiceSettings) -> ServiceSettings:
    """The settings of a collector process whose stored analyses another process keeps (GOODPUT_ANALYST=elsewhere):
    it runs no background job, and a `/metrics` scrape serves the stored ledgers (rebuilt each round a run changed)
    instead of rebuilding the busy runs' within its budget, the analyst's work done again in a collector (up to 3 s
    of a scrape's CPU, the requests behind it waiting), unless GOODPUT_METRICS_REFRESH_BUDGET_S is set."""
    metrics = settings.metrics
    if "refresh_budget_s" not in metrics.model_fields_set:  # (set: read from the environment, as the user gave it)
        metrics = metrics.model_copy(update={"refresh_budget_s": 0.0})
    return settings.model_copy(update={
        "server": settings.server.model_copy(update={"analyst": "elsewhere", "warm_analyses_s": 0.0,
                                                     "prune_interval_s": 0.0}),
        "metrics": metrics})


def worker_environment(settings: ServiceSettings) -> dict[str, str | None]:
    """Every setting as the variable that sets it (None: unset), so that `ServiceSettings()` read from it
    equals `settings`."""
    variables: dict[str, str | None] = {}
    for name in ServiceSettings.model_fields:
        section: _Section = getattr(settings, name)
        for field, info in type(section).model_fields.items():
            value = getattr(section, field)
            assert isinstance(info.validation_alias, str)  # set on every field by _read_from
            variables[info.validation_alias] = (None if value is None else
                                                str(value).lower() if isinstance(value, bool) else str(value))
    return variables


def hand_to_worker_processes(settings: ServiceSettings) -> None:
    """Make `settings` what every uvicorn worker of `goodput serve` reads. uvicorn builds the app in each worker
    by calling `create_app()` without arguments, so the environment the workers inherit is the only way in."""
    for variable, value in worker_environment(settings).items():
        if value is None:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = value
