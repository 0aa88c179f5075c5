"""GET /v1/runs/{run_id}/curves (both databases): the ranks' stored rows reduced per step as the events say."""

from __future__ import annotations

from typing import Any

import pytest

from tests.analysis.scenarios import T0, ev


def test_the_collector_serves_the_curves_of_its_stored_steps(client: Any) -> None:
    """Two ranks report different losses for each step: the curve is their mean; the lr the step's; the step time
    from the first rank's start to the last rank's end."""
    events: list[dict[str, Any]] = [ev("allocation_start", 0, gpus=2, run_id="c1")]
    events += [ev("attempt_start", 0, run_id="c1", attempt=0, rank=r, world_size=2, host="h0") for r in range(2)]
    for r in range(2):
        starts = [T0 + 10 + i for i in range(20)]
        events.append(ev("steps", 31, run_id="c1", attempt=0, rank=r, step=list(range(1, 21)), start=starts,
                         end=[s + 0.5 + 0.25 * r for s in starts], loss=[3.0 - 0.1 * i + r for i in range(20)],
                         lr=[1e-3] * 20))
    posted = client.post("/v1/events", json={"events": events})
    assert posted.status_code == 200, posted.text
    served = client.get("/v1/runs/c1/curves").json()
    (loss,) = served["loss"]
    assert loss["step"] == list(range(1, 21))
    assert loss["value"] == pytest.approx([3.0 - 0.1 * i + 0.5 for i in range(20)])
    assert served["lr"][0]["value"] == pytest.approx([1e-3] * 20)
    assert served["step_seconds"][0]["value"] == pytest.approx([0.75] * 20)
    assert served["step_seconds"][0]["time"] == pytest.approx([T0 + 10 + i + 0.75 for i in range(20)])
    assert client.get("/v1/runs/nope/curves").status_code == 404


def test_the_curves_include_the_steps_of_the_blocks_the_ranks_have_left(client: Any) -> None:
    """300 steps a rank (three blocks of 128): the first two blocks' rows live in block rows, the third in `steps`;
    a late row of step 5 from rank 1 arrives after its block was moved. Every step is on the curve, reduced over all
    its rows."""
    n = 300
    events: list[dict[str, Any]] = [ev("allocation_start", 0, gpus=2, run_id="c2")]
    events += [ev("attempt_start", 0, run_id="c2", attempt=0, rank=r, world_size=2, host="h0") for r in range(2)]
    starts = [T0 + 10 + i for i in range(n)]
    for r in range(2):
        events.append(ev("steps", 400, run_id="c2", attempt=0, rank=r, step=list(range(1, n + 1)), start=starts,
                         end=[s + 0.5 + 0.25 * r for s in starts], loss=[0.001 * i + r for i in range(n)],
                         lr=[1e-3 * (1 + r)] * n))
    assert client.post("/v1/events", json={"events": events}).status_code == 200
    late = ev("steps", 401, run_id="c2", attempt=0, rank=1, step=[5], start=[T0 + 14], end=[T0 + 16], loss=[7.0],
              lr=[5e-3])
    assert client.post("/v1/events", json={"events": [late]}).status_code == 200
    served = client.get("/v1/runs/c2/curves").json()
    (loss,) = served["loss"]
    assert loss["step"] == list(range(1, n + 1))
    expected = [0.001 * i + 0.5 for i in range(n)]
    expected[4] = (0.004 + 1.004 + 7.0) / 3  # step 5: the two ranks' rows and the late one
    assert loss["value"] == pytest.approx(expected)
    lr = served["lr"][0]["value"]
    assert lr[4] == pytest.approx(5e-3) and lr[:4] == pytest.approx([2e-3] * 4)
    seconds = served["step_seconds"][0]["value"]
    assert seconds[4] == pytest.approx(2.0) and seconds[3] == pytest.approx(0.75) and seconds[-1] == pytest.approx(0.75)
