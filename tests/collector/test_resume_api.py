"""GET /v1/runs/{run_id}/resume-check over SQLite and PostgreSQL: digests stored and compared, cached per version."""

from __future__ import annotations

from typing import Any

from services.simulate import SimConfig, simulate

SIM: dict[str, Any] = {"ranks": 2, "hours": 0.05, "step_s": 1.0, "mtbf_s": 90, "checkpoint_every": 20,
                       "startup_s": 5, "detect_s": 5, "max_failures": 2, "digest_every": 5,
                       "seed": 9}  # resumes from checkpoints 20 and 40


def post(client: Any, events: list[dict[str, Any]]) -> None:
    response = client.post("/v1/events", json={"events": events})
    assert response.status_code == 200, response.text


def test_an_exact_resume_is_ok_and_its_digests_were_compared(client: Any) -> None:
    post(client, simulate(SimConfig(run_id="resume-exact", **SIM)).events)
    check = client.get("/v1/runs/resume-exact/resume-check").json()
    assert check["verdict"] == "ok" and check["findings"] == []
    assert [r["resume_step"] for r in check["resumes"]] == [20, 40]
    assert all(r["compared"]["digest"] > 0 and r["compared"]["loss"] > 0 for r in check["resumes"])
    assert check["config"]["loss_rtol"] == 1e-6


def test_a_digest_mismatch_is_flagged_with_its_evidence(client: Any) -> None:
    post(client, simulate(SimConfig(run_id="resume-bad", resume_fault="digest", **SIM)).events)
    check = client.get("/v1/runs/resume-bad/resume-check").json()
    assert check["verdict"] == "flagged"
    first = check["findings"][0]
    assert (first["code"], first["attempt"], first["ranks"]) == ("digest_mismatch", 1, [0, 1])
    assert first["evidence"]["resume_step"] == 20 and first["evidence"]["tolerance"] == "equal strings"
    row = first["examples"][0]
    assert row["expected_attempt"] == 0 and row["expected"] != row["got"] and len(row["got"]) == 32
    assert check["gpu_seconds_since_first_finding"] > 0


def test_the_check_follows_the_run_version_and_takes_tolerances(client: Any) -> None:
    events = simulate(SimConfig(run_id="resume-grow", resume_fault="lr", **SIM)).events
    half = len(events) // 3
    post(client, events[:half])
    early = client.get("/v1/runs/resume-grow/resume-check").json()
    post(client, events[half:])
    late = client.get("/v1/runs/resume-grow/resume-check").json()
    assert late["version"] > early["version"]
    assert "lr_mismatch" in {f["code"] for f in late["findings"]}
    assert client.get("/v1/runs/resume-grow/resume-check").json() == late  # cached for this version
    lenient = client.get("/v1/runs/resume-grow/resume-check", params={"lr_rtol": 0.9}).json()
    assert lenient["config"]["lr_rtol"] == 0.9 and "lr_mismatch" not in {f["code"] for f in lenient["findings"]}
    assert client.get("/v1/runs/resume-grow/resume-check", params={"loss_rtol": -1}).status_code == 422


def test_an_unknown_run_is_404_and_a_bad_digest_is_rejected_naming_the_field(client: Any) -> None:
    assert client.get("/v1/runs/nope/resume-check").status_code == 404
    bad = {"event_id": "d1", "run_id": "r", "kind": "digest", "time": 1.7e9, "attempt": 0, "rank": 0, "step": 1,
           "value": "x" * 129}
    response = client.post("/v1/events", json={"events": [bad]})
    assert response.status_code == 422
    assert response.json()["error"]["field"] == "value"
    ok = dict(bad, value="abc")
    assert client.post("/v1/events", json={"events": [ok]}).status_code == 200


def test_a_flagged_run_s_report_recommends_fixing_the_resume(client: Any) -> None:
    post(client, simulate(SimConfig(run_id="resume-rep", resume_fault="loss", **SIM)).events)
    check = client.get("/v1/runs/resume-rep/resume-check").json()
    report = client.get("/v1/runs/resume-rep/report", params={"format": "json"}).json()
    (rec,) = [r for r in report["recommendations"] if r["code"] == "resume_correctness"]
    assert "loss_mismatch" in rec["wording"] and check["findings"][0]["message"] in rec["wording"]
    assert rec["at_stake_gpu_seconds"] == check["gpu_seconds_since_first_finding"] > 0
    post(client, simulate(SimConfig(run_id="resume-fine", **SIM)).events)
    fine = client.get("/v1/runs/resume-fine/report", params={"format": "json"}).json()
    assert "resume_correctness" not in {r["code"] for r in fine["recommendations"]}


