"""Dashboard settings: argument, then GOODPUT_DASHBOARD_* environment variable, then default.

GOODPUT_DASHBOARD_API_URL      the collector's base URL. Unset in the embedded mode: the dashboard then calls
                               the server that received the browser's request (its local address).
GOODPUT_DASHBOARD_REFRESH_S    seconds between automatic refreshes of a page (default 5, at least 1).
GOODPUT_DASHBOARD_TIMEOUT_S    seconds the dashboard waits for one API answer (default 60).
GOODPUT_DASHBOARD_TOKEN        read token (gpr_...) the dashboard sends to the collector for a browser on the
                               dashboard's own host that sent none (standalone mode; dashboards.access). Every
                               other browser signs in (HTTP Basic, the token as password) and its credential
                               is forwarded instead, so each user sees only their token's project.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True, kw_only=True)
class DashboardConfig:
    api_url: str | None = None
    refresh_s: float = 5.0
    timeout_s: float = 60.0
    token: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.refresh_s < 1:
            raise ValueError(f"refresh_s must be at least 1 second, got {self.refresh_s} "
                             "(set by --refresh or GOODPUT_DASHBOARD_REFRESH_S)")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s} (GOODPUT_DASHBOARD_TIMEOUT_S)")

    @classmethod
    def from_env(cls, *, api_url: str | None = None, refresh_s: float | None = None) -> DashboardConfig:
        env = os.environ
        return cls(
            api_url=(api_url or env.get("GOODPUT_DASHBOARD_API_URL") or None),
            refresh_s=refresh_s if refresh_s is not None else float(env.get("GOODPUT_DASHBOARD_REFRESH_S", "5")),
            timeout_s=float(env.get("GOODPUT_DASHBOARD_TIMEOUT_S", "60")),
            token=env.get("GOODPUT_DASHBOARD_TOKEN") or None,
        )
