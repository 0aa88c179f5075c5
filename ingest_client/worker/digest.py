"""``state_digest``: a short, exact hash of training state, for ``tracker.digest(step, value)``.

A resume that restores the whole state (parameters, optimizer buffers, RNG, data position, step) recomputes
the steps after its checkpoint bit for bit, so the digest taken after such a step is the same before and after
the restart; the collector compares them (``GET /v1/runs/{id}/resume-check``).

Exact: every value is hashed by its bits, never by ``repr`` (NumPy elides and rounds). Each value is framed by
a one-byte type tag and, where its size varies, a length prefix, so two different structures can never produce
the same byte stream by concatenation::

    None -> N | bool -> B 0/1 | int -> I len two's-complement | float -> F IEEE-754 binary64 (big-endian)
    complex -> C re im | str -> U len utf-8 | bytes -> Y len raw
    list -> L count items | tuple -> T count items | set -> E count sorted(item digests)
    mapping -> D count (key digest, value), sorted by key digest
    NumPy array or scalar -> A dtype shape little-endian C-order bytes (object arrays: element by element)
    torch tensor -> P dtype/layout shape bytes (sparse COO: indices + values; other sparse layouts: dense;
                    quantized: integer values + scales; CUDA and other devices copied to host)
    object with state_dict() -> S state_dict

Floats keep their sign and NaN payload: ``0.0`` and ``-0.0`` differ, two NaNs with the same bits agree. ``True``
and ``1`` differ, as do ``1`` and ``1.0``, a list and a tuple, a NumPy array and a tensor. Mappings and sets do
not depend on insertion order. A meta tensor (no data) raises ``ValueError``; a type with no exact encoding
raises ``TypeError`` naming it.

Cost: every array and tensor is copied to host memory once (contiguous) and hashed with sha256, a few hundred
MB/s per core: ~1 s per GB of state. Call it every N steps, outside the step's timing. Standard library at import;
numpy and torch are used only when an object of theirs is met (they are then already imported).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import random
import struct
import sys
from collections.abc import Mapping
from typing import Any

DEFAULT_DIGEST_CHARS = 32

_Hash = Any  # a hashlib object (no public type)


def state_digest(*objects: Any, length: int = DEFAULT_DIGEST_CHARS) -> str:
    """Hex sha256 prefix (``length`` characters, 1-64) over ``objects`` in order (module docstring).

    Typical: ``state_digest(model, optimizer, {"epoch": e, "pos": i, "rng": rng.bit_generator.state})``.
    """
    if not 1 <= length <= 64:
        raise ValueError(f"length must be between 1 and 64 hex characters, got {length}")
    h = hashlib.sha256()
    _frame_count(h, b"Z", len(objects))
    for obj in objects:
        _update(h, obj)
    return h.hexdigest()[:length]


def _frame_count(h: _Hash, tag: bytes, n: int) -> None:
    h.update(tag + n.to_bytes(8, "big"))


def _frame_bytes(h: _Hash, tag: bytes, payload: bytes | memoryview) -> None:
    h.update(tag + memoryview(payload).nbytes.to_bytes(8, "big"))
    h.update(payload)


def _sub_digest(obj: Any) -> bytes:
    sub = hashlib.sha256()
    _update(sub, obj)
    return sub.digest()


def _update(h: _Hash, obj: Any) -> None:  # Any: arbitrary state
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        _update_tensor(h, obj, torch)
        return
    np = sys.modules.get("numpy")
    if np is not None and isinstance(obj, np.ndarray | np.generic):
        _update_array(h, np.asarray(obj), np)
        return
    if obj is None:
        h.update(b"N")
    elif isinstance(obj, bool):  # before int: bool is an int
        h.update(b"B\x01" if obj else b"B\x00")
    elif isinstance(obj, enum.Enum):  # before int/str: IntEnum and StrEnum are ints and strs
        _frame_bytes(h, b"M", f"{type(obj).__module__}.{type(obj).__qualname__}".encode())
        _update(h, obj.value)
    elif isinstance(obj, int):
        _frame_bytes(h, b"I", obj.to_bytes((obj.bit_length() + 8) // 8, "big", signed=True))
    elif isinstance(obj, float):
        h.update(b"F" + struct.pack(">d", obj))
    elif isinstance(obj, complex):
        h.update(b"C" + struct.pack(">dd", obj.real, obj.imag))
    elif isinstance(obj, str):
        _frame_bytes(h, b"U", obj.encode("utf-8", "surrogatepass"))
    elif isinstance(obj, bytes | bytearray | memoryview):
        _frame_bytes(h, b"Y", bytes(obj))
    elif hasattr(obj, "state_dict") and callable(obj.state_dict):
        h.update(b"S")
        _update(h, obj.state_dict())
    elif isinstance(obj, Mapping):
        entries = sorted(((_sub_digest(k), v) for k, v in obj.items()), key=lambda kv: kv[0])
        _frame_count(h, b"D", len(entries))
        for key_digest, value in entries:
            h.update(key_digest)
            _update(h, value)
    elif isinstance(obj, list | tuple):
        _frame_count(h, b"L" if isinstance(obj, list) else b"T", len(obj))
        for item in obj:
            _update(h, item)
    elif isinstance(obj, set | frozenset):
        _frame_count(h, b"E", len(obj))
        for item_digest in sorted(_sub_digest(item) for item in obj):
            h.update(item_digest)
    elif isinstance(obj, random.Random):
        h.update(b"R")
        _update(h, obj.getstate())
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        _frame_bytes(h, b"K", f"{type(obj).__module__}.{type(obj).__qualname__}".encode())
        _update(h, {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)})
    else:
        _update_foreign(h, obj, torch, np)


def _update_foreign(h: _Hash, obj: Any, torch: Any, np: Any) -> None:  # Any: modules imported lazily
    if torch is not None and isinstance(obj, torch.dtype | torch.device):
        _frame_bytes(h, b"Q", str(obj).encode())
    elif torch is not None and isinstance(obj, torch.Generator):
        h.update(b"G")
        _update(h, obj.get_state())
    elif np is not None and isinstance(obj, np.dtype):
        _frame_bytes(h, b"Q", str(obj).encode())
    elif np is not None and isinstance(obj, np.random.Generator):
        h.update(b"G")
        _update(h, obj.bit_generator.state)
    elif np is not None and isinstance(obj, np.random.RandomState):
        h.update(b"G")
        _update(h, obj.get_state(legacy=False))
    else:
        raise TypeError(
            f"state_digest cannot hash a {type(obj).__module__}.{type(obj).__qualname__} exactly; pass its "
            "state instead (its state_dict(), a dict of its fields, or its arrays and scalars)")


def _update_array(h: _Hash, a: Any, np: Any) -> None:  # Any: a numpy array
    _frame_bytes(h, b"A", _dtype_name(a.dtype).encode())
    _frame_count(h, b"d", a.ndim)
    for n in a.shape:
        h.update(n.to_bytes(8, "big"))
    if a.dtype.hasobject:
        for item in a.reshape(-1, order="C"):  # element by element, in C order
            _update(h, item)
        return
    if a.dtype.byteorder == ">" or (a.dtype.byteorder == "=" and sys.byteorder == "big"):
        a = a.astype(a.dtype.newbyteorder("<"))
    _frame_bytes(h, b"b", memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8)))  # no copy when C-ordered


def _dtype_name(dtype: Any) -> str:  # Any: numpy dtype
    if dtype.fields is not None:
        return "struct" + repr([(name, _dtype_name(dtype.fields[name][0])) for name in dtype.names])
    name: str = dtype.newbyteorder("<").str if dtype.byteorder != "|" else dtype.str
    return name


def _update_tensor(h: _Hash, t: Any, torch: Any) -> None:  # Any: torch imported lazily
    if t.is_meta:
        raise ValueError(
            f"state_digest cannot hash a meta tensor (shape {tuple(t.shape)}, dtype {t.dtype}): it has no data; "
            "digest the state after it is materialised (to_empty() / load_state_dict())")
    t = t.detach()
    _frame_bytes(h, b"P", f"{t.dtype}/{t.layout}".encode())
    _frame_count(h, b"d", t.dim())
    for n in t.shape:
        h.update(int(n).to_bytes(8, "big"))
    if t.layout == torch.sparse_coo:
        t = t.coalesce()
        h.update(b"s")
        _update_tensor(h, t.indices(), torch)
        _update_tensor(h, t.values(), torch)
        return
    if t.layout != torch.strided:  # CSR, CSC, BSR, BSC: their dense values
        t = t.to_dense()
    if t.is_quantized:
        h.update(b"q")
        if t.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric):
            _update(h, (float(t.q_scale()), int(t.q_zero_point())))
        else:
            _update(h, (t.q_per_channel_scales(), t.q_per_channel_zero_points(), int(t.q_per_channel_axis())))
        t = t.int_repr()
    t = t.resolve_conj().resolve_neg().cpu().contiguous()
    flat = t.reshape(-1)
    data = flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8)
    _frame_bytes(h, b"b", memoryview(data.numpy()))  # no copy: sha256 reads the tensor's memory
