"""Service settings: constructor arguments, then GOODPUT_* environment variables, then defaults."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_DATABASE_URL = "sqlite:///goodput.db"


class ServiceSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GOODPUT_", extra="ignore")

    database_url: str = Field(DEFAULT_DATABASE_URL, description=(
        "GOODPUT_DATABASE_URL: SQLAlchemy URL; a SQLite file by default, postgresql://user@host/db in production"))
    host: str = Field("127.0.0.1", description="GOODPUT_HOST: address `goodput serve` listens on")
    port: int = Field(8000, description="GOODPUT_PORT: port `goodput serve` listens on")
    max_body_bytes: int = Field(32 << 20, description="GOODPUT_MAX_BODY_BYTES: request body cap, compressed or not")
    max_events_per_batch: int = Field(20_000, description="GOODPUT_MAX_EVENTS_PER_BATCH: events (records) per batch")
    max_rows_per_batch: int = Field(2_000_000, description="GOODPUT_MAX_ROWS_PER_BATCH: step and collective rows per batch")
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
    writer_max_pending_events: int = Field(4_000_000, description=(
        "GOODPUT_WRITER_MAX_PENDING_EVENTS: rows waiting for the database before ingestion answers 503"))
    auth_cache_ttl_s: float = Field(5.0, ge=0, description=(
        "GOODPUT_AUTH_CACHE_TTL_S: seconds a collector process caches token lookups (a revoked token, or the first "
        "token created, takes effect within this time)"))
    dashboard: bool = Field(True, description="GOODPUT_DASHBOARD: serve the dashboard under /dashboard/")
    warm_analyses_s: float = Field(15.0, ge=0, description=(
        "GOODPUT_WARM_ANALYSES_S: every this many seconds one background thread re-analyses the runs that changed "
        "(those opened on the dashboard first), using at most a quarter of that time, so run pages open on a "
        "stored analysis; 0 turns it off (pages then build an analysis the first time they need it)"))
    hang_floor_s: float = Field(30.0, gt=0, description=(
        "GOODPUT_HANG_FLOOR_S: a running run is hung after max(this, GOODPUT_HANG_STEP_FACTOR x its recent "
        "median step time) without progress"))
    hang_step_factor: float = Field(10.0, gt=0, description="GOODPUT_HANG_STEP_FACTOR: see GOODPUT_HANG_FLOOR_S")
    heartbeat_interval_s: float = Field(5.0, gt=0, description=(
        "GOODPUT_HEARTBEAT_INTERVAL_S: the clients' heartbeat interval; a rank silent for 3 of them is a hang "
        "suspect"))
    # Plausibility limits (docs/events.md, "Plausibility limits"): what one event may claim. Costs follow what the
    # run reported, never what it claimed; these keep the claims themselves (and the GPU-seconds they book) sane.
    max_world_size: int = Field(65_536, ge=1, le=1 << 20, description=(
        "GOODPUT_MAX_WORLD_SIZE: largest world size, rank + 1 and GPU count (allocation_start, run_submitted) an "
        "event may claim; more gets 422. 65,536 is four times the largest published training job (16,384 GPUs) "
        "and below the wire format's ceiling of 1,048,576"))
    max_step_s: float = Field(86_400.0, gt=0, description=(
        "GOODPUT_MAX_STEP_S: longest step or collective (end - start) accepted, in seconds; longer gets 422. One "
        "optimizer step that lasts a day is a broken clock, not a step (a day on 65,536 GPUs is 5.7e9 GPU-s)"))
    max_checkpoint_s: float = Field(86_400.0, gt=0, description=(
        "GOODPUT_MAX_CHECKPOINT_S: longest checkpoint write (checkpoint_end - checkpoint_start of one rank and "
        "step, when both are in one batch) accepted, in seconds; longer gets 422"))
    max_allocation_s: float = Field(90 * 86_400.0, gt=0, description=(
        "GOODPUT_MAX_ALLOCATION_S: longest allocation (allocation_end - allocation_start, when both are in one "
        "batch) accepted, in seconds; longer gets 422. 90 days is beyond any batch scheduler's wall-time limit"))
    max_future_s: float = Field(86_400.0, gt=0, description=(
        "GOODPUT_MAX_FUTURE_S: how far after the collector's clock an event's time (and a step's or collective's "
        "start and end) may lie, in seconds; later gets 422. A day absorbs any clock skew and time zone mistake "
        "of a host whose clock is set at all"))
