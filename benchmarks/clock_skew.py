"""Clocks that disagree (issues 30.5 and 31.5): the ledger and live figures of simulated runs whose hosts' clocks are
off, next to the truth the simulator booked on the true clock.

    python -m benchmarks.clock_skew

Printed: productive over the truth for 16 ranks on two hosts (1 s synchronous steps, a 1 s checkpoint every 20
steps) with host node001's clock off by -300 s to +300 s; the ledger of one host 15 min ahead (a 600 s hang and a
restart), 20 h ahead (a 10-step run of 2 ranks, without allocation events) and reset to 2000-01-02 (a 2-minute run
of 4 ranks, without allocation events); and, through a collector (SQLite, in process), the live answers of a
running run 2 h behind the collector, one dated 2001, and a stalled one with a rank 1 h ahead. The simulator's
`clock_offsets` is this branch's: to see the figures before the change, run it on the older analysis with this
simulator (services/simulate/model.py) copied in.
"""

from __future__ import annotations

import datetime
import tempfile
import time
from typing import Any

from services.analysis.ledger import build_ledger
from services.analysis.run_data import run_data_from_events
from services.schemas.ledger import Ledger
from services.simulate import START_TIME, SimConfig, SimResult, simulate

YEAR_2000_JAN_2 = datetime.datetime(2000, 1, 2, tzinfo=datetime.UTC).timestamp()


def ledger_of(sim: SimResult, *, allocation_events: bool = True) -> Ledger:
    events = [e for e in sim.events if allocation_events or not e["kind"].startswith(("allocation_", "run_sub"))]
    return build_ledger(run_data_from_events(sim.config.run_id, events))


def two_hosts() -> None:
    print("16 ranks on two hosts, host node001's clock off: productive / truth - 1")
    for offset in (-300.0, -30.0, -5.0, 5.0, 60.0, 300.0):
        sim = simulate(SimConfig(run_id="skewed", ranks=16, hours=0.1, step_s=0.95, comm_s=0.05, mtbf_s=None,
                                 checkpoint_every=20, checkpoint_s=1.0, startup_s=20.0, seed=1,
                                 clock_offsets={"node001": offset}))
        ledger = ledger_of(sim)
        print(f"  {offset:+7.0f} s: {ledger.productive_gpu_seconds / sim.truth.productive - 1:+.2%}")


def absurd_hosts() -> None:
    one = {"ranks_per_host": 1, "step_s": 1.0, "mtbf_s": None}
    sim = simulate(SimConfig(run_id="hidden", ranks=4, hours=200 / 3600, startup_s=10.0, checkpoint_every=50,
                             checkpoint_s=2.0, hang_at_step=120, hang_s=600.0, seed=4,
                             clock_offsets={"node002": 900.0}, **one))  # type: ignore[arg-type]
    ledger = ledger_of(sim)
    print(f"a host 15 min ahead: goodput {ledger.goodput:.3f} (truth {sim.truth.productive / sim.truth.allocated:.3f}),"
          f" hang {ledger.waste_gpu_seconds.hang:,.0f} GPU-s (truth {sim.truth.waste['hang']:,.0f}), rework "
          f"{ledger.waste_gpu_seconds.rework:,.1f} (truth {sim.truth.waste['rework']:,.1f})")
    sim = simulate(SimConfig(run_id="ahead", ranks=2, hours=10 / 3600, comm_s=0.0, startup_s=5.0,
                             checkpoint_every=100, seed=6, clock_offsets={"node001": 20 * 3600.0}, **one))  # type: ignore[arg-type]
    ledger = ledger_of(sim, allocation_events=False)
    print(f"a host 20 h ahead, 10 steps of 2 ranks: productive {ledger.productive_gpu_seconds:,.0f} GPU-s "
          f"(truth {sim.truth.productive:,.0f})")
    config: dict[str, Any] = dict(run_id="reset", ranks=4, hours=100 / 3600, startup_s=10.0, checkpoint_every=50,
                                  checkpoint_s=2.0, seed=3, **one)
    reset = ledger_of(simulate(SimConfig(**config, clock_offsets={"node003": YEAR_2000_JAN_2 - START_TIME})),
                      allocation_events=False)
    true = ledger_of(simulate(SimConfig(**config)), allocation_events=False)
    print(f"a host reset to 2000-01-02, a 2-minute run: allocated {reset.allocated_gpu_seconds:,.4g} GPU-s (true "
          f"clocks {true.allocated_gpu_seconds:,.0f}), goodput {reset.goodput:.4f} (true {true.goodput:.4f})")


