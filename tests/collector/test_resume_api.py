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
