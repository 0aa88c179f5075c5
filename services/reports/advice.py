"""The advice as every surface shows it: the engine (services.analysis.advice) with services.presentation's number
formats. `GET /v1/runs/{run_id}/advice` and the reports call `run_advice`; `goodput advise` and the run page print
what the API serves. Nothing else words advice."""

from __future__ import annotations

from services import presentation
from services.analysis.advice import AdviceConfig, AdviceInput, Formats, build_advice
from services.schemas.advice import RunAdvice
from services.schemas.ledger import Ledger

DEFAULT_CONFIG = AdviceConfig()


def formats_for(ledger: Ledger) -> Formats:
    """The figures of one run's advice in the formats of the dashboard, the reports and the CLI: GPU time in the
    one unit the run's size calls for (its allocation: GPU-seconds, -minutes or -hours), as on its page."""
    unit = presentation.gpu_time_unit(ledger.allocated_gpu_seconds)

    def gpu_time(gpu_seconds: float) -> str:
        return presentation.gpu_time(gpu_seconds, unit)

    return Formats(gpu_time=gpu_time, percent=presentation.percent, duration=presentation.duration,
                   integer=presentation.integer)


def run_advice(inp: AdviceInput, config: AdviceConfig = DEFAULT_CONFIG) -> RunAdvice:
    return build_advice(inp, formats_for(inp.ledger), config)
