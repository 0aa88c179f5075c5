"""Advice about correctness, not GPU time: resumes that restore only part of the state (or that nothing could
check), and hosts whose clocks are off."""

from __future__ import annotations

from collections.abc import Iterable

from services.analysis.advice.config import Formats
from services.analysis.advice.context import RunContext, count, sentence
from services.schemas.advice import Recommendation
from services.schemas.resume import ResumeCheck


def resume_correctness(run: RunContext) -> Iterable[Recommendation]:
    check = run.inp.resume_check
    if check is not None and check.verdict == "unverified":
        yield _resume_unverified(run, check)
        return
    f = run.f
    if check is None or not check.flagged or not check.findings:
        return
    findings = check.findings
    kinds = ", ".join(sorted({x.code for x in findings}))
    since = check.gpu_seconds_since_first_finding
    yield run.rec_without_gain(
        "resume_correctness", "correctness", title="Make resumes restore the whole training state",
        wording=(f"{count(f, len(findings), 'resume finding')} ({kinds}); the first: {findings[0].message}. A resume "
                 "that restores only part of the state (optimizer buffers, RNG state, data position, step counter) "
                 "trains on without an error, but not on the run that was checkpointed: save and load all of it, "
                 f"and report digests (tracker.digest) to catch it. GET /v1/runs/{check.run_id}/resume-check has "
                 "the evidence."),
        at_stake=since,
        evidence=[run.ev("findings", "resume findings", len(findings), "count"),
                  run.ev("kinds", "kinds", kinds, "text"),
                  run.ev("gpu_seconds_since_first_finding", "trained since the first finding", since, "gpu_seconds")],
        model=("resume_check", "The resume check compares what a restart recomputed with the first computation "
                               "(docs/resume-check.md)."),
        condition=(f"No goodput prediction: this is about correctness, not time. {f.gpu_time(since)} of training "
                   "since the first finding ran on a state that differs from the one the run had."),
        measured=count(f, len(findings), "finding"))


def _resume_unverified(run: RunContext, check: ResumeCheck) -> Recommendation:
    f = run.f
    unchecked = [r for r in check.resumes if not r.verified]
    since = check.gpu_seconds_since_first_unverified
    return run.rec_without_gain(
        "resume_correctness", "correctness", title="Check each resume as it loads",
        wording=(f"{count(f, len(unchecked), 'restart')} loaded a checkpoint and nothing could be compared: "
                 f"{check.reason}. A resume that restores only part of the state (optimizer buffers, RNG state, data "
                 "position, step counter) trains on without an error; whether these did is unknown. Digest the "
                 "complete state when you checkpoint it (tracker.digest(step, goodput.state_digest(...)) before "
                 "tracker.checkpoint(step)) and pass the digest of the state you loaded to tracker.resumed(step, "
                 "checkpoint_step=..., digest=...): each resume is then checked the moment it loads "
                 "(docs/resume-check.md)."),
        at_stake=since,
        evidence=[run.ev("unverified_restarts", "restarts not checked", len(unchecked), "count"),
                  run.ev("gpu_seconds_since_first_unverified", "trained since the first unchecked restart", since,
                         "gpu_seconds")],
        model=("resume_check", "The resume check compares what a restart recomputed, and the digest of the state "
                               "it loaded, with the first computation (docs/resume-check.md)."),
        condition=(f"No goodput prediction: this is about correctness, not time. {f.gpu_time(since)} of training "
                   "since the first unchecked restart ran on a state nobody compared with the one saved."),
        measured="nothing arrived to compare")


def clock_offset(run: RunContext) -> Iterable[Recommendation]:
    f, limit = run.f, run.config.clock_offset_s
    between = [c for c in run.ledger.clocks if abs(c.offset_seconds) >= limit]
    collector = [c for c in run.inp.collector_clocks if abs(c.offset_seconds) >= limit]
    if not between and not collector:
        return
    reference = sorted(c.host for c in run.ledger.clocks if c.offset_seconds == 0)
    against = (f"the run's reference clock ({', '.join(reference[:3])}{'…' if len(reference) > 3 else ''})"
               if reference else "the run's reference clock")
    said = [f"host {c.host}'s clock is {_offset_text(f, c.offset_seconds)} {against}" for c in between[:5]]
    said += [f"host {c.host}'s clock is {_offset_text(f, c.offset_seconds)} the collector's" for c in collector[:5]]
    worst = max((abs(c.offset_seconds) for c in (*between, *collector)), default=0.0)
    hosts = sorted({c.host for c in (*between, *collector)})
    yield run.rec_without_gain(
        "clock_offset", "correctness", title="Set the hosts' clocks right: check their NTP",
        wording=(f"{sentence('; '.join(said))}. Check NTP on "
                 f"{', '.join(hosts[:8])}{'…' if len(hosts) > 8 else ''} (chronyc tracking, timedatectl). The ledger "
                 "measured each host's offset from its ranks' step ends and took it out before painting, and live "
                 "detection measures runs on the collector's clock, so the figures hold; but logs, traces and "
                 "checkpoints stamped by these hosts disagree with the others' by as much."),
        at_stake=0.0,
        evidence=[run.ev("largest_offset_seconds", "largest clock offset", worst, "seconds"),
                  run.ev("hosts", "hosts off", len(hosts), "count")],
        model=("clock_offsets", "A synchronous step ends at the same true instant on every rank: a host whose ranks "
                                "end their steps later by the same amount has a clock ahead by it (docs/ledger.md, "
                                "'Clocks'); the collector compares a request's Goodput-Sent-At with its arrival."),
        condition="No goodput prediction: the ledger already took the offsets out; this is about the hosts' clocks.",
        measured="step ends across hosts, request arrival times")



def _offset_text(f: Formats, offset: float) -> str:
    return f"{f.duration(abs(offset))} {'ahead of' if offset > 0 else 'behind'}"
