"""What Slurm knows about the job a launcher runs in: ``scontrol show job -o $SLURM_JOB_ID`` and ``SLURM_*``.

Slurm exports no variable for the submission or start time; its record has both (``SubmitTime``,
``StartTime``, whole seconds, the controller's local time). The GPU count comes from the allocation's
variables; the final state (``JobState``, ``Reason``) says whether the job was cancelled, timed out, lost a
node, or was requeued (then the run goes on in a new allocation and has not ended).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from ingest_client.common.events import RunStatus

_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9_:/.]*=")

# JobState values after which the job is over and what the run's status is then. Others (RUNNING,
# COMPLETING, COMPLETED, FAILED) leave the status to the command's exit code.
_ENDED: dict[str, RunStatus] = {
    "CANCELLED": RunStatus.CANCELLED,
    "PREEMPTED": RunStatus.CANCELLED,
    "DEADLINE": RunStatus.FAILED,
    "TIMEOUT": RunStatus.FAILED,
    "NODE_FAIL": RunStatus.FAILED,
    "BOOT_FAIL": RunStatus.FAILED,
    "OUT_OF_MEMORY": RunStatus.FAILED,
}
# A requeued job goes back to the queue: its allocation ends, the run does not.
_REQUEUED = frozenset({"REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "PENDING", "CONFIGURING"})


def parse_scontrol_job(text: str) -> dict[str, str]:
    """``Key=Value`` pairs of ``scontrol show job -o``'s first line; a value may contain spaces."""
    fields: dict[str, str] = {}
    key = None
    line = text.strip().splitlines()[0] if text.strip() else ""
    for token in line.split(" "):
        if _KEY.match(token):
            key, value = token.split("=", 1)
            fields[key] = value
        elif key is not None and token:
            fields[key] += " " + token
    return fields


def slurm_time(value: str | None) -> float | None:
    """A Slurm timestamp (``2026-11-30T16:14:19``, local time) in seconds since the epoch; None when unset."""
    if not value or value in ("Unknown", "None", "N/A"):
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def _count_gpus(value: str) -> int | None:
    """``4``, ``a100:4``, ``a100:2,v100:1`` -> the total; None when no count is in it."""
    total = 0
    for part in value.split(","):
        count = part.rsplit(":", 1)[-1]
        if not count.isdigit():
            return None
        total += int(count)
    return total or None


def gpus_of_allocation(env: Mapping[str, str]) -> int | None:
    """The job's GPUs from its allocation's variables: ``SLURM_GPUS`` (``--gpus``, the job's total), else GPUs
    per node (``SLURM_GPUS_PER_NODE``, ``SLURM_GPUS_ON_NODE``, or the ids in ``SLURM_JOB_GPUS``) x nodes."""
    if env.get("SLURM_GPUS") and (total := _count_gpus(env["SLURM_GPUS"])):
        return total
    nodes = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or "1"
    nodes_n = int(nodes) if nodes.isdigit() else 1
    per_node = None
    if env.get("SLURM_GPUS_PER_NODE"):
        per_node = _count_gpus(env["SLURM_GPUS_PER_NODE"])
    if per_node is None and env.get("SLURM_GPUS_ON_NODE", "").isdigit():
        per_node = int(env["SLURM_GPUS_ON_NODE"]) or None
    if per_node is None and env.get("SLURM_JOB_GPUS"):
        per_node = len([g for g in env["SLURM_JOB_GPUS"].split(",") if g.strip()]) or None
    return per_node * nodes_n if per_node else None


@dataclass(frozen=True, slots=True)
class SlurmJob:
    job_id: str
    submitted_at_s: float | None
    started_at_s: float | None
    state: str
    reason: str
    restarts: int
    node_list: str
    ended_at_s: float | None = None
    time_limit: str = ""

    @classmethod
    def from_fields(cls, job_id: str, fields: Mapping[str, str]) -> SlurmJob:
        restarts = fields.get("Restarts", "0")
        return cls(
            job_id=job_id, submitted_at_s=slurm_time(fields.get("SubmitTime")),
            started_at_s=slurm_time(fields.get("StartTime")), state=fields.get("JobState", ""),
            reason=fields.get("Reason", ""), restarts=int(restarts) if restarts.isdigit() else 0,
            node_list=fields.get("NodeList", ""), ended_at_s=slurm_time(fields.get("EndTime")),
            time_limit=fields.get("TimeLimit", ""),
        )


