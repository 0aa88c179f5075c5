"""One run under advice: its figures, and the helpers every rule words its recommendation with (evidence, the gain
on the measured run, the sentence that says a saving is small)."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.analysis.advice.config import AdviceConfig, AdviceInput, Formats
from services.schemas.advice import (
    AdviceCode,
    AdviceModel,
    Confidence,
    Evidence,
    EvidenceUnit,
    Gain,
    GainBound,
    Recommendation,
)
from services.schemas.categories import WASTE_KEYS
from services.schemas.ledger import Ledger


@dataclass(slots=True)
class RunContext:
    inp: AdviceInput
    f: Formats
    config: AdviceConfig
    notes: list[str] = field(default_factory=list)

    @property
    def ledger(self) -> Ledger:
        return self.inp.ledger

    @property
    def allocated(self) -> float:
        return self.ledger.allocated_gpu_seconds

    def waste(self, category: str) -> float:
        return self.ledger.waste_gpu_seconds[category]

    def share(self, category: str) -> float:
        return self.waste(category) / self.allocated if self.allocated > 0 else 0.0

    def ev(self, key: str, label: str, value: float | int | str | None, unit: EvidenceUnit) -> Evidence:
        return Evidence(key=key, label=label, value=value, unit=unit, text=self.text(value, unit))

    def text(self, value: float | int | str | None, unit: EvidenceUnit) -> str:
        if value is None or isinstance(value, str):
            return "—" if value is None else value
        if unit == "gpu_seconds":
            return self.f.gpu_time(float(value))
        if unit == "seconds":
            return self.f.duration(float(value))
        if unit == "ratio":
            return self.f.percent(float(value))
        return self.f.integer(round(value))

    def small_share(self, category: str, threshold: float) -> str | None:
        """The sentence that says a category's waste is below the share from which its advice is material; None
        when it is not."""
        return self.below(category, self.waste(category), threshold)

    def below(self, what: str, gpu_seconds: float, threshold: float) -> str | None:
        """The sentence that says `what` is below the share of the allocation from which its advice is material."""
        share = gpu_seconds / self.allocated if self.allocated > 0 else 0.0
        if share >= threshold:
            return None
        return (f"Small: {what} is {self.share_text(share)} of the allocation, under the "
                f"{self.f.percent(threshold)} from which this advice is material.")

    def small_gain(self, saved: float, threshold: float) -> str | None:
        """The sentence that says a modelled saving is below the share of the allocation it is advised from."""
        if self.allocated <= 0 or saved >= threshold * self.allocated:
            return None
        return (f"Small: the model expects {self.f.gpu_time(saved)} ({self.share_text(saved / self.allocated)} of "
                f"the allocation) from it, under the {self.f.percent(threshold)} from which this advice is material.")

    def share_text(self, share: float) -> str:
        """A share of the allocation; one that rounds to 0.0% says `under 0.1%` instead."""
        return self.f.percent(share) if share >= 0.0005 or share <= 0 else f"under {self.f.percent(0.001)}"

    def gain(self, saved: float | None, bound: GainBound, condition: str) -> tuple[Gain, str]:
        """The gain on the measured run and the sentence that says it: measured goodput -> predicted goodput."""
        ledger, f = self.ledger, self.f
        measured = ledger.goodput
        allocated, productive = self.allocated, ledger.productive_gpu_seconds
        if saved is None or bound == "none" or measured is None or allocated <= 0:
            return Gain(bound="none", gpu_seconds=None, measured_goodput=measured, predicted_goodput=None,
                        goodput_points=None), condition
        saved = min(max(saved, 0.0), allocated - productive)
        up_to = "up to " if bound == "at_most" else ""
        if productive <= 0:  # nothing kept: the same work takes no time, a goodput cannot be predicted
            return Gain(bound=bound, gpu_seconds=saved, measured_goodput=measured, predicted_goodput=None,
                        goodput_points=None), (
                f"No goodput prediction: the run kept none of its work (measured goodput {f.percent(measured)}); "
                f"{up_to}{f.gpu_time(saved)} of the {f.gpu_time(allocated)} allocated would have been saved if "
                f"{condition}.")
        predicted = productive / (allocated - saved) if allocated - saved > 0 else 1.0
        sentence = (f"Measured goodput {f.percent(measured)} -> {up_to}{f.percent(predicted)} if {condition}: "
                    f"{up_to}{f.gpu_time(saved)} saved, the same work on {f.gpu_time(allocated - saved)} instead "
                    f"of the {f.gpu_time(allocated)} measured.")
        return Gain(bound=bound, gpu_seconds=saved, measured_goodput=measured, predicted_goodput=predicted,
                    goodput_points=(predicted - measured) * 100.0), sentence

    def rec(self, code: AdviceCode, category: str, *, title: str, wording: str, at_stake: float,
            evidence: list[Evidence], model: tuple[str, str], saved: float | None, bound: GainBound,
            condition: str, confidence: Confidence, small: str | None = None) -> Recommendation:
        """A recommendation. What is at stake on a waste category is never more than that category's GPU-seconds."""
        if category in WASTE_KEYS:
            at_stake = min(at_stake, self.waste(category))
        gain, prediction = self.gain(saved, bound, condition)
        return Recommendation(code=code, category=category, title=title, wording=wording, prediction=prediction,
                              at_stake_gpu_seconds=at_stake, at_stake_text=self.f.gpu_time(at_stake), small=small,
                              evidence=[e for e in evidence if e.value is not None],  # what was measured
                              model=AdviceModel(name=model[0], statement=model[1]), gain=gain, confidence=confidence)

    def rec_without_gain(self, code: AdviceCode, category: str, *, title: str, wording: str, at_stake: float,
                         evidence: list[Evidence], model: tuple[str, str], condition: str,
                         measured: str) -> Recommendation:
        """A recommendation that predicts no gain (a run hung now, correctness, queue time): `condition` says why,
        and its confidence is what was measured ("measured: " + `measured`)."""
        return self.rec(code, category, title=title, wording=wording, at_stake=at_stake, evidence=evidence,
                        model=model, saved=None, bound="none", condition=condition,
                        confidence=Confidence(basis="measured", text=f"measured: {measured}"))


def count(f: Formats, n: int, noun: str) -> str:
    return f"{f.integer(n)} {noun}" + ("" if n == 1 else "s")


def sentence(text: str) -> str:
    return text[:1].upper() + text[1:]
