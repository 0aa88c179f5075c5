"""``state_digest``: a short, stable hash of training state, for ``tracker.digest(step, value)``.

A resume that restores the whole state (parameters, optimizer buffers, RNG, data position, step) recomputes
the steps after its checkpoint bit for bit, so the digest taken after such a step is the same before and after
the restart; the collector compares them (``GET /v1/runs/{id}/resume-check``).

Cost: every tensor is copied to host memory and hashed (sha256, a few hundred MB/s per core). Call it every N
steps, outside the step's timing. torch is imported lazily, only when a tensor is met.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

DEFAULT_DIGEST_CHARS = 32


def state_digest(*objects: Any, length: int = DEFAULT_DIGEST_CHARS) -> str:
    """Hex sha256 prefix (``length`` characters, 1-64) over ``objects`` in order.

    Each object may be a module or optimizer (anything with ``state_dict()``), a tensor, a mapping (its keys
    sorted), a list or tuple, or a plain value (int, float, str, bool, None; hashed by ``repr``). Tensors
    contribute their dtype, shape and bytes, so a dtype change changes the digest.
    """
    if not 1 <= length <= 64:
        raise ValueError(f"length must be between 1 and 64 hex characters, got {length}")
    h = hashlib.sha256()
    for obj in objects:
        _update(h, obj)
    return h.hexdigest()[:length]


def _update(h: Any, obj: Any) -> None:  # Any: a hashlib object (no public type) and arbitrary state
    if _is_tensor(obj):
        import torch

        t = obj.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif hasattr(obj, "state_dict") and callable(obj.state_dict):
        h.update(b"S")
        _update(h, obj.state_dict())
    elif isinstance(obj, Mapping):
        h.update(b"{")
        for key in sorted(obj, key=repr):
            h.update(repr(key).encode())
            _update(h, obj[key])
        h.update(b"}")
    elif isinstance(obj, list | tuple):
        h.update(b"[")
        for item in obj:
            _update(h, item)
        h.update(b"]")
    else:
        h.update(repr(obj).encode())


def _is_tensor(obj: Any) -> bool:
    cls = type(obj)
    return cls.__module__.startswith("torch") and hasattr(obj, "detach") and hasattr(obj, "dtype")
