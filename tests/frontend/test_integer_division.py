"""Integer division and remainders are exact for every integer dtype, on both executors and
through the torch.export and ONNX importers, and a zero divisor raises as eager PyTorch does
(docs/ir.md, "Integer division and remainders")."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import partita
from partita.ir import Builder
from partita.ir.diagnostics import ExecutionError, IntegerDivisionByZeroError, PartitaError
from partita.ir.dtypes import parse_dtype
from partita.ir.types import TensorType

INT_DTYPES = ["i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64"]
# dtype -> (operands, attrs) of the op forms: int_div floor / trunc, remainder, fmod
FORMS = {"floor": ("int_div", {"rounding": "floor"}), "trunc": ("int_div", {"rounding": "trunc"}),
         "remainder": ("remainder", {}), "fmod": ("fmod", {})}


def _exact(form: str, a: int, b: int) -> int:
    """The mathematically exact result (Python integers), before wrapping into the dtype."""
    floor = a // b
    trunc = abs(a) // abs(b) * (-1 if (a < 0) != (b < 0) else 1)
    return {"floor": floor, "trunc": trunc, "remainder": a - b * floor, "fmod": a - b * trunc}[form]


def _wrap(v: int, np_dtype: np.dtype) -> int:
    info = np.iinfo(np_dtype)
    span = 1 << info.bits
    return (v - info.min) % span + info.min


def _edge_values(np_dtype: np.dtype) -> tuple[list[int], list[int]]:
    info = np.iinfo(np_dtype)
    big = [10**18 + 7, 2**53 + 1, 2**62 - 1] if info.bits == 64 else []
    if info.min < 0:
        nums = [info.min, info.min + 1, -(10**18 + 7) if info.bits == 64 else -100, -7, -1, 0, 1, 7, info.max - 1,
                info.max] + big
        dens = [info.min, -3, -1, 1, 2, 3, 7, info.max]
    else:
        nums = [0, 1, 7, 100, info.max - 1, info.max] + big
        dens = [1, 2, 3, 7, info.max - 1, info.max]
    return nums, dens


def _one_node(op: str, dtype: str, shapes: tuple, attrs: dict) -> partita.Graph:
    g = partita.Graph("g")
    b = Builder(g)
    x = b.input("x", TensorType(shapes[0], parse_dtype(dtype)))
    y = b.input("y", TensorType(shapes[1], parse_dtype(dtype)))
    b.ret(b.emit(op, x, y, name="q", **attrs))
    return partita.verify(g)


def _as_numpy(t) -> np.ndarray:
    return t.numpy() if isinstance(t, torch.Tensor) else np.asarray(t)


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_edge_values_are_exact_on_both_executors(form, dtype):
    op, attrs = FORMS[form]
    np_dtype = parse_dtype(dtype).np
    nums, dens = _edge_values(np_dtype)
    a = np.array(nums, dtype=np_dtype).reshape(-1, 1)
    b = np.array(dens, dtype=np_dtype)
    want = np.array([[_wrap(_exact(form, int(x), int(y)), np_dtype) for y in dens] for x in nums], dtype=np_dtype)
    g = _one_node(op, dtype, (a.shape, b.shape), attrs)
    for backend in ("numpy", "torch"):
        got = _as_numpy(partita.run(g, [a, b], backend=backend)[0])
        assert got.dtype == np_dtype, backend
        assert got.tolist() == want.tolist(), f"{backend}: {form} on {dtype}"


EAGER = {"floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
         "trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
         "remainder": torch.remainder, "fmod": torch.fmod}


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("dtype", ["i8", "i16", "i32", "i64", "u8"])
def test_edge_values_match_eager(form, dtype):
    op, attrs = FORMS[form]
    np_dtype = parse_dtype(dtype).np
    nums, dens = _edge_values(np_dtype)
    if form == "trunc" and dtype in ("i32", "i64"):
        # Eager's truncating INT_MIN / -1 traps (SIGFPE) on these dtypes; it is checked
        # against the wrapped exact value in the test above.
        dens = [d for d in dens if d != -1]
    a = np.array(nums, dtype=np_dtype).reshape(-1, 1)
    b = np.array(dens, dtype=np_dtype)
    want = EAGER[form](torch.from_numpy(a), torch.from_numpy(b)).numpy()
    g = _one_node(op, dtype, (a.shape, b.shape), attrs)
    for backend in ("numpy", "torch"):
        got = _as_numpy(partita.run(g, [a, b], backend=backend)[0])
        assert got.dtype == want.dtype and got.tolist() == want.tolist(), f"{backend}: {form} on {dtype}"


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("dtype", ["i8", "u8", "i32", "i64", "u16", "u32", "u64"])
def test_a_zero_divisor_raises_naming_the_node(form, dtype):
    op, attrs = FORMS[form]
    np_dtype = parse_dtype(dtype).np
    a = np.array([5, 6, 7], np_dtype)
    b = np.array([1, 0, 2], np_dtype)
    g = _one_node(op, dtype, (a.shape, b.shape), attrs)
    for backend in ("numpy", "torch"):
        with pytest.raises(IntegerDivisionByZeroError) as e:
            partita.run(g, [a, b], backend=backend)
        assert isinstance(e.value, ExecutionError) and isinstance(e.value, PartitaError)
        assert str(e.value).startswith(f"%q = {op}: ") and "division by zero" in str(e.value), str(e.value)


def test_an_empty_result_raises_nothing_and_floats_are_unchanged():
    g = _one_node("int_div", "i32", ((0,), (1,)), {"rounding": "floor"})
    for backend in ("numpy", "torch"):
        assert _as_numpy(partita.run(g, [np.zeros(0, np.int32), np.zeros(1, np.int32)], backend=backend)[0]).shape == (0,)
    # A float remainder by 0 is NaN, as before (and as eager).
    g = _one_node("remainder", "f32", ((2,), (2,)), {})
    for backend in ("numpy", "torch"):
        out = _as_numpy(partita.run(g, [np.array([1.0, 2.0], np.float32), np.array([0.0, 1.0], np.float32)],
                                    backend=backend)[0])
        assert np.isnan(out[0]) and out[1] == 0.0


def test_int_div_refuses_floats_and_bools():
    from partita.ir import TypeRuleError

    for dt in ("f32", "bool"):
        with pytest.raises(TypeRuleError, match="int_div"):
            _one_node("int_div", dt, ((2,), (2,)), {"rounding": "floor"})


def test_the_compiled_program_runs_int_div_exactly_and_raises_on_zero():
    from partita.codegen import CompiledProgram

    g = partita.Graph("g")
    b = Builder(g)
    x = b.input("x", TensorType((4,), parse_dtype("i64")))
    y = b.input("y", TensorType((4,), parse_dtype("i64")))
    q = b.emit("int_div", b.emit("add", x, x), y, rounding="floor")
    b.ret(b.emit("mul", b.emit("add", q, q), q))
    partita.verify(g)
    prog = CompiledProgram(g, min_ops=1)
    a = torch.tensor([10**17 + 7, -7, 2**52 + 3, 0])
    d = torch.tensor([3, 2, -5, 9])
    q_want = (a + a) // d
    assert prog([a, d])[0].tolist() == ((q_want + q_want) * q_want).tolist()
    with pytest.raises(IntegerDivisionByZeroError, match="int_div"):
        prog([a, torch.tensor([3, 0, 1, 1])])


# --- torch.export importer ------------------------------------------------------------------

class Fn(torch.nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


TORCH_FORMS = [
    ("floordiv", lambda a, b: a // b),
    ("trunc", lambda a, b: torch.div(a, b, rounding_mode="trunc")),
    ("floor", lambda a, b: torch.div(a, b, rounding_mode="floor")),
    ("floordiv_scalar", lambda a, b: a // 3 + b),
    ("remainder", lambda a, b: a % b),
    ("fmod", lambda a, b: torch.fmod(a, b)),
]


@pytest.mark.parametrize("name, fn", TORCH_FORMS, ids=[f[0] for f in TORCH_FORMS])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8])
def test_import_torch_integer_division_is_exact(name, fn, dtype):
    info = torch.iinfo(dtype)
    big = [10**18 + 7, -(10**18 + 7)] if dtype == torch.int64 else [info.max, info.min + 1]
    a = torch.tensor([*big, -7, 7, -7, 7, info.min], dtype=dtype)
    b = torch.tensor([3, 3, 2, -2, -2, 2, 7], dtype=dtype)
    g = partita.import_torch(Fn(fn), (a, b))
    partita.verify(g)
    assert not any(n.op == "cast" and n.attrs["dtype"].is_float for n in g.nodes), partita.print_graph(g)
    want = fn(a, b)
    for backend in ("numpy", "torch"):
        got = partita.run(g, [a, b], backend=backend)[0]
        got = torch.as_tensor(np.asarray(got)) if not isinstance(got, torch.Tensor) else got
        assert got.dtype == want.dtype and got.tolist() == want.tolist(), backend


TENSOR_DIVISORS = [f for f in TORCH_FORMS if f[0] != "floordiv_scalar"]


@pytest.mark.parametrize("name, fn", TENSOR_DIVISORS, ids=[f[0] for f in TENSOR_DIVISORS])
def test_import_torch_zero_divisor_raises(name, fn):
    a = torch.tensor([5, 6, 7])
    b = torch.tensor([1, 2, 3])
    g = partita.import_torch(Fn(fn), (a, b))
    z = torch.tensor([1, 0, 3])
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        fn(a, z)
    for backend in ("numpy", "torch"):
        with pytest.raises(IntegerDivisionByZeroError):
            partita.run(g, [a, z], backend=backend)


def test_min_over_minus_one_wraps_as_eager_floor_division():
    a = torch.tensor([torch.iinfo(torch.int64).min, 9])
    b = torch.tensor([-1, -1])
    g = partita.import_torch(Fn(lambda a, b: a // b), (a, b))
    want = a // b
    assert want.tolist() == [torch.iinfo(torch.int64).min, -9]
    for backend in ("numpy", "torch"):
        assert np.asarray(partita.run(g, [a, b], backend=backend)[0]).tolist() == want.tolist()


# --- ONNX importer --------------------------------------------------------------------------

def _onnx_one_node(op: str, ins: dict[str, np.ndarray], **attrs):
    helper = pytest.importorskip("onnx.helper")

    node = helper.make_node(op, list(ins), ["y"], name="n", **attrs)
    vis = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for k, a in ins.items()]
    graph = helper.make_graph([node], "m", vis, [helper.make_empty_tensor_value_info("y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("dtype", [np.int64, np.uint64, np.int32, np.uint32, np.int8])
def test_onnx_integer_div_truncates_exactly(dtype):
    from partita.frontend.onnx import import_onnx

    info = np.iinfo(dtype)
    nums = [info.max, info.max - 1, 7, 100] + ([-7, info.min + 1, -(10**18 + 7)] if info.min < 0 else [])
    if info.bits < 64:
        nums = [n for n in nums if info.min <= n <= info.max]
    dens = [3, 7, 2, 9] + ([-2, 3, 3] if info.min < 0 else [])
    a, b = np.array(nums, dtype), np.array(dens[:len(nums)], dtype)
    want = [_exact("trunc", int(x), int(y)) for x, y in zip(nums, dens)]
    g = import_onnx(_onnx_one_node("Div", {"a": a, "b": b}))
    for backend in ("numpy", "torch"):
        got = np.asarray(partita.run(g, [a, b], backend=backend)[0])
        assert got.dtype == dtype and got.tolist() == want, backend


@pytest.mark.parametrize("op, attrs", [("Div", {}), ("Mod", {"fmod": 0}), ("Mod", {"fmod": 1})])
def test_onnx_integer_zero_divisor_raises(op, attrs):
    from partita.frontend.onnx import import_onnx

    a, b = np.array([5, 6], np.int32), np.array([0, 1], np.int32)
    g = import_onnx(_onnx_one_node(op, {"a": a, "b": b}, **attrs))
    for backend in ("numpy", "torch"):
        with pytest.raises(IntegerDivisionByZeroError):
            partita.run(g, [a, b], backend=backend)
