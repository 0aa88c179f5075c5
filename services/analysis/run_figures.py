"""A run's figures as the fleet's lists show them (`/v1/runs`, `/v1/fleet/window`): the ledger's totals, status and
times, and its usage as arrays. Kept beside the stored ledger whenever one is stored (services.storage.runs), so
that a list of thousands of runs reads these few values instead of parsing every run's whole ledger; they are the
ledger's own values, copied, never computed again.

Pure: no clock, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pydantic import Field

from services.analysis.provisional import LiveHang, hang_overlay
from services.analysis.usage import UsagePieces, pieces_of
from services.schemas.ledger import Ledger, ProvisionalHang, RunningTail, WasteBreakdown, _Frozen, goodput_ratio
from services.schemas.usage import USAGE_KEYS, Usage

_FLOAT = np.dtype("<f8")


class RunFigures(_Frozen):
    """What a run list shows of a run's ledger (each field is the ledger's field of the same name)."""

    status: str
    first_time: float | None
    latest_time: float | None
    allocated_gpu_seconds: float
    productive_gpu_seconds: float
    eval_gpu_seconds: float
    goodput: float | None
    waste_gpu_seconds: WasteBreakdown
    restarts: int
    provisional: ProvisionalHang | None = None
    usage_keys: list[str] | None = Field(description="the keys of the ledger's usage, in the order of its stored "
                                         "pieces (services.storage.runs); null: the ledger has no usage")
    running_tail: RunningTail | None = Field(None, description="the ledger's running tail: what a hung run's "
                                             "provisional hang is booked on (absent from figures stored before it "
                                             "was kept: such a run's hang is booked on its whole ledger)")

    @property
    def knows_running_tail(self) -> bool:
        return "running_tail" in self.model_fields_set


@dataclass(frozen=True, slots=True)
class ListedFigures:
    """A run's figures with its usage as arrays (None: a ledger stored before there was usage)."""

    figures: RunFigures
    usage: UsagePieces | None


def figures_of(ledger: Ledger) -> RunFigures:
    return RunFigures(status=ledger.status, first_time=ledger.first_time, latest_time=ledger.latest_time,
                      allocated_gpu_seconds=ledger.allocated_gpu_seconds,
                      productive_gpu_seconds=ledger.productive_gpu_seconds,
                      eval_gpu_seconds=ledger.eval_gpu_seconds, goodput=ledger.goodput,
                      waste_gpu_seconds=ledger.waste_gpu_seconds, restarts=ledger.restarts,
                      provisional=ledger.provisional,
                      usage_keys=None if ledger.usage is None else list(ledger.usage.gpu_seconds),
                      running_tail=ledger.running_tail)


def listed_figures(ledger: Ledger) -> ListedFigures:
    return ListedFigures(figures_of(ledger), None if ledger.usage is None else pieces_of(ledger.usage))


def usage_bytes(ledger: Ledger) -> bytes | None:
    """The ledger's usage pieces as little-endian float64 columns: start, end, then each of its keys in the order of
    `figures_of(ledger).usage_keys` (exact: the same doubles)."""
    usage = ledger.usage
    if usage is None:
        return None
    columns = [usage.start, usage.end, *usage.gpu_seconds.values()]
    return np.asarray(columns, _FLOAT).reshape(-1).tobytes()


def provisional_figures(listed: ListedFigures, hang: LiveHang, now: float) -> ListedFigures:
    """`listed_figures(provisional_ledger(ledger, hang, now))` from the ledger's stored figures alone (they hold its
    running tail: `knows_running_tail`), to the bit the same."""
    figures = listed.figures
    overlay = hang_overlay(figures.status, figures.running_tail, hang, now)
    if overlay is None:
        return ListedFigures(figures.model_copy(update={"provisional": None}), listed.usage)
    allocated = figures.allocated_gpu_seconds + overlay.added_alloc
    update: dict[str, object] = {
        "waste_gpu_seconds": overlay.waste(figures.waste_gpu_seconds), "allocated_gpu_seconds": allocated,
        "goodput": goodput_ratio(figures.productive_gpu_seconds, allocated), "provisional": overlay.block}
    if overlay.added_wall > 0:
        update["running_tail"] = overlay.tail.model_copy(update={"until": float(overlay.now)})
    usage = listed.usage
    if usage is not None and figures.usage_keys is not None:
        stored = Usage(start=usage.start.tolist(), end=usage.end.tolist(), bin_s=None,
                       gpu_seconds={key: usage.values[:, USAGE_KEYS.index(key)].tolist() for key in figures.usage_keys})
        booked = overlay.usage(stored)
        update["usage_keys"] = list(booked.gpu_seconds)
        usage = pieces_of(booked)
    return ListedFigures(figures.model_copy(update=update), usage)


def usage_from_bytes(figures: RunFigures, blob: bytes | None) -> UsagePieces | None:
    """The pieces `usage_bytes` stored, as `pieces_of(ledger.usage)` makes them (absent keys zero)."""
    if figures.usage_keys is None or blob is None:
        return None
    keys = figures.usage_keys
    columns = np.frombuffer(blob, _FLOAT).reshape(2 + len(keys), -1)
    values = np.zeros((columns.shape[1], len(USAGE_KEYS)))
    for key, column in zip(keys, columns[2:], strict=True):
        values[:, USAGE_KEYS.index(key)] = column
    return UsagePieces(columns[0].astype(np.float64), columns[1].astype(np.float64), values)
