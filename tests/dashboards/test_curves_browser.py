"""The run page's training curves in headless Chromium: loss, learning rate and step time drawn with exactly the points
GET /v1/runs/{id}/curves serves (each metric within its bound of 2,000, one break per restart), one restart marker per
restart and one checkpoint marker per completed checkpoint."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest

from tests.dashboards.conftest import SCREENSHOTS, Page, Server, simulate, start_server, stop_server

pytestmark = pytest.mark.browser

RUN = "llama-curves"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_server(tmp_path_factory.mktemp("curves"))
    try:  # long enough that the loss has more steps than a curve keeps; failures, so restarts
        simulate(server.url, RUN, "--ranks", "8", "--hours", "1.5", "--mtbf", "900", "--end", "finished",
                 "--seed", "3")
        yield server
    finally:
        stop_server(server)


def test_the_curves_show_the_served_points_with_a_marker_per_restart_and_checkpoint(server: Server, tab: Page) -> None:
    curves = server.get(f"/v1/runs/{quote(RUN, safe='')}/curves")
    assert curves["restarts"] and curves["checkpoints"]
    assert curves["downsampled"], "the run must be long enough to be cut to the bound"
    tab.page.goto(f"{server.dashboard}runs/{quote(RUN, safe='')}")
    tab.page.wait_for_function(
        "() => { const g = document.querySelector('#run-curves-graph .js-plotly-plot');"
        " return g && g.data && g.data.some(t => t.name === 'Loss'); }", timeout=60_000)
    drawn: dict[str, Any] = tab.page.evaluate(
        "() => Object.fromEntries(document.querySelector('#run-curves-graph .js-plotly-plot').data"
        ".map(t => [t.name, {points: t.y.filter(v => v !== null).length,"
        " breaks: t.y.filter(v => v === null).length}]))")
    for name, key in (("Loss", "loss"), ("Learning rate", "lr"), ("Step time", "step_seconds")):
        served = curves[key]
        points = sum(len(s["value"]) for s in served)
        assert 0 < points <= 2000
        assert drawn[name] == {"points": points, "breaks": len(served) - 1}, name
    assert drawn["Restart"]["points"] == len(curves["restarts"])
    assert drawn["Checkpoint"]["points"] == len(curves["checkpoints"])
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    tab.page.locator("#run-curves-graph").screenshot(path=str(SCREENSHOTS / "run-curves.png"))
    assert not tab.errors, tab.errors
