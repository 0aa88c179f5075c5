"""Every component id of the dashboard, prefixed by its page."""

from __future__ import annotations

# app shell
APP_INTERVAL = "app-interval"
APP_LOCATION = "app-location"

# fleet page
FLEET_STORE = "fleet-store"
FLEET_STATUS_FILTER = "fleet-status-filter"
FLEET_RANGE_FILTER = "fleet-range-filter"
FLEET_RANGE_FROM = "fleet-range-from"  # custom range, UTC
FLEET_RANGE_TO = "fleet-range-to"
FLEET_CUSTOM_RANGE = "fleet-custom-range"
FLEET_RANGE_NOTE = "fleet-range-note"
FLEET_RUN_FILTER = "fleet-run-filter"
FLEET_PROJECT_FILTER = "fleet-project-filter"
FLEET_GROUP = "fleet-group"
FLEET_SORT_STORE = "fleet-sort-store"
FLEET_SORT_BUTTON = "fleet-sort-button"  # pattern-matching type: {"type": ..., "column": sort key}
FLEET_PAGE_STORE = "fleet-page-store"
FLEET_PAGE_SIZE = "fleet-page-size"
FLEET_PAGE_PREV = "fleet-page-prev"
FLEET_PAGE_NEXT = "fleet-page-next"
FLEET_PAGE_INFO = "fleet-page-info"
FLEET_PAGES_STORE = "fleet-pages-store"  # how many pages the table has now
FLEET_URL_SYNC = "fleet-url-sync"  # the clientside callback's output: the filters written into the address
FLEET_PROJECTS = "fleet-projects"
FLEET_PROJECTS_CARD = "fleet-projects-card"
FLEET_TREND_GRAPH = "fleet-trend-graph"
FLEET_COMPARE_FILTER = "fleet-compare-filter"
FLEET_COMPARE = "fleet-compare"
FLEET_COMPARE_TABLE = "fleet-compare-table"
FLEET_COMPARE_GRAPH = "fleet-compare-graph"
FLEET_RUNS_TITLE = "fleet-runs-title"
FLEET_MESSAGE = "fleet-message"
FLEET_KPIS = "fleet-kpis"
FLEET_TABLE_BODY = "fleet-table-body"  # the runs table's rows (its header is drawn once, with the page)
FLEET_RUNS_GRAPH = "fleet-runs-graph"
FLEET_OVER_TIME_GRAPH = "fleet-over-time-graph"
FLEET_CONTENT = "fleet-content"
FLEET_UPDATED = "fleet-updated"

# run page
RUN_ID_STORE = "run-id-store"
RUN_STORE = "run-store"
RUN_VERSION_STORE = "run-version-store"
RUN_DRAWN_STORE = "run-drawn-store"  # version whose timeline is on the page (live patches need it)
RUN_LIVE_STORE = "run-live-store"
RUN_MESSAGE = "run-message"
RUN_CONTENT = "run-content"
RUN_HEADER = "run-header"
RUN_LIVE = "run-live"
RUN_FRESHNESS = "run-freshness"
RUN_RESUME = "run-resume"  # banner: the resume check flagged the run, or could not check a restart
RUN_KPIS = "run-kpis"
RUN_TIMELINE_GRAPH = "run-timeline-graph"
RUN_LEDGER_GRAPH = "run-ledger-graph"
RUN_CURVES_GRAPH = "run-curves-graph"  # loss, learning rate and step time over time
RUN_CURVES_NOTE = "run-curves-note"
RUN_RANKS_GRAPH = "run-ranks-graph"
RUN_HEATMAP_GRAPH = "run-heatmap-graph"
RUN_RANKS_NOTE = "run-ranks-note"
RUN_CHECKPOINT_TABLE = "run-checkpoint-table"
RUN_RESTART_TABLE = "run-restart-table"
RUN_LINKS = "run-links"  # the report (HTML / CSV / JSON) and the advice
RUN_ADVICE = "run-advice"  # the recommendations panel
RUN_UNUSED_GPUS = "run-unused-gpus-note"
RUN_STRAGGLER_TABLE = "run-straggler-table"
RUN_RANK_PICK = "run-rank-pick"  # dropdown: open a rank's drill-down
RUN_RANK_PANEL = "run-rank-panel"  # the drill-down of ?rank=N
RUN_RANK_TIMELINE_GRAPH = "run-rank-timeline-graph"
RUN_RANK_STEPS_GRAPH = "run-rank-steps-graph"
RUN_STEP_ZOOM = "run-step-zoom"  # clientside: the step axis follows the timeline's time zoom


def kpi_value(page: str, name: str) -> str:
    """Id of one KPI card's value, e.g. `run-kpi-goodput`, `run-kpi-waste-hang`, `fleet-kpi-allocated`."""
    return f"{page}-kpi-{name}"
