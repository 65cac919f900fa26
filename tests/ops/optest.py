"""Machinery to check one op against PyTorch eager on both executors.

Typical use in an op test::

    from optest import check_op, expect_error, rand

    def test_add_broadcast():
        x, y = rand((2, 3), "f32"), rand((3,), "f32")
        check_op("add", [x, y], {}, lambda a, b: a + b)

    def test_add_rejects_bool():
        expect_error("add", [("bool", (2,)), ("bool", (2,))], {}, "not defined on bool")

``check_op`` builds a one-node graph with ``partita.Builder`` (so the op's type rule runs),
verifies it, checks that it prints and parses back to the same text, runs it with the NumPy
reference interpreter and with the torch executor, and compares both results with what
``torch_fn`` returns on the same inputs: same shape, same dtype, values within tolerance.
It also checks that the type rule agrees with torch on shape and dtype, that neither
executor wrote into its inputs, and that the op's cost is well formed.

Inputs are drawn by ``rand``; a fixture in ``conftest.py`` reseeds its generator from each
test's id, so every test sees the same data whatever order tests run in.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import ml_dtypes
import numpy as np
import pytest
import torch

import partita
from partita.backend.torch_exec import to_tensor
from partita.ir import Builder, Graph, PartitaError, TensorType, parse, print_graph, verify
from partita.ir.dtypes import DTYPES, DType, from_numpy
from partita.ops.registry import Cost, get_op

__all__ = ["check_op", "expect_error", "build", "infer", "rand", "reseed", "tolerance", "FLOAT", "LOW", "INT", "BF16"]

# Handy dtype groups for parametrizing.
FLOAT = ("f32", "f64")
LOW = ("f16", "bf16")
INT = ("i32", "i64")

_rng = np.random.default_rng(0)

# (rtol, atol) per result dtype: a few ulps of the dtype, since the reference and torch may
# accumulate in a different order.
_TOLERANCE = {
    "f64": (1e-9, 1e-12),
    "f32": (2e-5, 1e-5),
    "f16": (4e-3, 2e-3),
    "bf16": (3e-2, 2e-2),
}


def reseed(seed: int) -> None:
    """Reset the generator behind ``rand`` (the conftest fixture does this per test)."""
    global _rng
    _rng = np.random.default_rng(seed)


def _dtype(dt: str | DType) -> DType:
    return DTYPES[dt] if isinstance(dt, str) else dt


def rand(shape: Sequence[int], dtype: str | DType = "f32", low: float = -3.0, high: float = 3.0) -> np.ndarray:
    """A random array of a partita dtype: floats uniform in [low, high), integers in
    [low, high] (unsigned clipped at 0), bools fair coins. bf16 arrays use ml_dtypes."""
    dt = _dtype(dtype)
    shape = tuple(shape)
    if dt.is_bool:
        return _rng.random(shape) < 0.5
    if dt.is_int:
        lo = max(int(np.floor(low)), 0) if dt.kind == "uint" else int(np.floor(low))
        return _rng.integers(lo, int(np.ceil(high)) + 1, size=shape).astype(dt.np)
    return _rng.uniform(low, high, size=shape).astype(np.float64).astype(dt.np)


def tolerance(dtype: str | DType) -> tuple[float, float]:
    """Default (rtol, atol) for comparing results of ``dtype``; exact for ints and bool."""
    return _TOLERANCE.get(_dtype(dtype).name, (0.0, 0.0))


def _type_of(a: np.ndarray) -> TensorType:
    return TensorType(tuple(a.shape), from_numpy(a.dtype))


def build(op: str, operand_types: Sequence[TensorType], attrs: dict | None = None) -> Graph:
    """A graph with one input per operand type and a single ``op`` node whose results are the
    graph's outputs. Raises whatever the op's attribute normalization or type rule raises."""
    g = Graph(f"check_{op}")
    b = Builder(g)
    xs = [b.input(f"x{i}", t) for i, t in enumerate(operand_types)]
    out = b.emit(op, *xs, **(attrs or {}))
    b.ret(*(out if isinstance(out, tuple) else (out,)))
    return g


def infer(op: str, operand_types: Sequence[tuple[str, Sequence[int]] | TensorType],
          attrs: dict | None = None) -> tuple[TensorType, ...]:
    """The result types the op's type rule gives, by building a one-node graph.

    Operand types are TensorTypes or ``(dtype_name, shape)`` pairs."""
    g = build(op, [_as_type(t) for t in operand_types], attrs)
    return tuple(v.type for v in g.outputs)


def _as_type(t) -> TensorType:
    if isinstance(t, TensorType):
        return t
    dt, shape = t
    return TensorType(tuple(shape), _dtype(dt))


def expect_error(op: str, operand_types: Sequence[tuple[str, Sequence[int]] | TensorType],
                 attrs: dict | None, *fragments: str, error: type[Exception] = PartitaError) -> str:
    """Assert that building ``op`` on these operand types and attrs raises ``error`` (a
    PartitaError by default) whose message contains every fragment (case-sensitive plain
    text). Returns the message so a test can check more."""
    with pytest.raises(error) as info:
        build(op, [_as_type(t) for t in operand_types], attrs)
    msg = str(info.value)
    missing = [f for f in fragments if f not in msg]
    assert not missing, f"error message lacks {missing!r}:\n{msg}"
    assert op in msg, f"error message does not name the op '{op}':\n{msg}"
    return msg


def _torch_inputs(arrays: Sequence[np.ndarray]) -> list[torch.Tensor]:
    return [to_tensor(np.array(a, copy=True)) for a in arrays]


def _compare(actual: torch.Tensor, expected: torch.Tensor, rtol: float | None, atol: float | None,
             what: str) -> None:
    assert tuple(actual.shape) == tuple(expected.shape), \
        f"{what}: shape {list(actual.shape)}, torch eager gives {list(expected.shape)}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype}, torch eager gives {expected.dtype}"
    d_rtol, d_atol = _TOLERANCE.get(_name_of(expected.dtype), (0.0, 0.0))
    rtol = d_rtol if rtol is None else rtol
    atol = d_atol if atol is None else atol
    try:
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True)
    except AssertionError as e:
        raise AssertionError(f"{what}: values differ from torch eager\n{e}") from None


def _name_of(tdt: torch.dtype) -> str:
    from partita.ops._lazy import from_torch_dtype

    return from_torch_dtype(tdt).name


def check_op(op: str, operands: Sequence[np.ndarray], attrs: dict | None = None,
             torch_fn: Callable[..., Any] | None = None, *, rtol: float | None = None,
             atol: float | None = None, roundtrip: bool = True) -> list[np.ndarray]:
    """Check one op case on both executors against torch eager.

    op: the op name; operands: NumPy arrays (use ``rand``; bf16 via ml_dtypes), one graph
    input each; attrs: the op's attributes as Builder kwargs; torch_fn: called with the
    operands as torch tensors (``torch_fn(*tensors)``), returns a tensor, a Python scalar
    or a tuple/list of tensors (one per result). rtol/atol override the per-dtype defaults
    of ``tolerance``. roundtrip: also print the graph and parse it back.

    Checks, in order: the one-node graph builds and verifies; print -> parse -> print is
    stable; the inferred result types equal torch's shapes and dtypes; the NumPy and torch
    executors each match torch eager within tolerance; inputs are left unmodified; the
    cost has non-negative fields. Returns the NumPy executor's results.
    """
    arrays = [np.asarray(a) for a in operands]
    g = build(op, [_type_of(a) for a in arrays], attrs)
    verify(g)
    if roundtrip:
        text = print_graph(g)
        again = print_graph(verify(parse(text, f"<{op}>")))
        assert again == text, f"{op}: print -> parse -> print changed the text:\n{text}\n---\n{again}"

    node = g.first
    assert node is not None and node.op == op
    cost = get_op(op).cost_of([v.type for v in node.operands], [r.type for r in node.results], node.attrs)
    assert isinstance(cost, Cost) and min(cost.flops, cost.bytes_read, cost.bytes_written) >= 0, \
        f"{op}: malformed cost {cost}"

    if torch_fn is None:
        raise TypeError("check_op needs torch_fn, the torch eager expression to compare with")
    expected = torch_fn(*_torch_inputs(arrays))
    if not isinstance(expected, (tuple, list)):
        expected = (expected,)
    expected = [e if isinstance(e, torch.Tensor) else torch.tensor(e) for e in expected]
    assert len(expected) == len(g.outputs), \
        f"{op}: the graph has {len(g.outputs)} result(s), torch_fn returned {len(expected)}"
    for i, (v, e) in enumerate(zip(g.outputs, expected)):
        inferred = v.type
        assert inferred.shape == tuple(e.shape), \
            f"{op}: type rule gives result {i} shape {list(inferred.shape)}, torch eager gives {list(e.shape)}"
        assert inferred.dtype.name == _name_of(e.dtype), \
            f"{op}: type rule gives result {i} dtype {inferred.dtype}, torch eager gives {e.dtype}"

    before = [a.copy() for a in arrays]
    np_out = partita.run(g, list(arrays), backend="numpy")
    for i, (a, e) in enumerate(zip(np_out, expected)):
        _compare(to_tensor(np.array(a, copy=True)), e, rtol, atol, f"{op} (numpy executor) result {i}")

    th_out = partita.run(g, list(arrays), backend="torch")
    for i, (a, e) in enumerate(zip(th_out, expected)):
        _compare(a, e, rtol, atol, f"{op} (torch executor) result {i}")

    for i, (a, b) in enumerate(zip(arrays, before)):
        assert np.array_equal(a, b, equal_nan=True), f"{op}: an executor modified operand {i} in place"
    return np_out


# Keep the bf16 NumPy dtype at hand for tests that build arrays by hand.
BF16 = np.dtype(ml_dtypes.bfloat16)
