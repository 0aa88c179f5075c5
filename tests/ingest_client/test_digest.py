"""tracker.digest(step, value) and state_digest(): a cheap hot-path call, and a hash that sees every tensor."""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import random
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import ingest_client as goodput
from ingest_client.transport import InMemoryTransport
from tests.ingest_client.wire import validate_event


def test_digest_is_sent_as_a_digest_event_of_the_step(make_tracker: Any) -> None:
    transport = InMemoryTransport()
    tracker = make_tracker(transport=transport)
    tracker.resumed(0)
    with tracker.step(1) as s:
        s.loss = 0.5
    tracker.digest(1, "0123abcd")
    assert tracker.flush(5.0)
    (digest,) = transport.of_kind("digest")
    assert (digest["step"], digest["value"], digest["attempt"], digest["rank"]) == (1, "0123abcd", 0, 0)
    assert all(validate_event(e) is None for e in transport.events)


@pytest.mark.parametrize("value", ["", "x" * 129, "tab\there", None, 42])
def test_an_invalid_digest_is_dropped_on_the_flusher_and_the_rest_of_the_batch_goes_through(
    make_tracker: Any, value: Any
) -> None:
    transport = InMemoryTransport()
    tracker = make_tracker(transport=transport)
    tracker.digest(3, value)
    tracker.digest(4, "f" * 128)
    assert tracker.flush(5.0)
    assert [(d["step"], d["value"]) for d in transport.of_kind("digest")] == [(4, "f" * 128)]
    assert all(validate_event(e) is None for e in transport.events)


def test_state_digest_of_plain_state_is_stable_and_sees_every_value() -> None:
    state = {"step": 3, "names": ["a", "b"], "lr": 1e-3}
    assert goodput.state_digest(state) == goodput.state_digest({"lr": 1e-3, "names": ["a", "b"], "step": 3})
    assert goodput.state_digest(state) != goodput.state_digest({**state, "step": 4})
    assert len(goodput.state_digest(state)) == 32 and len(goodput.state_digest(state, length=8)) == 8
    with pytest.raises(ValueError, match="length must be between 1 and 64"):
        goodput.state_digest(state, length=65)


def test_state_digest_of_a_module_and_optimizer_changes_with_an_optimizer_step() -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    before = goodput.state_digest(model, optimizer)
    twin = torch.nn.Linear(4, 2)
    twin.load_state_dict(model.state_dict())
    assert goodput.state_digest(twin, torch.optim.Adam(twin.parameters(), lr=0.1)) == before
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    after = goodput.state_digest(model, optimizer)
    assert after != before
    assert goodput.state_digest(model) != after, "the optimizer's moments are part of the digest"
    assert goodput.state_digest(torch.zeros(2, dtype=torch.float32)) != goodput.state_digest(
        torch.zeros(2, dtype=torch.float64)), "dtype counts"
    assert goodput.state_digest(torch.zeros(2, dtype=torch.bfloat16))  # dtypes numpy lacks are hashed too


# -- exactness: every bit of every value counts, and nothing else does ---------------------------------------

np = pytest.importorskip("numpy")
digest = goodput.state_digest


def _nudge(value: float) -> float:
    """The next float up: one ulp."""
    return math.nextafter(value, math.inf)


@st.composite
def _array_and_index(draw: st.DrawFn) -> tuple[Any, tuple[int, ...]]:
    dtype = draw(st.sampled_from([np.float64, np.float32, np.float16]))
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=40))
    array = draw(hnp.arrays(dtype, shape, elements=st.floats(-1e4, 1e4, width=np.dtype(dtype).itemsize * 8)))
    index = tuple(draw(st.integers(0, n - 1)) for n in shape)
    return array, index


@settings(max_examples=150, deadline=None)
@given(_array_and_index())
def test_changing_one_array_element_by_one_ulp_changes_the_digest(case: tuple[Any, tuple[int, ...]]) -> None:
    array, index = case
    twin = array.copy()
    assert digest(twin) == digest(array) == digest(np.asfortranarray(array)), "equal arrays digest equal"
    twin[index] = np.nextafter(array[index], np.array(np.inf, dtype=array.dtype))
    assert digest(twin) != digest(array)