def killed_after_checkpoint(run_id: str, loaded: str | None) -> list[dict[str, Any]]:
    """One rank: attempt 0 steps 1-50, its digest of step 50, checkpoint 50, killed (its later steps lost);
    attempt 1 resumes from 50 with the digest `loaded` of the state it loaded."""
    t0 = 1.7e9

    def ev(i: int, kind: str, t: float, **fields: Any) -> dict[str, Any]:
        return {"event_id": f"{run_id}-{i}", "run_id": run_id, "kind": kind, "time": t0 + t, "rank": 0, **fields}

    at_load = {} if loaded is None else {"digest": loaded}
    return [
        ev(1, "attempt_start", 0, attempt=0, world_size=1, host="h0"), ev(2, "resume", 0, attempt=0, step=0),
        ev(3, "steps", 51, attempt=0, step=list(range(1, 51)), start=[t0 + s for s in range(1, 51)],
           end=[t0 + s + 0.5 for s in range(1, 51)], loss=[1.0 / s for s in range(1, 51)]),
        ev(4, "digest", 51, attempt=0, step=50, value="saved-50"),
        ev(5, "checkpoint_start", 51, attempt=0, step=50), ev(6, "checkpoint_end", 52, attempt=0, step=50, ok=True),
        ev(7, "attempt_start", 100, attempt=1, world_size=1, host="h0"),
        ev(8, "resume", 101, attempt=1, step=50, checkpoint_step=50, checkpoint="step-50", **at_load),
        ev(9, "steps", 120, attempt=1, step=list(range(51, 61)), start=[t0 + 101 + s for s in range(10)],
           end=[t0 + 101.5 + s for s in range(10)], loss=[1.0 / s for s in range(51, 61)]),
    ]


def test_the_digest_at_load_is_stored_and_compared_and_nothing_compared_is_unverified(client: Any) -> None:
    for run_id, loaded in (("load-same", "saved-50"), ("load-differs", "rng-lost"), ("load-none", None)):
        post(client, killed_after_checkpoint(run_id, loaded))
    same = client.get("/v1/runs/load-same/resume-check").json()
    assert same["verdict"] == "ok" and same["reason"] is None
    assert same["resumes"][0]["compared"]["digest_at_load"] == 1 and same["resumes"][0]["verified"]
    differs = client.get("/v1/runs/load-differs/resume-check").json()
    assert differs["verdict"] == "flagged"
    (finding,) = differs["findings"]
    assert finding["code"] == "digest_mismatch_at_load" and finding["steps"] == [50]
    assert (finding["examples"][0]["expected"], finding["examples"][0]["got"]) == ("saved-50", "rng-lost")
    none = client.get("/v1/runs/load-none/resume-check").json()
    assert none["verdict"] == "unverified" and none["findings"] == []
    assert "no recomputed step and no digest at load arrived" in none["reason"]
    assert none["resumes"][0]["unverified_reason"] == none["reason"] and not none["resumes"][0]["verified"]


def test_an_unverified_run_s_advice_report_and_cli_say_so(client: Any) -> None:
    from services.cli.advice import advice_lines
    from services.schemas.advice import RunAdvice

    post(client, killed_after_checkpoint("load-unchecked", None))
    check = client.get("/v1/runs/load-unchecked/resume-check").json()
    assert check["verdict"] == "unverified"
    advice = client.get("/v1/runs/load-unchecked/advice").json()
    (rec,) = [r for r in advice["recommendations"] if r["code"] == "resume_correctness"]
    assert rec["title"] == "Check each resume as it loads" and check["reason"] in rec["wording"]
    assert rec["at_stake_gpu_seconds"] == check["gpu_seconds_since_first_unverified"] > 0
    report = client.get("/v1/runs/load-unchecked/report", params={"format": "json"}).json()
    (in_report,) = [r for r in report["recommendations"] if r["code"] == "resume_correctness"]
    assert (in_report["title"], in_report["at_stake_gpu_seconds"]) == (rec["title"], rec["at_stake_gpu_seconds"])
    assert check["reason"] in in_report["wording"]
    page = client.get("/v1/runs/load-unchecked/report", params={"format": "html"}).text
    assert "Check each resume as it loads" in page
    printed = " ".join(line.strip() for line in advice_lines(RunAdvice.model_validate(advice), width=80))
    assert "Check each resume as it loads" in printed and "no digest at load arrived" in printed
