"""A run's GPU time by category over wall time, as the ledger carries it (built by services.analysis.usage, which
states how)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from services.schemas.categories import EVAL, PRODUCTIVE, WASTE_KEYS

USAGE_KEYS: tuple[str, ...] = (PRODUCTIVE, EVAL, *WASTE_KEYS)


class Usage(BaseModel):
    """A run's GPU time by category over wall time: piece i spans [start[i], end[i]) and holds
    `gpu_seconds[key][i]` of each key (keys that are zero everywhere are left out)."""

    model_config = ConfigDict(frozen=True)

    start: list[float]
    end: list[float]
    gpu_seconds: dict[str, list[float]] = Field(description="per key of productive, eval and the waste categories")
    bin_s: float | None = Field(None, description="pieces are bins of this width (a long run); null: exact pieces")
