"""Resume correctness: did each restart continue the run it resumed, or a different one?

A resume that restores the whole training state (parameters, optimizer buffers, RNG state, data position, step
counter) recomputes the steps after its checkpoint exactly as they were first computed. So for every attempt
k > 0 and every step it computed that an earlier attempt had computed too, per rank, we compare:

- loss: relative tolerance `loss_rtol` (1e-6). Deterministic CPU runs reproduce bit for bit; GPU kernels
  (atomics in reductions, cuDNN autotuning, NCCL's reduction order) may not: raise the tolerance, or compare
  digests of a deterministic job (torch.use_deterministic_algorithms(True));
- lr: equal up to float rounding (`lr_rtol`, 1e-9): schedules are functions of the step;
- digest (`digest` events, `tracker.digest(step, value)`): equal strings.

The reference for attempt k's steps is the lineage it resumed: the attempt that wrote the checkpoint at k's
resume step (it went on computing the steps after it from exactly the saved state), then any other earlier
attempt that resumed from that same step. A restart from step 0 is compared with the first fresh start.

The digest at load (`tracker.resumed(step, ..., digest=...)`, services.analysis.resume_at_load) is compared with
the digest that the attempt which wrote the loaded checkpoint reported for its step: it is on disk when the
checkpoint completes, so a restart is checked even when none of the steps it recomputed arrived.

Findings (each with the attempt, ranks, steps and expected-versus-got rows):

`digest_mismatch_at_load`  the state a restart loaded differs from the state its checkpoint's writer digested
`loss_mismatch`, `lr_mismatch`, `digest_mismatch`  recomputed steps that differ from their first computation
`loss_jump_at_resume`  no step was recomputed, and the mean loss of the first `jump_window` steps after the
                       resume differs from that of the last `jump_window` before it by more than `jump_factor`
                       times the median, and more than the largest, such change seen inside an attempt
`resume_not_a_checkpoint`  the resume step (not 0) is no checkpoint that an earlier attempt completed ok
`skipped_steps`, `repeated_steps`  within one attempt and rank: gaps or repeats in the step numbers (raw rows:
                       exact replays of one report are not repeats), or a first step other than resume + 1

The verdict: `flagged` with any finding; else `unverified` when a restart that loaded a checkpoint had nothing
compared (no recomputed step and no digest at load arrived: `reason` says which, per restart); else `ok`.

A partial-state resume typically shows as: optimizer buffers lost -> loss (from the second recomputed step) and
digest mismatches; RNG state lost -> loss (dropout, augmentation) and digest mismatches; data position lost ->
loss mismatches (other batches); step counter lost -> a resume that is not a checkpoint, a restart from 0 whose
losses differ from the fresh start's, skipped or repeated step numbers, or lr mismatches.

Pure: RunData (steps with loss and lr: storage's `load_run_data(..., detail=True)`) in, the typed ResumeCheck
(services.schemas.resume) out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any, get_args

import numpy as np
import pandas as pd

from services.analysis.attempts import RunStructure, build_run_structure
from services.analysis.resume_at_load import loaded_digests, mismatch_at_load, pairs_at_load
from services.analysis.run_data import RunData
from services.schemas.resume import (
    EvidenceRow,
    Finding,
    FindingCode,
    ResumeCheck,
    ResumeSummary,
    Tolerances,
    Verdict,
)

__all__ = ["ResumeCheckConfig", "build_resume_check"]

FINDING_CODES: tuple[FindingCode, ...] = get_args(FindingCode)  # the order findings of one attempt are listed in
_MISMATCH: dict[str, FindingCode] = {"loss": "loss_mismatch", "lr": "lr_mismatch", "digest": "digest_mismatch"}


@dataclass(frozen=True, slots=True, kw_only=True)
class ResumeCheckConfig:
    loss_rtol: float = 1e-6  # recomputed loss vs first computation, relative
    loss_atol: float = 0.0
    lr_rtol: float = 1e-9  # "equal up to float rounding"
    jump_window: int = 3  # steps on each side of a resume averaged by the loss-jump test
    jump_factor: float = 5.0  # a jump must exceed this x the run's median change (and its largest)
    min_jump_samples: int = 5  # in-attempt changes needed before a jump is judged at all
    max_examples: int = 10  # expected-vs-got rows kept per finding

    def __post_init__(self) -> None:
        for name in ("loss_rtol", "loss_atol", "lr_rtol"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")
        for name in ("jump_window", "min_jump_samples", "max_examples"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not self.jump_factor >= 1:
            raise ValueError(f"jump_factor must be at least 1, got {self.jump_factor}")


@dataclass(frozen=True, slots=True, kw_only=True)
class _NumberRow:
    """An EvidenceRow whose expected and got values are step numbers or counts."""

    rank: int
    step: int
    expected: int
    got: int

    def evidence(self) -> EvidenceRow:
        return EvidenceRow(rank=self.rank, step=self.step, expected=self.expected, got=self.got, expected_attempt=None)


def build_resume_check(data: RunData, structure: RunStructure | None = None,
                       config: ResumeCheckConfig | None = None, *, version: int) -> ResumeCheck:
    """Compare every step computed twice (before and after a restart) and check the step numbering.

    `version`: the run version `data` was loaded at (what the check describes)."""
    config = config or ResumeCheckConfig()
    structure = structure if structure is not None else build_run_structure(data)
    steps = structure.steps  # one row per (attempt, rank, step)
    digests = _digests(data.events)
    at_load = loaded_digests(data.events)
    ok_checkpoints = _ok_checkpoints(structure.checkpoints)
    rank_resumes = _rank_resumes(data.events)
    loaded = _loaded_checkpoints(data.events)
    known = _known_through(data.events, data.steps)
    writer_ranks = _checkpoint_ranks(data.events)
    findings: list[Finding] = _step_number_findings(data.steps, rank_resumes, config)
    findings.extend(_counter_not_the_checkpoint(rank_resumes, loaded))
    notes: list[str] = []
    summaries: list[ResumeSummary] = []

    attempts = sorted(structure.attempts, key=lambda a: a.attempt)
    for index, att in enumerate(attempts):
        if index == 0 or att.resume_step is None:
            continue
        k, resume = att.attempt, att.resume_step
        earlier = attempts[:index]
        writers = [a for a in ok_checkpoints.get(resume, ()) if a < k]
        # Ranks of earlier attempts killed before their record passed the resume step: whether they wrote a
        # checkpoint there is unknown (their last flush interval died with them), so its absence is no evidence.
        blind = [] if writers or resume == 0 else _blind_to(resume, earlier, known, writer_ranks)
        if blind:
            writers = [max(a for a, _, _ in blind)]
            named = any(loaded.get((k, r)) == resume for (a, r) in rank_resumes if a == k)
            notes.append(_unknown_checkpoint_note(k, resume, blind, named))
        if writers:
            writer = max(writers)
            refs = [writer, *(a.attempt for a in earlier if a.attempt > writer and a.resume_step == resume)]
        elif resume == 0:
            refs = [a.attempt for a in earlier if a.resume_step == 0]
        else:
            refs = [a.attempt for a in reversed(earlier)]
        before_k = sorted(s for s, who in ok_checkpoints.items() if any(a < k for a in who))
        fresh_restart = resume == 0 and not before_k  # no checkpoint to resume from yet: not a resume at all
        if resume != 0 and not writers:
            findings.append(_not_a_checkpoint(k, resume, rank_resumes, structure.checkpoints, before_k))

        mine = steps[steps["attempt"] == k]
        compared: dict[str, int] = {}
        attempt_findings: list[Finding] = []
        recomputed: set[int] = set()
        load_pairs, unmatched = pairs_at_load(k, at_load, digests, _writers_first(ok_checkpoints, k, refs, resume,
                                                                                  earlier))
        compared["digest_at_load"] = len(load_pairs)
        at_load_finding = mismatch_at_load(k, resume, load_pairs, config.max_examples)
        if at_load_finding is not None:
            attempt_findings.append(at_load_finding)
        for quantity, frame in (("loss", steps), ("lr", steps), ("digest", digests)):
            pairs = _pairs(frame, quantity, k, refs)
            compared[quantity] = len(pairs)
            recomputed.update(pairs["step"].tolist())
            finding = _mismatch(quantity, k, resume, pairs, config, before_k if resume == 0 else None)
            if finding is not None:
                attempt_findings.append(finding)
        if fresh_restart and attempt_findings:
            ranks = sorted({r for f in attempt_findings for r in f.ranks})
            notes.append(
                f"attempt {k} restarted from step 0 before any checkpoint existed, and its "
                f"{', '.join(f.code.split('_')[0] for f in attempt_findings)} differ from attempt {refs[0]}'s on "
                f"rank(s) {_list(ranks)}: the job does not reproduce from its seed (not flagged: no state was resumed)")
            attempt_findings = []
        findings.extend(attempt_findings)
        if resume > 0:
            jump = _loss_jump(steps, mine, k, resume, refs, config, notes)
            if jump is not None:
                findings.append(jump)
        unverified = None
        if not fresh_restart and not any(compared.values()):
            unverified = _unverified_reason(k, resume, at_load[at_load["attempt"] == k], unmatched)
        summaries.append(ResumeSummary(
            attempt=k, resume_step=resume, resume_reported=att.resume_reported,
            checkpoint_attempt=max(writers) if writers else None, reference_attempts=refs,
            recomputed_steps=len(recomputed), compared=compared, ok=True, verified=unverified is None,
            unverified_reason=unverified))

    findings.sort(key=lambda f: (f.attempt, FINDING_CODES.index(f.code)))
    flagged_attempts = {f.attempt for f in findings}
    summaries = [s.model_copy(update={"ok": s.attempt not in flagged_attempts}) for s in summaries]
    for s in summaries:
        if s.ok and s.verified and s.recomputed_steps == 0 and s.resume_step:
            notes.append(f"attempt {s.attempt} resumed from step {s.resume_step} and recomputed no step an earlier "
                         "attempt had reported: it was checked by its digest at load (and its step numbering)")
    reasons = [s.unverified_reason for s in summaries if s.unverified_reason]
    verdict: Verdict = "flagged" if findings else "unverified" if reasons else "ok"
    return ResumeCheck(
        run_id=data.run_id, version=version, verdict=verdict, reason="; ".join(reasons) if verdict == "unverified"
        else None, findings=findings, resumes=summaries, notes=notes, config=Tolerances(**asdict(config)),
        gpu_seconds_since_first_finding=_gpu_seconds_from(structure, min(flagged_attempts, default=None)),
        gpu_seconds_since_first_unverified=_gpu_seconds_from(
            structure, min((s.attempt for s in summaries if not s.verified), default=None)))


def _writers_first(ok_checkpoints: Mapping[int, list[int]], attempt: int, refs: list[int], resume: int,
                   earlier: list[Any]) -> Callable[[int], list[int]]:
    """For a digest at load of the state of step s: the attempts whose digest of s is the reference, best first:
    those that completed the checkpoint of s (the latest first), then the resume's references, then any earlier
    attempt (the latest first)."""
    def references(step: int) -> list[int]:
        writers = sorted((a for a in ok_checkpoints.get(step, ()) if a < attempt), reverse=True)
        lineage = refs if step == resume else []
        rest = [a.attempt for a in reversed(earlier)]
        return list(dict.fromkeys([*writers, *lineage, *rest]))
    return references


def _unverified_reason(attempt: int, resume: int, reported: pd.DataFrame, unmatched: pd.DataFrame) -> str:
    """Why nothing was compared for a restart that loaded state: what did not arrive, and what would check it."""
    if reported.empty:
        return (f"attempt {attempt} resumed from step {resume}: no recomputed step and no digest at load arrived, "
                "so nothing was compared (pass the loaded state's digest: tracker.resumed(step, digest=...))")
    step = int(unmatched["step"].iloc[0]) if not unmatched.empty else resume
    return (f"attempt {attempt} resumed from step {resume}: no recomputed step arrived, and no attempt reported a "
            f"digest of step {step} for its digest at load to be compared with (digest the state when you "
            "checkpoint it, by the same function)")


# -- inputs ---------------------------------------------------------------------------------------------------


def _digests(events: pd.DataFrame) -> pd.DataFrame:
    """attempt, rank, step, digest: the first digest reported for each (attempt, rank, step)."""
    rows = events[(events["kind"] == "digest") & events["attempt"].notna() & events["rank"].notna()
                  & events["step"].notna() & events["value"].notna()]
    rows = rows.sort_values("time", kind="stable").drop_duplicates(["attempt", "rank", "step"], keep="first")
    return pd.DataFrame({
        "attempt": rows["attempt"].astype(np.int64).to_numpy(), "rank": rows["rank"].astype(np.int64).to_numpy(),
        "step": rows["step"].astype(np.int64).to_numpy(), "digest": rows["value"].astype(str).to_numpy(),
    })


def _ok_checkpoints(checkpoints: pd.DataFrame) -> dict[int, list[int]]:
    """step -> attempts that completed an ok checkpoint at that step."""
    out: dict[int, list[int]] = {}
    ok = checkpoints[checkpoints["ok"].astype(bool)]
    for step, attempt in zip(ok["step"].to_numpy(np.int64), ok["attempt"].to_numpy(np.int64), strict=True):
        out.setdefault(int(step), []).append(int(attempt))
    return out


def _rank_resumes(events: pd.DataFrame) -> dict[tuple[int, int], int]:
    """(attempt, rank) -> the step that rank reported resuming from."""
    rows = events[(events["kind"] == "resume") & events["attempt"].notna() & events["rank"].notna()
                  & events["step"].notna()]
    out: dict[tuple[int, int], int] = {}
    for a, r, s in zip(rows["attempt"].astype(np.int64), rows["rank"].astype(np.int64), rows["step"].astype(np.int64),
                       strict=True):
        key = (int(a), int(r))
        out[key] = min(out.get(key, int(s)), int(s))
    return out


def _loaded_checkpoints(events: pd.DataFrame) -> dict[tuple[int, int], int]:
    """(attempt, rank) -> the step of the checkpoint its `resume` says it loaded (`checkpoint_step`)."""
    if "checkpoint_step" not in events.columns:
        return {}
    rows = events[(events["kind"] == "resume") & events["attempt"].notna() & events["rank"].notna()
                  & events["checkpoint_step"].notna()]
    return {(int(a), int(r)): int(c) for a, r, c in
            zip(rows["attempt"], rows["rank"], rows["checkpoint_step"], strict=True)}


def _known_through(events: pd.DataFrame, raw_steps: pd.DataFrame) -> dict[tuple[int, int], float]:
    """(attempt, rank) -> the last step up to which its record is complete: infinite when it reported the end of
    its attempt (the client flushes then), else the furthest step its reports reached (a process killed without
    warning loses the steps it recorded in its last flush interval; anything recorded before a report that did
    arrive was spooled before it)."""
    out: dict[tuple[int, int], float] = {}
    if not raw_steps.empty:
        last = raw_steps.groupby(["attempt", "rank"])["step"].max()
        keys = (last.index.get_level_values(level).to_numpy(np.int64) for level in ("attempt", "rank"))
        out.update({(int(a), int(r)): float(s) for a, r, s in zip(*keys, last.to_numpy(np.int64), strict=True)})
    ranked = events[events["attempt"].notna() & events["rank"].notna()]
    stepped = ranked[ranked["step"].notna() & ranked["kind"].isin(["checkpoint_start", "checkpoint_end", "digest"])]
    for a, r, s in zip(stepped["attempt"], stepped["rank"], stepped["step"], strict=True):
        key = (int(a), int(r))
        out[key] = max(out.get(key, -1.0), float(s))
    for a, r in zip(*(ranked.loc[ranked["kind"] == "attempt_end", c] for c in ("attempt", "rank")), strict=True):
        out[(int(a), int(r))] = math.inf
    for a, r in zip(ranked["attempt"], ranked["rank"], strict=True):
        out.setdefault((int(a), int(r)), -1.0)
    return out


def _checkpoint_ranks(events: pd.DataFrame) -> frozenset[int]:
    """The ranks that reported checkpoints anywhere in the run (the writers; often rank 0 alone)."""
    rows = events[events["kind"].isin(["checkpoint_start", "checkpoint_end"]) & events["rank"].notna()]
    return frozenset(int(r) for r in rows["rank"])


def _blind_to(step: int, earlier: list[Any], known: Mapping[tuple[int, int], float],
              writer_ranks: frozenset[int]) -> list[tuple[int, int, float]]:
    """(attempt, rank, known through) of earlier attempts' writer ranks whose record stops at or before `step`
    without an attempt end: they may have completed a checkpoint at `step` that never reached us."""
    out = []
    for att in earlier:
        if att.resume_step is not None and att.resume_step >= step:
            continue  # it started past `step`: it cannot have written that checkpoint
        ranks = writer_ranks or frozenset(r for (a, r) in known if a == att.attempt)
        for rank in sorted(ranks):
            through = known.get((att.attempt, rank), -1.0)
            if through <= step:
                out.append((att.attempt, rank, through))
    return out


def _unknown_checkpoint_note(attempt: int, resume: int, blind: list[tuple[int, int, float]], named: bool) -> str:
    a, r, through = blind[-1]
    last = "nothing" if through < 0 else f"step {int(through)}"
    said = (" Its resume names the checkpoint of that step: taken as written by attempt " f"{a}." if named else
            f" Not flagged as a resume that is no checkpoint; compared with attempt {a}.")
    return (f"attempt {attempt} resumed from step {resume}; no completed checkpoint at that step reached the "
            f"collector, but attempt {a}'s rank {r} was last heard of at {last} without ending its attempt (killed: "
            f"what it recorded in its last flush interval is lost), so whether it wrote one is unknown.{said}")


def _counter_not_the_checkpoint(rank_resumes: Mapping[tuple[int, int], int],
                                loaded: Mapping[tuple[int, int], int]) -> list[Finding]:
    """A resume whose step differs from the step of the checkpoint it says it loaded (a lost step counter)."""
    wrong: dict[int, list[_NumberRow]] = {}
    for (a, r), step in sorted(rank_resumes.items()):
        c = loaded.get((a, r))
        if c is not None and c != step:
            wrong.setdefault(a, []).append(_NumberRow(rank=r, step=step, expected=c, got=step))
    out = []
    for a, rows in sorted(wrong.items()):
        first = rows[0]
        out.append(Finding(
            code="resume_not_a_checkpoint", attempt=a, ranks=[row.rank for row in rows],
            steps=sorted({int(row.step) for row in rows}),
            message=(f"attempt {a} loaded the checkpoint of step {first.expected} but resumed counting from step "
                     f"{first.got} (rank {first.rank}): the step counter (and what follows it: the learning-rate "
                     "schedule, the step numbers) was not restored"),
            evidence={"resume_step": int(first.got), "checkpoint_step": int(first.expected)},
            examples=[row.evidence() for row in rows[:10]]))
    return out


def _gpu_seconds_from(structure: RunStructure, attempt: int | None) -> float:
    if attempt is None or structure.job_steps.empty:
        return 0.0
    world = {a.attempt: a.world_size for a in structure.attempts}
    js = structure.job_steps[structure.job_steps["attempt"] >= attempt]
    spans = zip(js["attempt"], js["start"], js["end"], strict=True)
    return float(sum((e - s) * world.get(int(a), 1) for a, s, e in spans))


# -- recomputed steps -----------------------------------------------------------------------------------------


def _pairs(frame: pd.DataFrame, quantity: str, attempt: int, refs: list[int]) -> pd.DataFrame:
    """rank, step, got, expected, expected_attempt for every step of `attempt` that a reference computed."""
    columns = ["rank", "step", "got", "expected", "expected_attempt"]
    if frame.empty or not refs:
        return pd.DataFrame({c: [] for c in columns})
    present = frame[frame[quantity].notna()]
    mine = present[present["attempt"] == attempt][["rank", "step", quantity]].rename(columns={quantity: "got"})
    ref = present[present["attempt"].isin(refs)][["attempt", "rank", "step", quantity]]
    if mine.empty or ref.empty:
        return pd.DataFrame({c: [] for c in columns})
    priority = {a: i for i, a in enumerate(refs)}
    ref = ref.assign(priority=ref["attempt"].map(priority)).sort_values(["rank", "step", "priority"], kind="stable")
    ref = ref.drop_duplicates(["rank", "step"], keep="first").rename(
        columns={quantity: "expected", "attempt": "expected_attempt"})
    pairs = mine.merge(ref[["rank", "step", "expected", "expected_attempt"]], on=["rank", "step"], how="inner")
    return pairs.sort_values(["step", "rank"], kind="stable").reset_index(drop=True)[columns]


def _mismatch(quantity: str, attempt: int, resume: int, pairs: pd.DataFrame, config: ResumeCheckConfig,
              checkpoints_available: list[int] | None) -> Finding | None:
    if pairs.empty:
        return None
    if quantity == "digest":
        bad = pairs["got"].astype(str) != pairs["expected"].astype(str)
        tolerance: float | str = "equal strings"
    else:
        got, expected = pairs["got"].to_numpy(np.float64), pairs["expected"].to_numpy(np.float64)
        rtol, atol = (config.loss_rtol, config.loss_atol) if quantity == "loss" else (config.lr_rtol, 0.0)
        bad = pd.Series(np.abs(got - expected) > rtol * np.maximum(np.abs(got), np.abs(expected)) + atol)
        tolerance = rtol
    wrong = pairs[bad.to_numpy()]
    if wrong.empty:
        return None
    ranks = sorted({int(r) for r in wrong["rank"]})
    steps = sorted({int(s) for s in wrong["step"]})
    first = wrong.iloc[0]
    what = {"loss": "losses", "lr": "learning rates", "digest": "state digests"}[quantity]
    message = (f"attempt {attempt} resumed from step {resume}; of the {len(pairs)} (rank, step) {what} it recomputed, "
               f"{len(wrong)} differ from their first computation, first at step {int(first['step'])} on rank "
               f"{int(first['rank'])} ({_fmt(first['expected'])} in attempt {int(first['expected_attempt'])}, "
               f"{_fmt(first['got'])} now)")
    if checkpoints_available:
        message += (f"; it restarted from step 0 although checkpoint(s) {_list(checkpoints_available)} had completed "
                    "(a lost step counter?)")
    evidence: dict[str, Any] = {
        "resume_step": resume, "compared": len(pairs), "mismatched": len(wrong), "tolerance": tolerance,
    }
    if quantity != "digest":
        rel = np.abs(wrong["got"].to_numpy(np.float64) - wrong["expected"].to_numpy(np.float64)) / np.maximum(
            np.abs(wrong["expected"].to_numpy(np.float64)), 1e-300)
        evidence["max_relative_difference"] = float(rel.max())
    if checkpoints_available:
        evidence["checkpoints_available"] = list(checkpoints_available)
    shown = wrong.head(config.max_examples)
    examples = [
        EvidenceRow(rank=int(rank), step=int(step), expected=_value(expected), got=_value(got),
                    expected_attempt=int(expected_attempt))
        for rank, step, expected, got, expected_attempt in zip(
            shown["rank"].to_numpy(np.int64), shown["step"].to_numpy(np.int64), shown["expected"].to_numpy(),
            shown["got"].to_numpy(), shown["expected_attempt"].to_numpy(np.int64), strict=True)]
    return Finding(code=_MISMATCH[quantity], attempt=attempt, message=message, ranks=ranks,
                   steps=steps, evidence=evidence, examples=examples)


# -- loss jump ------------------------------------------------------------------------------------------------


def _loss_jump(steps: pd.DataFrame, mine: pd.DataFrame, attempt: int, resume: int, refs: list[int],
               config: ResumeCheckConfig, notes: list[str]) -> Finding | None:
    """For ranks whose resume recomputed no step: the loss right after the resume vs right before it."""
    w = config.jump_window
    with_loss = steps[steps["loss"].notna() & steps["attempt"].isin([*refs, attempt])]
    after_all = mine[(mine["step"] > resume) & mine["loss"].notna()]
    recomputed_ranks = set(with_loss.loc[with_loss["attempt"].isin(refs) & (with_loss["step"] > resume), "rank"])
    by_rank = {r: g for (r,), g in _int_groups(with_loss, ["rank"])}
    rows: list[EvidenceRow] = []
    details: dict[str, Any] = {}
    for (rank,), after in _int_groups(after_all, ["rank"]):
        if rank in recomputed_ranks:
            continue  # compared step by step instead
        history = by_rank.get(rank, with_loss.iloc[:0])
        before = _lineage_before(history[history["attempt"] != attempt], resume, refs, w)
        if before.empty:
            continue
        normal = _normal_changes(history, w)
        if len(normal) < config.min_jump_samples:
            notes.append(f"attempt {attempt}, rank {rank}: too few steps ({len(normal)} in-attempt windows) to "
                         "judge a loss jump at the resume")
            continue
        after = after.sort_values("step")
        b, a = float(before["loss"].mean()), float(after["loss"].head(w).mean())
        jump, median, largest = abs(a - b), float(np.median(normal)), float(np.max(normal))
        if jump > config.jump_factor * median and jump > largest and jump > config.loss_rtol * abs(b):
            rows.append(EvidenceRow(rank=rank, step=int(after["step"].iloc[0]), expected=b, got=a,
                                    expected_attempt=int(before["attempt"].iloc[-1])))
            details.setdefault("jump", jump)
            details.setdefault("median_change", median)
            details.setdefault("largest_change", largest)
            details.setdefault("relative_change", jump / abs(b) if b else None)
    if not rows:
        return None
    first = rows[0]
    return Finding(
        code="loss_jump_at_resume", attempt=attempt,
        message=(f"attempt {attempt} resumed from step {resume} and no step was recomputed; the mean loss of the "
                 f"first {w} steps after it is {_fmt(first.got)} against {_fmt(first.expected)} for the last {w} "
                 f"before (rank {first.rank}): a change of {details['jump']:.3g}, more than {config.jump_factor:g}x "
                 f"the run's median change between windows ({details['median_change']:.3g}) and more than its "
                 f"largest inside an attempt ({details['largest_change']:.3g})"),
        ranks=[r.rank for r in rows], steps=[resume, resume + 1],
        evidence={"resume_step": resume, "window": w, "factor": config.jump_factor, **details},
        examples=rows[:config.max_examples])


def _lineage_before(history: pd.DataFrame, resume: int, refs: list[int], w: int) -> pd.DataFrame:
    """The last `w` losses at or before the resume step (one rank's rows), from the first reference that has each."""
    rows = history[(history["step"] <= resume) & (history["step"] > resume - w)]
    if rows.empty:
        return rows
    order = {a: i for i, a in enumerate(refs)}
    rows = rows.assign(priority=rows["attempt"].map(lambda a: order.get(int(a), len(refs))))
    return rows.sort_values(["step", "priority"], kind="stable").drop_duplicates("step", keep="first")


def _normal_changes(rank_steps: pd.DataFrame, w: int) -> np.ndarray:
    """|mean of the next w losses - mean of the last w| at every point inside an attempt with w steps each side."""
    out: list[np.ndarray] = []
    for _, rows in rank_steps.groupby("attempt"):
        rows = rows.sort_values("step")
        loss, step = rows["loss"].to_numpy(np.float64), rows["step"].to_numpy(np.int64)
        if len(loss) < 2 * w:
            continue
        csum = np.concatenate([[0.0], np.cumsum(loss)])
        i = np.arange(w, len(loss) - w + 1)  # window before: [i-w, i), after: [i, i+w)
        contiguous = step[i + w - 1] - step[i - w] == 2 * w - 1
        before = (csum[i] - csum[i - w]) / w
        after = (csum[i + w] - csum[i]) / w
        out.append(np.abs(after - before)[contiguous])
    return np.concatenate(out) if out else np.array([])


# -- step numbers and the resume step ---------------------------------------------------------------------------


def _step_number_findings(raw_steps: pd.DataFrame, rank_resumes: dict[tuple[int, int], int],
                          config: ResumeCheckConfig) -> list[Finding]:
    """Gaps and repeats in each (attempt, rank)'s step numbers; a first step other than resume + 1."""
    if raw_steps.empty:
        return []
    # The same report stored twice (a replay regrouped differently) has the same start and end: not a repeat.
    rows = raw_steps.drop_duplicates(["attempt", "rank", "step", "start", "end"])
    skipped: dict[int, list[_NumberRow]] = {}
    repeated: dict[int, list[_NumberRow]] = {}
    for (a, r), group in _int_groups(rows, ["attempt", "rank"]):
        counts = group["step"].value_counts().sort_index()
        numbers = counts.index.to_numpy(np.int64)
        times = counts.to_numpy(np.int64)
        for s, n in zip(numbers[times > 1], times[times > 1], strict=True):
            repeated.setdefault(a, []).append(_NumberRow(rank=r, step=int(s), expected=1, got=int(n)))
        resume = rank_resumes.get((a, r))
        if resume is not None:
            first = int(numbers[0])
            if first > resume + 1:
                skipped.setdefault(a, []).append(_NumberRow(rank=r, step=resume + 1, expected=resume + 1, got=first))
            elif first <= resume:
                repeated.setdefault(a, []).append(_NumberRow(rank=r, step=first, expected=resume + 1, got=first))
        for i in np.flatnonzero(np.diff(numbers) > 1):
            after = int(numbers[i])
            skipped.setdefault(a, []).append(
                _NumberRow(rank=r, step=after + 1, expected=after + 1, got=int(numbers[i + 1])))
    out = []
    for a, found in sorted(skipped.items()):
        missing = sorted({s for row in found for s in range(int(row.step), int(row.got))})
        out.append(Finding(
            code="skipped_steps", attempt=a, ranks=sorted({row.rank for row in found}), steps=missing,
            message=(f"attempt {a} skipped {len(missing)} step number(s) ({_list(missing)}): rank {found[0].rank} "
                     f"went on to step {found[0].got} where step {found[0].expected} was due"),
            evidence={"missing": len(missing)}, examples=[row.evidence() for row in found[:config.max_examples]]))
    for a, found in sorted(repeated.items()):
        steps = sorted({int(row.step) for row in found})
        example = found[0]
        detail = (f"rank {example.rank} computed step {example.step} {example.got} times" if example.expected == 1
                  else f"rank {example.rank} began at step {example.got} where step {example.expected} (resume + 1) "
                  "was due")
        out.append(Finding(
            code="repeated_steps", attempt=a, ranks=sorted({row.rank for row in found}), steps=steps,
            message=f"attempt {a} computed step number(s) {_list(steps)} more than once: {detail}",
            evidence={"repeated": len(steps)}, examples=[row.evidence() for row in found[:config.max_examples]]))
    return out


def _not_a_checkpoint(attempt: int, resume: int, rank_resumes: dict[tuple[int, int], int],
                      checkpoints: pd.DataFrame, ok_before: list[int]) -> Finding:
    ranks = sorted(r for (a, r), s in rank_resumes.items() if a == attempt and s == resume)
    at_step = checkpoints[checkpoints["step"] == resume]
    if at_step.empty:
        state = "no checkpoint was taken at that step"
    elif bool(at_step["torn"].astype(bool).any()):
        state = "the checkpoint at that step was torn (never completed)"
    else:
        state = "the checkpoint at that step did not complete ok"
    latest = max(ok_before, default=None)
    evidence: dict[str, Any] = {"resume_step": resume, "checkpoints_completed": ok_before[-20:],
                                "latest_checkpoint": latest}
    return Finding(
        code="resume_not_a_checkpoint", attempt=attempt, ranks=ranks, steps=[resume],
        message=(f"attempt {attempt} resumed from step {resume}, but {state}; the checkpoints completed before it "
                 f"were at step(s) {_list(ok_before) or 'none'}"),
        evidence=evidence,
        examples=[EvidenceRow(rank=r, step=resume, expected=latest, got=resume, expected_attempt=None)
                  for r in ranks[:10]])


def _int_groups(frame: pd.DataFrame, columns: list[str]) -> Iterator[tuple[tuple[int, ...], pd.DataFrame]]:
    """`frame.groupby(columns)` in key order, each key read as ints from its group's rows (integer columns)."""
    for _, group in frame.groupby(columns, sort=True):
        yield tuple(int(group[c].to_numpy(np.int64)[0]) for c in columns), group


# -- formatting ---------------------------------------------------------------------------------------------------


def _value(v: Any) -> float | str | None:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    return str(v) if isinstance(v, str) else float(v)


def _fmt(v: Any) -> str:
    if isinstance(v, str):
        return v
    return "n/a" if v is None else f"{float(v):.9g}"


def _list(values: list[int], limit: int = 8) -> str:
    shown = ", ".join(str(v) for v in values[:limit])
    return shown + (f", ... ({len(values)} in all)" if len(values) > limit else "")
