"""The clock offsets' types: what services.analysis.clocks measures from the events (in the ledger and the run's
views) and what the collector measures from the requests it receives (in the live answer)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class HostClock(BaseModel):
    model_config = ConfigDict(frozen=True)

    host: str
    offset_seconds: float = Field(description="how far the host's clock is ahead of the run's reference clock "
                                  "(negative: behind), measured from its ranks' step ends; its times were taken "
                                  "back by it before painting (docs/ledger.md, 'Clocks')")
    attempt: int = Field(description="the latest attempt that measured it")
    ranks: int = Field(description="its ranks measured in that attempt")
