"""services.analysis.resume_check: steps computed twice are compared, and the step numbering checked."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from services.analysis.resume_check import ResumeCheckConfig, build_resume_check
from services.analysis.run_data import EVENT_COLUMNS, run_data_from_events
from services.schemas.resume import ResumeCheck
from services.simulate import RESUME_FAULTS, SimConfig, simulate
from tests.analysis.scenarios import ev, per_rank


def check(events: list[dict[str, Any]], run_id: str = "s1", **config: Any) -> ResumeCheck:
    return build_resume_check(run_data_from_events(run_id, events), config=ResumeCheckConfig(**config), version=1)


def codes(result: ResumeCheck) -> list[tuple[str, int]]:
    return [(f.code, f.attempt) for f in result.findings]


def loss_at(step: int) -> float:
    return 2.0 * math.exp(-step / 50.0) + 0.01 * math.sin(step)


def steps(attempt: int, first: int, last: int, t0: float, world: int = 2, loss: Any = loss_at,
          lr: float = 1e-3, numbers: list[int] | None = None) -> list[dict[str, Any]]:
    """Compact step records (one per rank) with a loss and lr per step; `numbers` overrides the step numbers."""
    numbers = numbers or list(range(first, last + 1))
    starts = [t0 + i for i in range(len(numbers))]
    return [ev("steps", t0 + len(numbers), attempt=attempt, rank=r, step=numbers, start=[1.7e9 + s for s in starts],
               end=[1.7e9 + s + 1 for s in starts], loss=[loss(s) for s in numbers], lr=[lr] * len(numbers))
            for r in range(world)]


def attempt_events(attempt: int, resume: int, t: float, world: int = 2) -> list[dict[str, Any]]:
    return ([ev("attempt_start", t, attempt=attempt, rank=r, world_size=world, host="h0") for r in range(world)]
            + per_rank("resume", t, world, attempt=attempt, step=resume))


def checkpoint(attempt: int, step: int, t: float, ok: bool | None = True) -> list[dict[str, Any]]:
    out = [ev("checkpoint_start", t, attempt=attempt, rank=0, step=step)]
    if ok is not None:
        out.append(ev("checkpoint_end", t + 1, attempt=attempt, rank=0, step=step, ok=ok))
    return out


def failed(attempt: int, t: float, world: int = 2) -> list[dict[str, Any]]:
    return per_rank("attempt_end", t, world, attempt=attempt, reason="failed")


def one_restart(*, resume: int = 20, killed_at: int = 25, after_loss: Any = loss_at, after_lr: float = 1e-3,
                after_numbers: list[int] | None = None, checkpoint_ok: bool | None = True) -> list[dict[str, Any]]:
    """Attempt 0: steps 1..killed_at, checkpoints at 10 and 20; attempt 1 resumes from `resume` to step 40."""
    out = attempt_events(0, 0, 0) + steps(0, 1, killed_at, 1) + checkpoint(0, 10, 10.5)
    out += checkpoint(0, 20, 20.5, ok=checkpoint_ok) + failed(0, 100)
    out += attempt_events(1, resume, 110) + steps(1, resume + 1, 40, 120, loss=after_loss, lr=after_lr,
                                                  numbers=after_numbers)
    return out


# -- the simulator: exact resumes are not flagged, each fault is ----------------------------------------------


SIM: dict[str, Any] = {"ranks": 2, "hours": 0.05, "step_s": 1.0, "mtbf_s": 90, "checkpoint_every": 20,
                       "startup_s": 5, "detect_s": 5, "max_failures": 2, "digest_every": 5}


@pytest.mark.parametrize("seed", range(8))
def test_an_exact_resume_of_a_simulated_run_is_not_flagged(seed: int) -> None:
    result = simulate(SimConfig(run_id="sim", seed=seed, **SIM))
    rc = build_resume_check(run_data_from_events("sim", result.events), version=1)
    assert rc.verdict == "ok" and rc.findings == [], rc.findings
    assert len(rc.resumes) == result.truth.restarts
    assert [r.resume_step for r in rc.resumes] == result.truth.resume_steps[1:]
    assert rc.gpu_seconds_since_first_finding == 0.0


@pytest.mark.parametrize(("fault", "code"), [
    ("loss", "loss_mismatch"), ("lr", "lr_mismatch"), ("digest", "digest_mismatch"),
    ("resume_step", "resume_not_a_checkpoint"), ("skip", "skipped_steps"), ("repeat", "repeated_steps"),
])
def test_each_simulated_resume_fault_is_flagged_with_its_finding(fault: str, code: str) -> None:
    assert fault in RESUME_FAULTS
    result = simulate(SimConfig(run_id="sim", seed=9, resume_fault=fault, **SIM))
    assert result.truth.resume_steps == [0, 20, 40], "seed 9 resumes from checkpoints 20 and 40"
    rc = build_resume_check(run_data_from_events("sim", result.events), version=1)
    assert rc.verdict == "flagged"
    found = [f for f in rc.findings if f.code == code]
    assert [f.attempt for f in found] == [1, 2], codes(rc)
    assert found[0].ranks == [0, 1] and found[0].examples and found[0].message
    assert rc.gpu_seconds_since_first_finding > 0
    json.loads(rc.model_dump_json())  # the API serves it as is


def test_recomputed_values_are_compared_with_the_attempt_that_wrote_the_checkpoint() -> None:
    result = simulate(SimConfig(run_id="sim", seed=9, resume_fault="loss", **SIM))
    rc = build_resume_check(run_data_from_events("sim", result.events), version=1)
    first, second = rc.resumes
    assert (first.resume_step, first.checkpoint_attempt, first.reference_attempts) == (20, 0, [0])
    assert (second.resume_step, second.checkpoint_attempt, second.reference_attempts) == (40, 1, [1])
    mismatch = rc.findings[1]
    assert mismatch.code == "loss_mismatch" and mismatch.attempt == 2
    row = mismatch.examples[0]
    assert row.expected_attempt == 1 and isinstance(row.expected, float)
    assert row.got == pytest.approx(row.expected + 0.5)


# -- hand-built runs ------------------------------------------------------------------------------------------


def test_an_exact_resume_compares_every_recomputed_step_and_is_ok() -> None:
    rc = check(one_restart())
    assert rc.verdict == "ok" and not rc.findings and not rc.notes
    (resume,) = rc.resumes
    assert resume.recomputed_steps == 5 and resume.compared == {"loss": 10, "lr": 10, "digest": 0,
                                                                "digest_at_load": 0}
    assert resume.checkpoint_attempt == 0 and resume.ok and resume.verified and rc.reason is None


def test_a_loss_that_differs_beyond_the_tolerance_is_flagged_with_expected_and_got() -> None:
    rc = check(one_restart(after_loss=lambda s: loss_at(s) * (1 + 1e-4)))
    (finding,) = rc.findings
    assert finding.code == "loss_mismatch" and finding.attempt == 1
    assert finding.steps == [21, 22, 23, 24, 25] and finding.ranks == [0, 1]
    assert finding.evidence["compared"] == 10 and finding.evidence["mismatched"] == 10
    assert finding.evidence["max_relative_difference"] == pytest.approx(1e-4)
    row = finding.examples[0]
    assert (row.rank, row.step, row.expected_attempt) == (0, 21, 0)
    assert row.expected == loss_at(21) and row.got == pytest.approx(loss_at(21) * (1 + 1e-4))


def test_float_noise_within_the_tolerance_is_not_flagged_and_the_tolerance_is_configurable() -> None:
    assert check(one_restart(after_loss=lambda s: loss_at(s) * (1 + 1e-8))).verdict == "ok"
    noisy = one_restart(after_loss=lambda s: loss_at(s) * (1 + 1e-4))
    assert check(noisy, loss_rtol=1e-3).verdict == "ok"


def test_a_learning_rate_that_differs_is_flagged() -> None:
    rc = check(one_restart(after_lr=2e-3))
    assert codes(rc) == [("lr_mismatch", 1)]
    assert rc.findings[0].examples[0].expected == 1e-3 and rc.findings[0].examples[0].got == 2e-3


def test_digests_are_compared_as_strings() -> None:
    events = one_restart()
    events += [ev("digest", 21, attempt=0, rank=r, step=25, value="aaaa") for r in range(2)]
    events += [ev("digest", 130, attempt=1, rank=0, step=25, value="aaaa"),
               ev("digest", 130, attempt=1, rank=1, step=25, value="bbbb")]
    rc = check(events)
    (finding,) = rc.findings
    assert finding.code == "digest_mismatch" and finding.ranks == [1] and finding.steps == [25]
    assert (finding.examples[0].expected, finding.examples[0].got) == ("aaaa", "bbbb")
    assert rc.resumes[0].compared["digest"] == 2


def test_a_resume_from_a_step_that_is_no_checkpoint_is_flagged() -> None:
    rc = check(one_restart(resume=15))
    finding = next(f for f in rc.findings if f.code == "resume_not_a_checkpoint")
    assert finding.attempt == 1 and finding.steps == [15] and finding.ranks == [0, 1]
    assert finding.evidence["checkpoints_completed"] == [10, 20] and finding.evidence["latest_checkpoint"] == 20
    assert "no checkpoint was taken" in finding.message


def test_a_resume_from_a_torn_checkpoint_is_flagged() -> None:
    rc = check(one_restart(checkpoint_ok=None))
    (finding,) = [f for f in rc.findings if f.code == "resume_not_a_checkpoint"]
    assert "torn" in finding.message and finding.evidence["checkpoints_completed"] == [10]


def test_skipped_and_repeated_step_numbers_are_flagged_per_attempt_and_rank() -> None:
    skipped = check(one_restart(after_numbers=[21, 22, 24, 25, 26]))
    finding = next(f for f in skipped.findings if f.code == "skipped_steps")
    assert finding.steps == [23] and finding.ranks == [0, 1] and finding.examples[0].got == 24
    repeated = check(one_restart(after_numbers=[21, 22, 22, 23, 24]))
    finding = next(f for f in repeated.findings if f.code == "repeated_steps")
    assert finding.steps == [22] and finding.examples[0].got == 2
    late = check(one_restart(after_numbers=[23, 24, 25, 26]))
    finding = next(f for f in late.findings if f.code == "skipped_steps")
    assert finding.steps == [21, 22] and "step 21 was due" in finding.message
    early = check(one_restart(after_numbers=[20, 21, 22]))
    assert "repeated_steps" in {f.code for f in early.findings}


def test_a_replayed_report_is_not_a_repeated_step() -> None:
    events = one_restart()
    replay = [dict(e, event_id=e["event_id"] + "-replay") for e in events if e["kind"] == "steps"]
    assert check(events + replay).verdict == "ok"


def test_a_loss_jump_at_a_resume_without_recomputed_steps_is_flagged() -> None:
    # killed right after checkpoint 20: nothing to recompute, so only the loss curve can tell
    jump = check(one_restart(killed_at=20, after_loss=lambda s: loss_at(s) + 0.5))
    (finding,) = jump.findings
    assert finding.code == "loss_jump_at_resume" and finding.attempt == 1 and finding.ranks == [0, 1]
    assert finding.evidence["jump"] == pytest.approx(0.5, abs=0.1)  # the jump less the curve's own descent
    assert finding.evidence["jump"] > 5 * finding.evidence["median_change"]  # type: ignore[operator]
    smooth = check(one_restart(killed_at=20))
    assert smooth.verdict == "unverified" and smooth.findings == []  # no jump is no evidence of an exact resume
    assert smooth.reason == smooth.resumes[0].unverified_reason
    assert smooth.reason is not None and "no recomputed step and no digest at load arrived" in smooth.reason


def test_a_fresh_restart_before_any_checkpoint_is_noted_not_flagged() -> None:
    events = attempt_events(0, 0, 0) + steps(0, 1, 8, 1) + failed(0, 20)
    events += attempt_events(1, 0, 30) + steps(1, 1, 30, 40, loss=lambda s: loss_at(s) + 0.01)
    rc = check(events)
    assert rc.verdict == "ok" and rc.findings == []
    assert "does not reproduce from its seed" in rc.notes[0]


def test_a_restart_from_zero_despite_a_checkpoint_that_does_not_reproduce_is_flagged() -> None:
    # the step counter was lost: the weights of step 20 were loaded, the loop began again at step 1
    rc = check(one_restart(resume=0, after_loss=lambda s: loss_at(s + 20)))
    finding = next(f for f in rc.findings if f.code == "loss_mismatch")
    assert finding.evidence["checkpoints_available"] == [10, 20]
    assert "lost step counter" in finding.message


def test_an_attempt_that_reproduces_a_flagged_attempt_it_resumed_from_is_not_flagged_again() -> None:
    out = attempt_events(0, 0, 0) + steps(0, 1, 25, 1) + checkpoint(0, 10, 10.5) + checkpoint(0, 20, 20.5)
    out += failed(0, 30)

    def off(s: int) -> float:  # attempt 1 went wrong at its resume and stayed on its own path
        return loss_at(s) + 0.3

    out += attempt_events(1, 20, 40) + steps(1, 21, 35, 41, loss=off) + checkpoint(1, 30, 50.5) + failed(1, 60)
    out += attempt_events(2, 30, 70) + steps(2, 31, 40, 71, loss=off)
    rc = check(out)
    assert codes(rc) == [("loss_mismatch", 1)]
    assert rc.resumes[1].reference_attempts == [1] and rc.resumes[1].ok


def test_config_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match="loss_rtol must be a finite number >= 0, got -1"):
        ResumeCheckConfig(loss_rtol=-1)
    with pytest.raises(ValueError, match="jump_window must be at least 1"):
        ResumeCheckConfig(jump_window=0)


def test_digest_values_reach_the_events_frame() -> None:
    assert "value" in EVENT_COLUMNS
    data = run_data_from_events("s1", [ev("digest", 1, attempt=0, rank=0, step=5, value="abc")])
    assert data.events.loc[0, "value"] == "abc" and data.events.loc[0, "step"] == 5


def test_a_run_without_restarts_or_steps_is_ok() -> None:
    assert check(attempt_events(0, 0, 0) + steps(0, 1, 30, 1)).verdict == "ok"
    assert check([]).verdict == "ok"


# -- a killed attempt's lost tail is unknown, never evidence -------------------------------------------------------


def killed_before_its_tail_arrived(*, resume_fields: dict[str, Any] | None = None,
                                   torn_at_resume: bool = False) -> list[dict[str, Any]]:
    """Attempt 0 (one rank) computed steps 1-275 with checkpoints every 50 and was killed at 275; only steps 1-220
    and the checkpoints up to 200 reached the collector. Attempt 1 resumes from 250 and runs to 300."""
    out = attempt_events(0, 0, 0, world=1) + steps(0, 1, 220, 1, world=1)
    for step in (50, 100, 150, 200):
        out += checkpoint(0, step, step + 0.5)
    if torn_at_resume:
        out += [ev("checkpoint_start", 250.5, attempt=0, rank=0, step=250)]
    out += [ev("attempt_start", 400, attempt=1, rank=0, world_size=1, host="h0"),
            ev("resume", 400, attempt=1, rank=0, step=250, **(resume_fields or {}))]
    return out + steps(1, 251, 300, 410, world=1)


def test_a_resume_from_a_checkpoint_lost_with_a_killed_attempt_is_not_flagged() -> None:
    rc = check(killed_before_its_tail_arrived())
    assert rc.verdict == "unverified" and rc.findings == [], rc.findings  # steps 221-275 never arrived
    assert any("last heard of at step 220" in n and "unknown" in n for n in rc.notes), rc.notes
    assert rc.resumes[0].reference_attempts == [0]


def test_a_checkpoint_whose_end_may_have_died_with_its_writer_is_not_torn_evidence() -> None:
    rc = check(killed_before_its_tail_arrived(torn_at_resume=True))
    assert rc.verdict == "unverified" and rc.findings == [], rc.findings


def test_a_resume_that_names_its_checkpoint_is_compared_with_the_attempt_that_wrote_it() -> None:
    rc = check(killed_before_its_tail_arrived(resume_fields={"checkpoint_step": 250, "checkpoint": "ckpt-250"}))
    assert rc.verdict == "unverified" and rc.findings == [], rc.findings
    assert any("names the checkpoint" in n for n in rc.notes), rc.notes
    assert rc.resumes[0].checkpoint_attempt == 0


def test_a_resume_that_is_no_checkpoint_is_still_flagged_when_the_earlier_attempt_ended_cleanly() -> None:
    events = [*killed_before_its_tail_arrived(), ev("attempt_end", 300, attempt=0, rank=0, reason="failed")]
    assert ("resume_not_a_checkpoint", 1) in codes(check(events))


def test_a_resume_whose_step_is_not_the_checkpoint_it_loaded_is_flagged() -> None:
    out = attempt_events(0, 0, 0, world=1) + steps(0, 1, 60, 1, world=1) + checkpoint(0, 50, 50.5)
    out += failed(0, 100, world=1)
    out += [ev("attempt_start", 110, attempt=1, rank=0, world_size=1, host="h0"),
            ev("resume", 110, attempt=1, rank=0, step=0, checkpoint_step=50)]
    out += steps(1, 1, 30, 120, world=1, loss=lambda s: loss_at(s + 50))
    rc = check(out)
    finding = next(f for f in rc.findings if f.code == "resume_not_a_checkpoint")
    assert finding.attempt == 1 and finding.evidence == {"resume_step": 0, "checkpoint_step": 50}
    assert "loaded the checkpoint of step 50 but resumed counting from step 0" in finding.message


def test_the_wire_schema_takes_resumes_with_and_without_the_checkpoint_they_loaded() -> None:
    from pydantic import TypeAdapter, ValidationError

    from services.collector.records import record_of
    from services.schemas.events import AnyEvent

    adapter = TypeAdapter(AnyEvent)
    base = {"event_id": "e1", "run_id": "r", "kind": "resume", "time": 1.7e9, "attempt": 1, "rank": 0, "step": 250}
    assert record_of(adapter.validate_python(base)).data is None  # an old client's resume
    record = record_of(adapter.validate_python({**base, "checkpoint_step": 250, "checkpoint": "/ckpt/step-250"}))
    assert record.data == {"checkpoint_step": 250, "checkpoint": "/ckpt/step-250"}
    for bad in ({"checkpoint_step": -1}, {"checkpoint": ""}, {"checkpoint_step": "250"}):
        with pytest.raises(ValidationError):
            adapter.validate_python({**base, **bad})


# -- the digest at load -------------------------------------------------------------------------------------------


def killed_after_checkpoint(*, saved: dict[int, str], loaded: str | None, resume: int = 250,
                            resume_fields: dict[str, Any] | None = None, world: int = 1) -> list[dict[str, Any]]:
    """Attempt 0 computed steps 1-275, checkpointed at 250 and was killed at 275; its steps after 250 died with it
    (its last flush interval), its digests of `saved` (rank -> value, at step 250) arrived with the checkpoint.
    Attempt 1 resumes from `resume` with the digest `loaded` of what it loaded, and runs to 300."""
    out = attempt_events(0, 0, 0, world=world) + steps(0, 1, 250, 1, world=world)
    out += [ev("digest", 251, attempt=0, rank=r, step=250, value=v) for r, v in saved.items()]
    out += checkpoint(0, 250, 251.5)
    out += [ev("attempt_start", 400, attempt=1, rank=r, world_size=world, host="h0") for r in range(world)]
    fields = dict(resume_fields or {})
    if loaded is not None:
        fields["digest"] = loaded
    out += [ev("resume", 400, attempt=1, rank=r, step=resume, **fields) for r in range(world)]
    first = resume + 1 if resume else 1
    return out + steps(1, first, 300, 410, world=world)


def test_a_loaded_state_whose_digest_differs_from_the_saved_one_is_flagged_though_no_step_was_recomputed() -> None:
    rc = check(killed_after_checkpoint(saved={0: "saved-250"}, loaded="momentum-zeroed"))
    assert rc.verdict == "flagged" and codes(rc) == [("digest_mismatch_at_load", 1)]
    (finding,) = rc.findings
    assert finding.steps == [250] and finding.ranks == [0]
    assert finding.evidence == {"resume_step": 250, "checkpoint_step": 250, "compared": 1, "mismatched": 1,
                                "tolerance": "equal strings"}
    row = finding.examples[0]
    assert (row.rank, row.step, row.expected, row.got, row.expected_attempt) == (
        0, 250, "saved-250", "momentum-zeroed", 0)
    assert "digest of the state it loaded differs from the one attempt 0 reported" in finding.message
    (resume,) = rc.resumes
    assert resume.recomputed_steps == 0 and resume.compared["digest_at_load"] == 1 and not resume.ok
    assert rc.gpu_seconds_since_first_finding > 0


def test_a_loaded_state_with_the_saved_digest_is_verified_and_ok() -> None:
    rc = check(killed_after_checkpoint(saved={0: "d250", 1: "d250-rank1"}, loaded=None, world=2)
               + [ev("resume", 400.5, attempt=1, rank=r, step=250, digest=d) for r, d in ((0, "d250"),
                                                                                         (1, "d250-rank1"))])
    assert rc.verdict == "ok" and rc.findings == [] and rc.reason is None
    (resume,) = rc.resumes
    assert resume.verified and resume.compared == {"loss": 0, "lr": 0, "digest": 0, "digest_at_load": 2}
    assert any("checked by its digest at load" in n for n in rc.notes), rc.notes


def test_a_digest_mismatch_at_load_is_a_finding_whatever_else_arrived() -> None:
    events = one_restart()  # the recomputed steps 21-25 reproduce exactly
    events += [ev("digest", 20.4, attempt=0, rank=r, step=20, value="saved") for r in range(2)]
    events += [ev("resume", 110.5, attempt=1, rank=r, step=20, digest="saved" if r == 0 else "rng-lost")
               for r in range(2)]
    rc = check(events)
    assert codes(rc) == [("digest_mismatch_at_load", 1)]
    assert rc.findings[0].ranks == [1] and rc.resumes[0].compared["loss"] == 10


def test_nothing_compared_is_unverified_with_the_reason() -> None:
    nothing = check(killed_after_checkpoint(saved={0: "d250"}, loaded=None))
    assert nothing.verdict == "unverified" and nothing.findings == []
    assert nothing.reason == ("attempt 1 resumed from step 250: no recomputed step and no digest at load arrived, "
                              "so nothing was compared (pass the loaded state's digest: tracker.resumed(step, "
                              "digest=...))")
    (resume,) = nothing.resumes
    assert resume.ok and not resume.verified and resume.unverified_reason == nothing.reason
    not_saved = check(killed_after_checkpoint(saved={}, loaded="d250"))
    assert not_saved.verdict == "unverified" and not_saved.reason is not None
    assert "no attempt reported a digest of step 250" in not_saved.reason
    assert "digest the state when you checkpoint it" in not_saved.reason


def test_a_lost_step_counter_is_compared_with_the_digest_of_the_checkpoint_it_loaded() -> None:
    rc = check(killed_after_checkpoint(saved={0: "d250"}, loaded="d250-with-step-0", resume=0,
                                       resume_fields={"checkpoint_step": 250}))
    finding = next(f for f in rc.findings if f.code == "digest_mismatch_at_load")
    assert finding.steps == [250] and finding.evidence["checkpoint_step"] == 250
    assert finding.evidence["resume_step"] == 0 and "(resuming from step 0)" in finding.message


def test_the_digest_at_load_is_compared_with_the_attempt_that_wrote_the_checkpoint() -> None:
    # attempt 1 went its own way from 250 (flagged there) and wrote the checkpoint of 300; attempt 2 loads it
    out = killed_after_checkpoint(saved={0: "d250"}, loaded="other")
    out += [ev("digest", 0.5, attempt=0, rank=0, step=300, value="attempt-0-300")]  # 0 computed it too, unsaved
    out += [ev("digest", 500, attempt=1, rank=0, step=300, value="attempt-1-300"), *checkpoint(1, 300, 501)]
    out += failed(1, 510, world=1)
    out += [ev("attempt_start", 600, attempt=2, rank=0, world_size=1, host="h0"),
            ev("resume", 600, attempt=2, rank=0, step=300, digest="attempt-1-300")]
    out += steps(2, 301, 320, 610, world=1)
    rc = check(out)
    assert codes(rc) == [("digest_mismatch_at_load", 1), ("digest_mismatch", 1)]  # 300 as attempt 0 had it, too
    second = rc.resumes[1]
    assert second.attempt == 2 and second.ok and second.verified and second.compared["digest_at_load"] == 1


def test_a_fresh_restart_or_a_run_without_restarts_needs_no_comparison() -> None:
    fresh = attempt_events(0, 0, 0) + steps(0, 1, 8, 1) + failed(0, 20) + attempt_events(1, 0, 30)
    rc = check(fresh + steps(1, 1, 30, 40, numbers=list(range(1, 31))))
    assert rc.verdict == "ok" and rc.resumes[0].verified  # no state was loaded
    assert check(attempt_events(0, 0, 0) + steps(0, 1, 30, 1)).reason is None


def test_the_resume_digest_reaches_the_events_frame_and_the_wire_schema_takes_it() -> None:
    from pydantic import TypeAdapter, ValidationError

    from services.collector.records import record_of
    from services.schemas.events import AnyEvent

    data = run_data_from_events("s1", [ev("resume", 1, attempt=1, rank=0, step=5, digest="abc")])
    assert data.events.loc[0, "digest"] == "abc" and data.events.loc[0, "value"] is None
    adapter = TypeAdapter(AnyEvent)
    base = {"event_id": "e1", "run_id": "r", "kind": "resume", "time": 1.7e9, "attempt": 1, "rank": 0, "step": 250}
    assert record_of(adapter.validate_python({**base, "digest": "a" * 128})).data == {"digest": "a" * 128}
    for bad in ({"digest": ""}, {"digest": "a" * 129}, {"digest": "a\nb"}, {"digest": 5}):
        with pytest.raises(ValidationError):
            adapter.validate_python({**base, **bad})