@settings(max_examples=100, deadline=None)
@given(_array_and_index(), st.sampled_from(["float32", "float64", "bfloat16", "float16"]))
def test_changing_one_tensor_element_by_one_ulp_changes_the_digest(case: tuple[Any, tuple[int, ...]],
                                                                 dtype: str) -> None:
    torch = pytest.importorskip("torch")
    tensor = torch.from_numpy(case[0].astype(np.float64)).to(getattr(torch, dtype))
    twin = tensor.clone()
    assert digest(twin) == digest(tensor)
    twin[case[1]] = torch.nextafter(tensor[case[1]].float(), torch.tensor(float("inf"))).to(tensor.dtype) \
        if dtype == "bfloat16" else torch.nextafter(tensor[case[1]], torch.tensor(float("inf"), dtype=tensor.dtype))
    if bool((twin == tensor).all()):  # bfloat16: the float32 neighbour rounds back; flip the low bit instead
        bits = twin.view(torch.int16)
        bits[case[1]] ^= 1
    assert digest(twin) != digest(tensor)


_leaves = st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(-(2**70), 2**70),
                    st.text(max_size=5), st.booleans(), st.none())
_structures = st.recursive(_leaves, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.tuples(inner, inner), st.dictionaries(st.text(max_size=3), inner, max_size=4)),
    max_leaves=20)


def _float_paths(obj: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(obj, float):
        return [path]
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in _float_paths(v, (*path, k))]
    if isinstance(obj, list | tuple):
        return [p for i, v in enumerate(obj) for p in _float_paths(v, (*path, i))]
    return []


def _replaced(obj: Any, path: tuple[Any, ...], value: float) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(obj, dict):
        return {**obj, head: _replaced(obj[head], rest, value)}
    items = list(obj)
    items[head] = _replaced(items[head], rest, value)
    return items if isinstance(obj, list) else tuple(items)


@settings(max_examples=200, deadline=None)
@given(_structures.filter(lambda s: bool(_float_paths(s))), st.data())
def test_changing_one_float_of_a_nested_structure_by_one_ulp_changes_the_digest(structure: Any,
                                                                                data: st.DataObject) -> None:
    assert digest(copy.deepcopy(structure)) == digest(structure)
    path = data.draw(st.sampled_from(_float_paths(structure)))
    value = functools.reduce(lambda o, k: o[k], path, structure)
    assert digest(_replaced(structure, path, _nudge(value))) != digest(structure)


def test_numpy_arrays_that_repr_elides_or_rounds_digest_apart() -> None:
    a = np.zeros(2_000)
    b = a.copy()
    b[1_000] = 1.0
    assert repr(a) == repr(b) and digest(a) != digest(b)
    c = np.full(3, 0.1)
    assert digest(c) != digest(c + 1e-12)


def test_arrays_digest_by_dtype_shape_and_values_not_by_memory_layout() -> None:
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    assert digest(a) == digest(a.copy(order="F")) == digest(a.astype(">i4"))  # layout and byte order: no
    assert digest(a) != digest(a.astype(np.int64))  # dtype: yes
    assert digest(a) != digest(a.reshape(4, 3)) != digest(a.reshape(-1))  # shape: yes
    assert digest(a.T) == digest(np.ascontiguousarray(a.T))
    assert digest(np.float64(1.5)) == digest(np.array(1.5)) != digest(1.5)  # a NumPy scalar is a 0-d array
    assert digest(np.array([1, "a", None], dtype=object)) != digest(np.array([1, "b", None], dtype=object))
    assert digest(np.array([0.5], dtype=object)) != digest(np.array([_nudge(0.5)], dtype=object))
    rec = np.zeros(2, dtype=[("x", "<f8"), ("n", "<i4")])
    twin = rec.copy()
    twin["n"][1] = 1
    assert digest(rec) != digest(twin)


def test_python_scalars_digest_by_their_exact_bits_and_type() -> None:
    nan = float("nan")
    other_nan = struct.unpack(">d", bytes.fromhex("7ff8000000000001"))[0]
    assert digest(0.0) != digest(-0.0)
    assert digest(nan) == digest(float("nan")) and digest(nan) != digest(other_nan)  # NaN payloads count
    assert digest(True) != digest(1) != digest(1.0)
    assert digest(2**200) != digest(2**200 + 1) and digest(-1) != digest(255)
    assert digest(1 + 2j) != digest(1 - 2j)
    assert digest("a") != digest(b"a") and digest(None) != digest("") != digest(b"")


