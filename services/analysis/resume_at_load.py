"""A resume checked the moment it loads: the digest of the state a restart loaded against the digest the attempt
that wrote the checkpoint reported for that step.

`tracker.resumed(step, checkpoint_step=..., digest=D)` carries D, the digest of the state just loaded; the writer
reported `tracker.digest(s, D')` after step s, before the checkpoint of s, whose durable write put D' on disk. So
the comparison never depends on which steps a killed attempt's last flush interval took with it: a restart whose
recomputed steps never arrived is still checked. D and D' must be made by the same function over the same state
(parameters, optimizer buffers, RNG state, data position, step counter); any piece the resume did not restore, or
a checkpoint that is not what was saved (a torn write read back), makes them differ.

Pure: the control events frame in (services.analysis.run_data's `events`: `resume` rows with `digest` and
`checkpoint_step`, `digest` rows with `value`), findings and counts out. services.analysis.resume_check decides
which attempts are the reference of each resume.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from services.schemas.resume import EvidenceRow, Finding

PAIR_COLUMNS = ("rank", "step", "got", "expected", "expected_attempt")


def loaded_digests(events: pd.DataFrame) -> pd.DataFrame:
    """attempt, rank, step, digest: per (attempt, rank), the first `resume` that carries a digest; `step` is the step
    of the state it loaded (its `checkpoint_step`, else its step)."""
    rows = events[(events["kind"] == "resume") & events["attempt"].notna() & events["rank"].notna()
                  & events["step"].notna() & events["digest"].notna()]
    rows = rows.sort_values("time", kind="stable").drop_duplicates(["attempt", "rank"], keep="first")
    step = rows["checkpoint_step"].where(rows["checkpoint_step"].notna(), rows["step"])
    return pd.DataFrame({
        "attempt": rows["attempt"].to_numpy(np.int64), "rank": rows["rank"].to_numpy(np.int64),
        "step": step.to_numpy(np.int64), "digest": rows["digest"].astype(str).to_numpy(),
    })


def pairs_at_load(attempt: int, loaded: pd.DataFrame, digests: pd.DataFrame,
                  references: Callable[[int], list[int]]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(pairs, unmatched) for `attempt`'s digests at load.

    pairs: PAIR_COLUMNS, each rank's digest at load (`got`) against the same rank's digest of the same step from
    the first attempt of `references(step)` that reported one (`expected`, `expected_attempt`).
    unmatched: the rows of `loaded` (attempt, rank, step, digest) that no reference attempt had a digest for.
    `digests`: attempt, rank, step, digest (services.analysis.resume_check's `_digests`)."""
    mine = loaded[loaded["attempt"] == attempt]
    rows: list[tuple[int, int, str, str, int]] = []
    missing: list[int] = []
    near = digests[digests["step"].isin(mine["step"].unique()) & digests["rank"].isin(mine["rank"].unique())]
    by_key = {(int(a), int(r), int(s)): str(d) for a, r, s, d in
              zip(near["attempt"], near["rank"], near["step"], near["digest"], strict=True)}
    for i, (rank, step, got) in enumerate(zip(mine["rank"].to_numpy(np.int64), mine["step"].to_numpy(np.int64),
                                              mine["digest"], strict=True)):
        found = next(((a, by_key[(a, int(rank), int(step))]) for a in references(int(step))
                      if (a, int(rank), int(step)) in by_key), None)
        if found is None:
            missing.append(i)
        else:
            rows.append((int(rank), int(step), str(got), found[1], found[0]))
    pairs = pd.DataFrame(rows, columns=list(PAIR_COLUMNS)) if rows else pd.DataFrame({c: [] for c in PAIR_COLUMNS})
    return pairs.sort_values(["step", "rank"], kind="stable").reset_index(drop=True), mine.iloc[missing]


def mismatch_at_load(attempt: int, resume: int, pairs: pd.DataFrame, max_examples: int) -> Finding | None:
    """`digest_mismatch_at_load` when any rank's digest at load differs from the writer's digest of that step."""
    if pairs.empty:
        return None
    wrong = pairs[pairs["got"].astype(str) != pairs["expected"].astype(str)]
    if wrong.empty:
        return None
    first = wrong.iloc[0]
    step, writer = int(first["step"]), int(first["expected_attempt"])
    loaded = f"the checkpoint of step {step}" + (f" (resuming from step {resume})" if step != resume else "")
    message = (f"attempt {attempt} loaded {loaded}, and the digest of the state it loaded differs from the one "
               f"attempt {writer} reported when it saved that step, on {len(wrong)} of the {len(pairs)} rank(s) "
               f"compared, first rank {int(first['rank'])} ({first['expected']} saved, {first['got']} loaded): a "
               "piece of the state was not restored (optimizer buffers, RNG state, data position, step counter), or "
               "the checkpoint read back is not the one written (a torn write)")
    shown = wrong.head(max_examples)
    examples = [EvidenceRow(rank=int(r), step=int(s), expected=str(e), got=str(g), expected_attempt=int(a))
                for r, s, g, e, a in zip(shown["rank"], shown["step"], shown["got"], shown["expected"],
                                         shown["expected_attempt"], strict=True)]
    return Finding(code="digest_mismatch_at_load", attempt=attempt, message=message,
                   ranks=sorted({int(r) for r in wrong["rank"]}), steps=sorted({int(s) for s in wrong["step"]}),
                   evidence={"resume_step": resume, "checkpoint_step": step, "compared": len(pairs),
                             "mismatched": len(wrong), "tolerance": "equal strings"},
                   examples=examples)
