"""A simulated data-parallel training job: a realistic event stream and the ledger it must produce.

The simulator walks the job through time (queue, allocation, attempts, steps, checkpoints, failures with a
detection delay, a hang, a straggler rank, restarts from the last checkpoint) and books every GPU-second to
its category as it goes, by construction and independently of services.analysis. Tests compare the two.

Conventions that match the ledger specification: a failure aborts the step in progress (it is never
reported); a failure during a checkpoint write leaves it torn; the survivors report `attempt_end failed`
when the failure has been detected (`detect_s` later, or `hang_s` for a hang), and torchrun restarts the
group `relaunch_s` after that. After the last failure of a run that fails for good, the allocation is held
`tail_s` longer (the teardown): hang, as the ledger books it. With `killed`, no rank reports a failure (every
process SIGKILLed): the attempt was alive until its latest event (a heartbeat while stuck, else its last step or
checkpoint event), hang from its last progress to there, and the rest up to the next attempt's first step is the
restart's startup (detection, teardown, relaunch). With `clock_offsets`, the hosts named there report every time by
a clock that far ahead (negative: behind): the events carry the skewed times, the truth is booked on the true clock
(run-level events come from the launcher, whose clock is true).
"""

from __future__ import annotations

import hashlib
import math
import random
import statistics
import uuid
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from services.schemas.categories import WASTE_KEYS

START_TIME = 1_767_225_600.0  # 2026-01-01T00:00:00Z
RESUME_FAULTS = ("loss", "lr", "digest", "resume_step", "skip", "repeat")


