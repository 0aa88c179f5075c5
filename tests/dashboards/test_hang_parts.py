"""The hung flag and the suspect ranks on the run page's banner and the fleet table (pure pieces)."""

from __future__ import annotations

from dashboards import data
from dashboards.components import fleet_parts, run_parts
from services.presentation import CATEGORIES
from tests.dashboards.answers import live_run, run_item


def test_the_run_banner_names_the_suspect_ranks_and_why() -> None:
    live = live_run(hung=True, suspects=[{"rank": 1, "reasons": ["no heartbeat for 41 s"]}])
    assert run_parts.suspects_text(live) == "Suspect rank 1 (no heartbeat for 41 s)."
    many = live_run(hung=True, suspects=[{"rank": r, "reasons": ["behind"]} for r in range(10)])
    assert (run_parts.suspects_text(many) or "").endswith("and 2 more.")
    assert run_parts.suspects_text(live_run(hung=False, suspects=[])) is None


def test_the_fleet_table_shows_the_suspects_of_a_hung_run() -> None:
    run = run_item(run_id="r", status="running", first_time=0.0, last_time=10.0, allocated_gpu_seconds=10.0,
                   productive_gpu_seconds=5.0, goodput=0.5, waste_gpu_seconds=dict.fromkeys(CATEGORIES, 0.0),
                   restarts=0)
    frame = data.runs_frame([run], live=[live_run(run_id="r", seconds_since_progress=95.0, possibly_hung=True,
                                                  at_risk_gpu_seconds=1.0, suspect_ranks=[1, 3])])
    cell = fleet_parts.runs_rows(frame)[0].children[8]
    assert cell.children.children == "⚠ 1 min 35 s ago: possibly hung (suspect ranks 1, 3)"