def live() -> None:
    from fastapi.testclient import TestClient

    from services.collector.app import create_app
    from services.settings import ServerSettings, ServiceSettings
    from services.storage.db import make_engine
    from services.storage.migrate import upgrade

    url = f"sqlite:///{tempfile.mkdtemp()}/clock_skew.db"
    engine = make_engine(url)
    upgrade(engine)
    settings = ServiceSettings(server=ServerSettings(database_url=url, serve_dashboard=False, warm_analyses_s=0))
    with TestClient(create_app(settings, engine=engine)) as client:
        behind = -7200.0
        _post(client, _running("behind", stopped_ago_s=1.0, clock_offset_s=behind), behind)
        answer, waste = client.get("/v1/runs/behind/live").json(), client.get("/v1/runs/behind/waste").json()
        print(f"a running run 2 h behind the collector (its requests say so): hung {answer['hung']}, "
              f"seconds_since_progress {answer['seconds_since_progress']:.0f}, provisional hang "
              f"{(waste['provisional'] or {}).get('hang_gpu_seconds')}")
        in_2001 = datetime.datetime(2001, 6, 1, tzinfo=datetime.UTC).timestamp() - time.time()
        _post(client, _running("in-2001", stopped_ago_s=1.0, clock_offset_s=in_2001), in_2001)
        waste = client.get("/v1/runs/in-2001/waste").json()
        hang = next(line for line in client.get("/metrics").text.splitlines()
                    if line.startswith('goodput_fleet_waste_gpu_seconds{category="hang"'))
        print(f"a running run dated 2001: provisional hang {(waste['provisional'] or {}).get('hang_gpu_seconds')}, "
              f"fleet: {hang}")
        ahead = {"node003": 3600.0}
        events = _running("ahead", stopped_ago_s=60.0, ranks_per_host=1, clock_offsets=ahead)
        now = time.time()
        beats = [{"event_id": f"ahead:beat{r}", "run_id": "ahead", "kind": "heartbeat", "attempt": 0, "rank": r,
                  "time": now + ahead.get(f"node{r:03d}", 0.0) - 0.2} for r in range(4)]
        _post(client, events + beats, None)
        answer = client.get("/v1/runs/ahead/live").json()
        print(f"a run stalled 60 s with a rank 1 h ahead (no Goodput-Sent-At): hung {answer['hung']}, "
              f"seconds_since_progress {answer['seconds_since_progress']:.0f}")


def _running(run_id: str, *, stopped_ago_s: float, clock_offset_s: float = 0.0,
             **overrides: Any) -> list[dict[str, Any]]:
    config = {"run_id": run_id, "ranks": 4, "hours": 0.05, "step_s": 4.0, "mtbf_s": None, "end": "running",
              "seed": 1, "checkpoint_every": 20, **overrides}
    probe = simulate(SimConfig(**{**config, "clock_offsets": {}}))
    last = max(max(e["end"]) for e in probe.events if e["kind"] == "steps")
    return simulate(SimConfig(**config, start_time=START_TIME + time.time() - stopped_ago_s - last
                              + clock_offset_s)).events


def _post(client: Any, events: list[dict[str, Any]], clock_offset_s: float | None) -> None:
    for i in range(0, len(events), 500):
        headers = {"Goodput-Sent-At": f"{time.time() + clock_offset_s:.6f}"} if clock_offset_s is not None else {}
        response = client.post("/v1/events", json={"events": events[i:i + 500]}, headers=headers)
        assert response.status_code == 200, response.text


def main() -> None:
    two_hosts()
    absurd_hosts()
    live()


if __name__ == "__main__":
    main()