def test_framing_keeps_different_structures_apart() -> None:
    pairs = [(["ab"], ["a", "b"]), ([[1], [2]], [[1, 2]]), ({"a": 1}, [("a", 1)]), ([1, 2], (1, 2)),
             ([], [[]]), ("", []), ({"a": "b"}, {"ab": ""}), ((["a"], "b"), (["a", "b"],))]
    for x, y in pairs:
        assert digest(x) != digest(y), (x, y)
    assert digest("a", "b") != digest("ab") != digest(("a", "b"))


def test_mappings_and_sets_do_not_depend_on_order() -> None:
    assert digest({"b": 1, "a": 2}) == digest({"a": 2, "b": 1})
    assert digest({3, 1, 2}) == digest({2, 3, 1}) == digest(frozenset({1, 2, 3}))
    assert digest({1, 2}) != digest({1, 3}) and digest({1: "a"}) != digest({1: "b"})
    assert digest({1: 0}) != digest({1.0: 0}) != digest({True: 0})  # equal keys of different types differ


def test_tensors_of_every_kind_digest_exactly() -> None:
    torch = pytest.importorskip("torch")
    x = torch.arange(20, dtype=torch.float32).reshape(4, 5)
    assert digest(x.t()) == digest(x.t().contiguous()) != digest(x)  # a view: its values, in its shape
    assert digest(torch.nn.Parameter(x)) == digest(x)  # a Parameter is its tensor
    assert digest(x) != digest(x.numpy()), "a tensor and an array are different types"
    for dtype in (torch.bool, torch.bfloat16, torch.complex64, torch.float16, torch.int8, torch.uint8):
        a = torch.zeros(6, dtype=dtype)
        b = a.clone()
        b[5] = 1
        assert digest(a) != digest(b) and digest(a) != digest(a.reshape(2, 3)), dtype
    assert digest(torch.zeros(2, dtype=torch.float32)) != digest(torch.zeros(2, dtype=torch.int32))
    z = torch.tensor([1 + 2j, 3 - 1j])
    assert digest(z.conj()) == digest(z.conj().resolve_conj()) != digest(z)
    coo = torch.sparse_coo_tensor(torch.tensor([[0, 0, 1], [1, 1, 0]]), torch.tensor([1.0, 2.0, 4.0]), (2, 2))
    assert digest(coo) == digest(coo.coalesce()) != digest(coo.to_dense())  # uncoalesced: same values
    csr = x.to_sparse_csr()
    y = x.clone()
    y[0, 1] = torch.nextafter(y[0, 1], torch.tensor(2.0))
    assert digest(csr) != digest(x) and digest(csr) != digest(y.to_sparse_csr())
    assert digest(torch.zeros(0, 3)) != digest(torch.zeros(3, 0))
    with pytest.raises(ValueError, match=r"meta tensor .* has no data"):
        digest({"w": torch.empty(3, device="meta")})


def test_rng_states_and_plain_objects_are_digested_by_their_state() -> None:
    torch = pytest.importorskip("torch")
    g = np.random.default_rng(1)
    before = digest(g)
    g.random()
    assert digest(g) != before and digest(np.random.default_rng(1)) == before
    assert digest(torch.Generator().manual_seed(1)) != digest(torch.Generator().manual_seed(2))
    r = random.Random(1)
    assert digest(r) == digest(random.Random(1)) and digest(r.getstate()) != digest(random.Random(2).getstate())

    @dataclasses.dataclass
    class Position:
        epoch: int
        index: int

    assert digest(Position(1, 2)) != digest(Position(1, 3))
    with pytest.raises(TypeError, match=r"cannot hash a builtins\.object exactly; pass its state"):
        digest({"x": object()})


def test_digest_module_imports_only_the_standard_library() -> None:
    code = ("import sys, ingest_client.worker.digest as d; d.state_digest({'a': [1, 2.0]}); "
            "assert 'numpy' not in sys.modules and 'torch' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])