def _scontrol(*args: str, timeout_s: float = 5.0) -> str | None:
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return None
    try:
        done = subprocess.run([scontrol, *args], capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def read_job(job_id: str) -> SlurmJob | None:
    """Slurm's record of the job now, or None when ``scontrol`` is missing or does not answer."""
    out = _scontrol("show", "job", "-o", job_id)
    return SlurmJob.from_fields(job_id, parse_scontrol_job(out)) if out else None


def hostnames(node_list: str) -> list[str]:
    """``node[01-02]`` -> ``["node01", "node02"]`` through ``scontrol show hostnames``; [] when unknown."""
    if not node_list or node_list in ("(null)", "None"):
        return []
    out = _scontrol("show", "hostnames", node_list)
    return [h for h in out.split() if h] if out else []


@dataclass(frozen=True, slots=True)
class SlurmOutcome:
    """How the job's allocation ended: the run's status (None: requeued, the run goes on) and why."""

    status: RunStatus | None
    detail: str | None


def _limit_s(value: str | None) -> float | None:
    """``TimeLimit`` (``[days-]hours:minutes:seconds``, ``minutes``, ``UNLIMITED``) in seconds."""
    if not value or not value[0].isdigit():
        return None
    days, _, clock = value.rpartition("-")
    parts = [int(p) for p in clock.split(":") if p.isdigit()]
    if not parts:
        return None
    if len(parts) == 1:
        parts = [0, parts[0], 0]
    while len(parts) < 3:
        parts.insert(0, 0)
    return (int(days) if days.isdigit() else 0) * 86400.0 + parts[0] * 3600 + parts[1] * 60 + parts[2]


def outcome(job: SlurmJob | None, exit_code: int, restarts_at_start: int | None = None) -> SlurmOutcome:
    """The run's status from Slurm's final state first (scancel, timeout, node failure, requeue), else from the
    command's exit code.

    While the launcher still runs, Slurm shows a job it is ending as ``COMPLETING`` and hides why; it then ended
    the job itself (the job's own exit leaves it ``RUNNING`` until the batch script exits): a restart count above
    the one at the launcher's start is a requeue, an end at the time limit a timeout, a node reason a node
    failure, anything else a cancel (``scancel``, or a preemption that does not requeue).
    """
    if job is None:
        return SlurmOutcome(RunStatus.FINISHED if exit_code == 0 else RunStatus.FAILED, None)
    base = (job.state.split() or [""])[0].split("+")[0]
    detail = f"slurm JobState={job.state} Reason={job.reason}"
    if base == "COMPLETING":
        if restarts_at_start is not None and job.restarts > restarts_at_start:
            return SlurmOutcome(None, f"slurm: requeued ({detail})")
        limit_s = _limit_s(job.time_limit)
        if (limit_s is not None and job.started_at_s is not None and job.ended_at_s is not None
                and job.ended_at_s - job.started_at_s >= limit_s - 1):
            return SlurmOutcome(RunStatus.FAILED, f"slurm: time limit {job.time_limit} reached ({detail})")
        if job.reason.startswith(("Node", "Boot")):
            return SlurmOutcome(RunStatus.FAILED, f"slurm: node failure ({detail})")
        return SlurmOutcome(RunStatus.CANCELLED, f"slurm: cancelled ({detail})")
    if base in _REQUEUED:
        return SlurmOutcome(None, detail)
    if base in _ENDED:
        return SlurmOutcome(_ENDED[base], detail)
    return SlurmOutcome(RunStatus.FINISHED if exit_code == 0 else RunStatus.FAILED,
                        detail if exit_code != 0 else None)