@dataclass(frozen=True, slots=True, kw_only=True)
class SimConfig:
    run_id: str = field(default_factory=lambda: f"sim-{uuid.uuid4().hex[:8]}")
    ranks: int = 8
    gpus: int | None = None  # allocated GPUs; default = ranks (more GPUs than ranks leaves some idle)
    hours: float = 1.0  # useful compute the job needs, in hours of kept steps
    step_s: float = 1.0  # compute time of a normal step on one rank
    comm_s: float = 0.05  # all-reduce time once every rank has arrived
    mtbf_s: float | None = 1800.0  # mean wall time between failures while holding the GPUs; None = none
    checkpoint_every: int = 100  # steps between checkpoints
    checkpoint_s: float = 10.0
    startup_s: float = 60.0  # process start to first step (first attempt and every restart)
    relaunch_s: float = 5.0  # failure torn down -> next attempt's processes start
    detect_s: float = 30.0  # a crash is noticed and torn down after this long
    hang_at_step: int | None = None  # one rank hangs at this step (first attempt that reaches it)
    hang_s: float = 600.0  # collective timeout that ends the hang
    straggler_rank: int | None = None
    straggler_factor: float = 1.5  # that rank's compute x this
    straggler_prob: float = 1.0  # per step
    jitter: float = 0.0  # relative per-rank compute noise (uniform +-)
    queue_s: float = 120.0
    tail_s: float = 15.0  # allocation held after the run ends
    end: str = "finished"  # finished | failed | running: running stops mid-flight, failed after the last failure
    max_failures: int = 1000
    collectives: bool = True  # report per-rank time inside collectives (needed to see stragglers)
    comm_inline: bool = True  # as each step's `comm` seconds (what the client sends), else as collective rows
    seed: int = 0
    start_time: float = START_TIME
    records_per_rank: int = 2000  # steps per compact record
    digest_every: int | None = None  # each rank reports a state digest every this many steps (None: never)
    # Every attempt after a failure resumes with something wrong (None: an exact resume), as the resume check
    # should see it: "loss" (losses + 0.5 x attempt), "lr" (1e-3 / (1 + attempt)), "digest" (other digests;
    # needs digest_every), "resume_step" (reports resuming from checkpoint + 1 and numbers its steps from there),
    # "skip" / "repeat" (a step number skipped / repeated after its second step). Only what is reported changes:
    # the truth ledger is booked as for an exact resume.
    resume_fault: str | None = None
    killed: bool = False  # failures are SIGKILLs: no attempt_end (a run that fails for good still sends run_end)
    # each rank heart-beats this often while its attempt lives and ends no step (None: never)
    heartbeat_s: float | None = None
    ranks_per_host: int = 8  # rank r runs on host node{r // ranks_per_host:03d}
    clock_offsets: Mapping[str, float] = field(default_factory=dict)  # host -> its clock's seconds ahead

    def __post_init__(self) -> None:
        for name in ("ranks", "checkpoint_every", "ranks_per_host"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("hours", "step_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.gpus is not None and self.gpus < 1:
            raise ValueError(f"gpus must be at least 1, got {self.gpus}")
        if self.mtbf_s is not None and not self.mtbf_s > 0:
            raise ValueError(f"mtbf_s must be positive or None, got {self.mtbf_s}")
        if self.end not in ("finished", "failed", "running"):
            raise ValueError(f"end must be finished, failed or running, got {self.end!r}")
        if self.digest_every is not None and self.digest_every < 1:
            raise ValueError(f"digest_every must be at least 1 or None, got {self.digest_every}")
        if self.heartbeat_s is not None and not self.heartbeat_s > 0:
            raise ValueError(f"heartbeat_s must be positive or None, got {self.heartbeat_s}")
        if self.resume_fault is not None and self.resume_fault not in RESUME_FAULTS:
            raise ValueError(f"resume_fault must be one of {', '.join(RESUME_FAULTS)} or None, "
                             f"got {self.resume_fault!r}")
        if self.straggler_rank is not None and not 0 <= self.straggler_rank < self.ranks:
            raise ValueError(f"straggler_rank must be in [0, {self.ranks}), got {self.straggler_rank}")


@dataclass(slots=True)
class Truth:
    """The ledger the simulated job must produce, booked while simulating."""

    allocated: float = 0.0
    productive: float = 0.0
    waste: dict[str, float] = field(default_factory=lambda: dict.fromkeys(WASTE_KEYS, 0.0))
    queue_s: float = 0.0
    restarts: int = 0
    failures: int = 0
    steps_kept: int = 0
    steps_reworked: int = 0
    furthest_step: int = 0
    at_risk: float = 0.0
    straggler_by_rank: dict[int, float] = field(default_factory=lambda: defaultdict(float))
    resume_steps: list[int] = field(default_factory=list)
    status: str = "running"

    def as_dict(self) -> dict[str, Any]:
        return {
            "allocated_gpu_seconds": self.allocated, "productive_gpu_seconds": self.productive,
            "waste_gpu_seconds": dict(self.waste), "queue_seconds": self.queue_s, "restarts": self.restarts,
            "failures": self.failures, "steps": {"kept": self.steps_kept, "reworked": self.steps_reworked,
                                                  "furthest": self.furthest_step},
            "at_risk_gpu_seconds": self.at_risk,
            "straggler_gpu_seconds_by_rank": {str(k): v for k, v in sorted(self.straggler_by_rank.items())},
            "resume_steps": list(self.resume_steps), "status": self.status,
        }


@dataclass(slots=True)
class SimResult:
    config: SimConfig
    events: list[dict[str, Any]]
    truth: Truth


class _Emitter:
    def __init__(self, run_id: str, skew: Callable[[int], float] = lambda rank: 0.0) -> None:
        self.run_id = run_id
        self.events: list[dict[str, Any]] = []
        self._n = 0
        self.last_seen: dict[int, float] = {}  # per attempt, the (true) time of its latest event
        self._skew = skew  # a rank's clock minus the true time

    def emit(self, kind: str, time: float, **fields: Any) -> None:
        self._n += 1
        if "attempt" in fields:
            attempt = fields["attempt"]
            self.last_seen[attempt] = max(self.last_seen.get(attempt, time), time)
        skew = self._skew(fields["rank"]) if "rank" in fields else 0.0
        if skew:
            time += skew
            fields.update({k: [t + skew for t in fields[k]] for k in ("start", "end") if k in fields})
        self.events.append({"event_id": f"{self.run_id}:{self._n}", "run_id": self.run_id, "kind": kind,
                            "time": time, **fields})


def simulate(config: SimConfig) -> SimResult:
    return _Simulation(config).run()


class _Simulation:
    def __init__(self, config: SimConfig) -> None:
        self.c = config
        self.rng = random.Random(config.seed)
        self.w = config.ranks
        self.g = config.gpus or config.ranks
        self.on = min(self.w, self.g)  # GPUs an attempt's time counts on; the rest of the allocation is idle
        self.out = _Emitter(config.run_id, lambda rank: config.clock_offsets.get(self.host(rank), 0.0))
        self.truth = Truth()
        self.target = max(1, round(config.hours * 3600 / config.step_s))
        self.saved = 0  # last completed checkpoint step: where the next attempt resumes
        self.hang_pending = config.hang_at_step is not None

    # -- booking -------------------------------------------------------------------------------------
    def book(self, category: str, seconds: float) -> None:
        self.truth.waste[category] += seconds * self.on
        self.truth.waste["idle"] += seconds * (self.g - self.on)
        self.truth.allocated += seconds * self.g

    def book_idle(self, seconds: float) -> None:
        self.truth.waste["idle"] += seconds * self.g
        self.truth.allocated += seconds * self.g

    def keep(self, duration: float, straggle: float, slow_rank: int) -> None:
        if not self.c.collectives:
            straggle = 0.0  # without collective timings the ledger cannot see (and does not charge) stragglers
        self.truth.steps_kept += 1
        self.truth.allocated += duration * self.g
        self.truth.waste["idle"] += duration * (self.g - self.on)
        self.truth.productive += duration * self.on - straggle
        self.truth.waste["straggler"] += straggle
        if straggle > 0:
            self.truth.straggler_by_rank[slow_rank] += straggle

    def next_failure(self, now: float) -> float:
        if self.c.mtbf_s is None or self.truth.failures >= self.c.max_failures:
            return math.inf
        return now + self.rng.expovariate(1.0 / self.c.mtbf_s)

    # -- the job -------------------------------------------------------------------------------------
    def run(self) -> SimResult:
        c, out = self.c, self.out
        t = c.start_time
        out.emit("run_submitted", t, gpus=self.g)
        admitted = t + c.queue_s
        self.truth.queue_s = admitted - t
        t = admitted
        out.emit("allocation_start", t, gpus=self.g)
        begin = t  # startup of the next attempt runs from here to its first step
        attempt = 0
        while True:
            outcome, t, booked_until = self.attempt(attempt, t, begin)
            if outcome == "finished":
                end = t + 2.0
                self.book_idle(end - t)
                for r in range(self.w):
                    out.emit("attempt_end", end, attempt=attempt, rank=r, reason="completed")
                out.emit("run_end", end, status="finished")
                return self.close(end, "finished")
            if outcome == "running":
                self.truth.status = "running"
                return SimResult(config=c, events=out.events, truth=self.truth)
            # failed: t is the moment the failure was torn down
            if not c.killed:
                for r in range(self.w):
                    out.emit("attempt_end", t, attempt=attempt, rank=r, reason="failed")
            if self.truth.failures >= c.max_failures and c.end == "failed":
                out.emit("run_end", t, status="failed")
                return self.close(t, "failed")
            self.truth.restarts += 1
            attempt += 1
            begin = booked_until  # the restart's startup: from where the failed attempt's time was booked up to
            t += c.relaunch_s

    def close(self, t: float, status: str) -> SimResult:
        alloc_end = t + self.c.tail_s
        self.out.emit("allocation_end", alloc_end)
        if status == "failed":  # the failed job holds the GPUs until it is torn down: failure cost
            self.book("hang", alloc_end - t)
        else:
            self.book_idle(alloc_end - t)
        self.truth.status = status
        return SimResult(config=self.c, events=self.out.events, truth=self.truth)

    def attempt(self, attempt: int, t: float, begin: float) -> tuple[str, float, float]:
        """(outcome, the moment it ended or was torn down, where its booking stops: the next startup's start)."""
        c, out, w = self.c, self.out, self.w
        started = t
        for r in range(w):
            out.emit("attempt_start", t, attempt=attempt, rank=r, world_size=w, host=self.host(r),
                     local_rank=r % c.ranks_per_host)
            out.emit("resume", t, attempt=attempt, rank=r, step=self.saved + self._resume_shift(attempt))
        self.truth.resume_steps.append(self.saved)
        fail_at = self.next_failure(t)
        step = self.saved
        done: list[tuple[int, float, float, int]] = []  # (step, duration, straggler GPU-s, slowest rank)
        rows: dict[int, list[tuple[int, float, float, float, float]]] = defaultdict(list)
        last_progress: float | None = None
        torn_from: float | None = None
        failed_at: float | None = None
        detect = c.detect_s
        startup_booked_until: float | None = None

        first_step_at = t + c.startup_s
        if fail_at < first_step_at:
            failed_at = fail_at
        else:
            t = first_step_at
            self.book("startup", t - begin)
            startup_booked_until = t
            while step < self.target:
                s_no = step + 1
                computes = [self._compute(r) for r in range(w)]
                slowest = max(computes)
                duration = slowest + c.comm_s
                if self.hang_pending and s_no == c.hang_at_step:
                    self.hang_pending = False
                    failed_at, detect = t, c.hang_s  # a rank stops; the rest wait in all-reduce until the timeout
                    break
                if fail_at < t + duration:
                    failed_at = fail_at
                    break
                straggle = (slowest - statistics.median(computes)) * self.on
                loss = 2.0 * math.exp(-s_no / 5000.0) + 0.01 * math.sin(s_no)
                end_t = t + duration
                for r in range(w):
                    rows[r].append((s_no, t, end_t, loss, t + computes[r]))
                # book what the timestamps say (epoch floats round), so truth and events agree exactly
                done.append((s_no, end_t - t, straggle, computes.index(slowest)))
                t = end_t
                step = s_no
                last_progress = t
                self.truth.furthest_step = max(self.truth.furthest_step, step)
                if c.end == "running" and step >= self.target // 2 + 1:
                    break
                if step % c.checkpoint_every == 0 and step < self.target:
                    for r in range(w):
                        out.emit("checkpoint_start", t, attempt=attempt, rank=r, step=step)
                    if fail_at < t + c.checkpoint_s:
                        failed_at, torn_from = fail_at, t
                        break
                    ck_end = t + c.checkpoint_s
                    self.book("checkpoint", ck_end - t)
                    t = ck_end
                    for r in range(w):
                        out.emit("checkpoint_end", t, attempt=attempt, rank=r, step=step, ok=True)
                    self.saved = step
                    last_progress = t
        self.emit_rows(attempt, rows)

        if failed_at is None:
            self.heartbeats(attempt, started, t, [row[2] for row in rows.get(0, [])])
            if c.end == "running" and step < self.target:
                for s_no, duration, straggle, slow_rank in done:
                    self.keep(duration, straggle, slow_rank)
                    if s_no > self.saved:
                        self.truth.at_risk += duration * self.on
                return "running", t, t
            for _, duration, straggle, slow_rank in done:
                self.keep(duration, straggle, slow_rank)
            return "finished", t, t

        self.truth.failures += 1
        end = failed_at + detect
        # the survivors beat until they are torn down
        self.heartbeats(attempt, started, end, [row[2] for row in rows.get(0, [])])
        last_failure = self.truth.failures >= c.max_failures and c.end == "failed"
        # Where the failure is known to have been: its report (attempt_end); killed without one, the attempt's
        # latest event, unless it is the last of a failed run (run_end says when the launcher saw it die).
        booked_until = end
        if c.killed and not last_failure:
            booked_until = max(self.out.last_seen[attempt], startup_booked_until or begin)
        for s_no, duration, straggle, slow_rank in done:
            if s_no <= self.saved:
                self.keep(duration, straggle, slow_rank)
            else:  # thrown away: the next attempt resumes from the last checkpoint
                self.truth.steps_reworked += 1
                self.book("rework", duration)
        if last_progress is None:  # no step completed: all of the attempt was startup
            self.book("startup", booked_until - (begin if startup_booked_until is None else startup_booked_until))
        elif torn_from is not None:
            self.book("checkpoint", booked_until - torn_from)  # a torn write blocks until the teardown
        else:
            self.book("hang", booked_until - last_progress)
        return "failed", end, booked_until

    def host(self, rank: int) -> str:
        return f"node{rank // self.c.ranks_per_host:03d}"

    def heartbeats(self, attempt: int, since: float, until: float, step_ends: list[float]) -> None:
        """As ingest_client sends them: a heartbeat once a rank has been heard from neither by a step end nor by a
        heartbeat for `heartbeat_s`, up to `until` (none while steps end every `heartbeat_s` or sooner)."""
        if self.c.heartbeat_s is None:
            return
        heard = since
        for end in [*(e for e in step_ends if e <= until), math.inf]:
            while (beat := heard + self.c.heartbeat_s) < end and beat <= until:
                for r in range(self.w):
                    self.out.emit("heartbeat", beat, attempt=attempt, rank=r)
                heard = beat
            heard = end

    def _compute(self, rank: int) -> float:
        c = self.c
        x = c.step_s * (1 + (self.rng.uniform(-c.jitter, c.jitter) if c.jitter else 0.0))
        if rank == c.straggler_rank and self.rng.random() < c.straggler_prob:
            x *= c.straggler_factor
        return x

    def _resume_shift(self, attempt: int) -> int:
        return 1 if attempt > 0 and self.c.resume_fault == "resume_step" else 0

    def _faulty(self, attempt: int, mine: list[tuple[int, float, float, float, float]]
                ) -> list[tuple[int, float, float, float, float]]:
        """The rows as a resume that lost part of the state reports them (attempts after a failure only)."""
        fault = self.c.resume_fault
        if attempt == 0 or fault is None:
            return mine
        if fault == "loss":
            return [(s, t0, t1, loss + 0.5 * attempt, tc) for s, t0, t1, loss, tc in mine]
        if fault in ("resume_step", "skip", "repeat"):
            shifts: dict[str, Callable[[int], int]] = {"resume_step": lambda i: 1, "skip": lambda i: 1 if i >= 2 else 0,
                                                       "repeat": lambda i: -1 if i >= 2 else 0}
            shift = shifts[fault]
            return [(s + shift(i), t0, t1, loss, tc) for i, (s, t0, t1, loss, tc) in enumerate(mine)]
        return mine

    def _digest(self, attempt: int, step: int) -> str:
        salt = f":attempt{attempt}" if attempt > 0 and self.c.resume_fault == "digest" else ""
        return hashlib.sha256(f"{self.c.seed}:{step}{salt}".encode()).hexdigest()[:32]

    def emit_rows(self, attempt: int, rows: dict[int, list[tuple[int, float, float, float, float]]]) -> None:
        n = self.c.records_per_rank
        lr = 1e-3 / (1 + attempt) if self.c.resume_fault == "lr" else 1e-3
        for r, true_rows in sorted(rows.items()):
            mine = self._faulty(attempt, true_rows)
            for i in range(0, len(mine), n):
                chunk = mine[i:i + n]
                fields = {"step": [x[0] for x in chunk], "start": [x[1] for x in chunk],
                          "end": [x[2] for x in chunk], "loss": [x[3] for x in chunk], "lr": [lr] * len(chunk)}
                if self.c.collectives and self.c.comm_inline:  # as the client sends it
                    fields["comm"] = [x[2] - x[4] for x in chunk]
                self.out.emit("steps", chunk[-1][2], attempt=attempt, rank=r, **fields)
                if self.c.collectives and not self.c.comm_inline:
                    self.out.emit("collectives", chunk[-1][2], attempt=attempt, rank=r,
                                  step=[x[0] for x in chunk], op=["allreduce"] * len(chunk),
                                  start=[x[4] for x in chunk], end=[x[2] for x in chunk])
            if self.c.digest_every is not None:
                for (true_step, *_), (step, _, end, _, _) in zip(true_rows, mine, strict=True):
                    if true_step % self.c.digest_every == 0:
                        self.out.emit("digest", end, attempt=attempt, rank=r, step=step,
                                      value=self._digest(attempt, true_step))
