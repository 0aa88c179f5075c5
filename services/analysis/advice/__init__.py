"""The advice engine: what to change in a run, from its measured ledger. Every surface shows its output as it is
(`GET /v1/runs/{run_id}/advice`, `goodput advise`, the JSON and HTML reports, the run page).

    advice = build_advice(AdviceInput(ledger=ledger, views=views, resume_check=check, peers=project_ledgers),
                          formats)  # -> RunAdvice (services.schemas.advice)

One module per kind of action (hang, stragglers, checkpoints, startup, idle, correctness, queue), the figures they
rest on (figures) and what the failure causes say to them (causes), the run they read (context, config) and the
ranking (ranking). Pure: no I/O, no clock. Numbers are written by the `Formats` the caller passes
(services.reports.advice passes services.presentation's functions, the ones the dashboard and the CLI use), so the
wording is made here, once.

Every run shows its largest actions by the GPU-seconds at stake, each material one and, up to three, the small ones,
saying they are small (ranking). One rule per lever (docs/advice.md states each with its thresholds and a worked
example):

- hung_now: the run is hung now (provisional hang): stop it; the urgent one, listed first.
- hang_timeout: failed attempts' hangs (last step to teardown) are cut to a shorter collective timeout T; the ranks
  the others waited for are named (causes).
- straggler_rank / straggler_spread: ranks the flag rule found consistently slower, by rank and host (drain,
  replace, exclude), or uneven work when none was.
- checkpoint_interval: Young/Daly at the failure rate of this run (or of its project, pooled with runs of similar
  size, said so); a run that did not fail is never told to checkpoint more often because other runs failed.
- checkpoint_missing, checkpoint_async: no checkpoint at all; blocking writes.
- startup: the largest part of startup (the ledger's startup_parts) and what cuts it; restart cost (warm spares,
  cached warm-up), with the host, rank or signal most failures share (causes).
- unused_gpus, idle_gaps: GPUs allocated beyond the world size ("8 of 32 GPUs never used"); other idle time.
- resume_correctness: the resume check flagged the run, or could not check a restart that loaded a checkpoint
  (unverified: nothing compared).
- queue: time waiting for the scheduler (no GPU time: no goodput prediction).
- clock_offset: a host whose clock is off (from the run's other hosts, measured from the step ends; or from the
  collector's, measured from the requests): check its NTP (no GPU time: the ledger took the offset out).

Predictions are of the measured run: following the advice does the same productive work P on `allocated - saved`,
so the predicted goodput is P / (A - saved), always written next to the measured one ("measured goodput X% -> Y%
if ...").
"""

from __future__ import annotations

from services.analysis.advice.config import DEFAULT_CONFIG, AdviceConfig, AdviceInput, Formats
from services.analysis.advice.figures import FailureRate, failure_rate, restart_seconds, world_size
from services.analysis.advice.ranking import build_advice

__all__ = ["DEFAULT_CONFIG", "AdviceConfig", "AdviceInput", "FailureRate", "Formats", "build_advice", "failure_rate",
           "restart_seconds", "world_size"]
