"""GPU tests (``pytest -m gpu``): skipped, with the reason, where CUDA or NCCL is missing."""

from __future__ import annotations

import pytest


def _missing() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "CUDA is not available (no GPU or no CUDA build of torch)"
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_nccl_available():
        return "NCCL is not available in this torch build"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = _missing()
    for item in items:
        if "gpu" not in item.keywords:
            continue
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=f"gpu test: {reason}"))
            continue
        marker = item.get_closest_marker("gpu")
        assert marker is not None  # "gpu" is among the item's keywords
        need = marker.kwargs.get("devices", 1)
        import torch

        if torch.cuda.device_count() < need:
            item.add_marker(pytest.mark.skip(
                reason=f"gpu test: needs {need} GPUs, found {torch.cuda.device_count()}"))
