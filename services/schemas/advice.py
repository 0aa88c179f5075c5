"""The advice's type: what `services.analysis.advice.build_advice` returns, what `GET /v1/runs/{run_id}/advice`
serves, what the reports embed and what `goodput advise` and the run page print. One definition; every surface shows
these fields as they are (the wording and every figure's text are written once, by the engine).

A recommendation rests on measured figures (`evidence`), a stated model (`model`), an expected gain of the measured
run (`gain`: GPU-seconds and goodput points, `at_most` when the model gives only a bound) and a `confidence` (whose
failure rate, over how many failures). `prediction` is the sentence that ties the gain to the measured goodput:
"measured goodput X% -> Y% if ...", so a predicted figure never stands next to a measured one unexplained.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

AdviceCode = Literal[
    "hung_now", "hang_timeout", "straggler_rank", "straggler_spread", "checkpoint_interval", "checkpoint_missing",
    "checkpoint_async", "startup", "unused_gpus", "idle_gaps", "resume_correctness", "queue", "clock_offset",
]
EvidenceUnit = Literal["gpu_seconds", "seconds", "ratio", "count", "gpus", "steps", "text"]
GainBound = Literal["expected", "at_most", "none"]
FailureRateSource = Literal["run", "project"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class Evidence(_Frozen):
    """One measured figure a recommendation rests on."""

    key: str = Field(description="stable name of the figure, e.g. median_hang_seconds")
    label: str = Field(description="what the figure is, in words")
    value: float | int | str | None
    unit: EvidenceUnit
    text: str = Field(description="the value as every surface writes it")


class AdviceModel(_Frozen):
    name: str = Field(description="stable name: young_daly, timeout_cut, flagged_ranks_keep_pace, ...")
    statement: str = Field(description="the model and its assumptions, in words")


class Gain(_Frozen):
    """What following the advice is expected to save on the measured run: the same productive work on
    `allocated - gpu_seconds`, so `predicted_goodput = productive / (allocated - gpu_seconds)`."""

    bound: GainBound = Field(description="expected: the model's estimate; at_most: an upper bound; none: the "
                                         "advice is not about GPU time (correctness, queue), or it cannot be told")
    gpu_seconds: float | None
    measured_goodput: float | None
    predicted_goodput: float | None
    goodput_points: float | None = Field(description="(predicted - measured) x 100")


class Confidence(_Frozen):
    basis: Literal["measured", "model", "bound"] = Field(
        description="measured: the figures themselves say it; model: a model applied to measured figures; bound: "
                    "an upper bound")
    failure_rate_source: FailureRateSource | None = Field(
        None, description="whose failures the failure rate comes from: this run's, or its project's (pooled with "
                          "similar runs); null when the advice does not rest on a failure rate")
    failures: int | None = Field(None, description="failures the failure rate (or the evidence) counts")
    runs: int | None = Field(None, description="runs whose failures count (1: this run alone)")
    observed_seconds: float | None = Field(None, description="allocated wall seconds the failures were seen over")
    text: str


class Recommendation(_Frozen):
    code: AdviceCode = Field(description="stable kind of advice; one recommendation per code")
    category: str = Field(description="the waste category it acts on, or queue / correctness")
    title: str
    wording: str = Field(description="what to do, with the measured figures it rests on")
    prediction: str = Field(description="measured goodput -> predicted goodput and the condition, or why there is "
                                        "no prediction")
    at_stake_gpu_seconds: float = Field(description="the measured waste the advice acts on (the ranking key)")
    at_stake_text: str = Field(description="at_stake_gpu_seconds as every surface writes it")
    small: str | None = Field(None, description="why the saving is small (below the share of the allocation from "
                                                "which this kind of advice is material), in words; null when it is "
                                                "not. A small one is listed when it is among the run's largest")
    evidence: list[Evidence]
    model: AdviceModel
    gain: Gain
    confidence: Confidence


class MeasuredRun(_Frozen):
    status: str
    allocated_gpu_seconds: float
    productive_gpu_seconds: float
    waste_gpu_seconds: float
    goodput: float | None
    failures: int
    text: str = Field(description="the measured figures in one sentence, as every surface prints them")


class RunAdvice(_Frozen):
    run_id: str
    measured: MeasuredRun
    recommendations: list[Recommendation] = Field(description="largest GPU-seconds at stake first (a run hung now "
                                                              "first of all): every material one, and the run's "
                                                              "largest ones up to three even when small")
    notes: list[str] = Field(description="what was weighed and not advised, and why (e.g. other runs' failures "
                                         "that did not justify advice for this run)")
