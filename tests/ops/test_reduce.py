"""Reductions and cumsum against torch eager on both executors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from optest import check_op, expect_error, infer, rand
from partita.ir.diagnostics import AttributeError_, TypeRuleError
from partita.ops import OPS


def _torch_prod(x, dims, keepdim):
    if x.dim() == 0:
        return torch.prod(x, dim=0, keepdim=keepdim)
    for d in sorted((d % x.dim() for d in dims), reverse=True):
        x = torch.prod(x, dim=d, keepdim=keepdim)
    return x


def _all_dims(x, dims):
    return tuple(range(x.dim())) if dims is None else dims


TORCH = {
    "sum": lambda x, d, k: torch.sum(x, dim=d, keepdim=k),
    "mean": lambda x, d, k: torch.mean(x, dim=d, keepdim=k),
    "max": lambda x, d, k: torch.amax(x, dim=_all_dims(x, d), keepdim=k),
    "min": lambda x, d, k: torch.amin(x, dim=_all_dims(x, d), keepdim=k),
    "prod": lambda x, d, k: _torch_prod(x, _all_dims(x, d), k),
}

CASES = [  # shape, axes
    ((3, 4, 5), None), ((3, 4, 5), [1]), ((3, 4, 5), [-1, 0]), ((3, 4, 5), [0, 1, 2]),
    ((2, 1, 3), [1]), ((7,), [0]), ((), None), ((), [0]), ((), [-1]),
]


def _attrs(axes, keepdim):
    a = {"keepdim": keepdim}
    if axes is not None:
        a["axes"] = axes
    return a


@pytest.mark.parametrize("op", sorted(TORCH))
@pytest.mark.parametrize("shape,axes", CASES, ids=str)
@pytest.mark.parametrize("keepdim", [False, True])
def test_reduction_f32(op, shape, axes, keepdim):
    x = rand(shape, "f32", low=0.5, high=1.5) if op == "prod" else rand(shape, "f32")
    check_op(op, [x], _attrs(axes, keepdim), lambda t: TORCH[op](t, axes, keepdim))


@pytest.mark.parametrize("op", sorted(TORCH))
@pytest.mark.parametrize("dtype", ["f64", "i32", "i64", "bool", "u8", "f16", "bf16"])
def test_reduction_dtypes(op, dtype):
    x = rand((4, 6), dtype, low=-2, high=2)
    if op == "mean" and dtype not in ("f64", "f16", "bf16"):
        msg = expect_error("mean", [(dtype, (4, 6))], {}, f"{dtype}[4,6]", "float", "cast", error=TypeRuleError)
        assert "f32" in msg
        return
    rtol = 2e-2 if dtype == "f16" and op == "prod" else None
    check_op(op, [x], _attrs([0], False), lambda t: TORCH[op](t, [0], False), rtol=rtol, atol=rtol)
    check_op(op, [x], {}, lambda t: TORCH[op](t, None, False), rtol=rtol, atol=rtol)


@pytest.mark.parametrize("op", ["sum", "prod", "mean"])
def test_reductions_over_empty_axis_give_identity(op):
    x = rand((0, 3), "f32")
    check_op(op, [x], {"axes": [0]}, lambda t: TORCH[op](t, [0], False))
    check_op(op, [x], {"axes": [1], "keepdim": True}, lambda t: TORCH[op](t, [1], True))


@pytest.mark.parametrize("op", ["max", "min"])
def test_max_min_empty_output_and_nan(op):
    check_op(op, [rand((0, 3), "f32")], {"axes": [1]}, lambda t: TORCH[op](t, [1], False))
    x = np.array([[1.0, np.nan, 3.0], [4.0, 5.0, -1.0]], dtype=np.float32)
    check_op(op, [x], {"axes": [1]}, lambda t: TORCH[op](t, [1], False))


def test_empty_axes_list_reduces_nothing():
    x = rand((2, 3), "i32")
    out = check_op("sum", [x], {"axes": []}, lambda t: t.to(torch.int64))
    assert out[0].shape == (2, 3)
    check_op("max", [x], {"axes": []}, lambda t: t.clone())


def test_sum_precision_large():
    # Pairwise vs vectorized accumulation of 10k f32 values still agrees to a few ulps.
    x = rand((10_000,), "f32", low=0.0, high=1.0)
    check_op("sum", [x], {}, torch.sum, rtol=1e-5)


@pytest.mark.parametrize("op", ["argmax", "argmin"])
@pytest.mark.parametrize("shape,axes", [((3, 4, 5), [1]), ((3, 4, 5), [-1]), ((3, 4, 5), None), ((6,), [0]),
                                        ((), None), ((), [0]), ((2, 0), [0]), ((1, 3), [0])], ids=str)
@pytest.mark.parametrize("keepdim", [False, True])
def test_argmax_argmin(op, shape, axes, keepdim):
    fn = getattr(torch, op)
    dim = None if axes is None else axes[0]
    check_op(op, [rand(shape, "f32")], _attrs(axes, keepdim), lambda t: fn(t, dim=dim, keepdim=keepdim))


@pytest.mark.parametrize("op", ["argmax", "argmin"])
@pytest.mark.parametrize("dtype", ["i32", "i64", "u8", "f64", "f16", "bf16"])
def test_argmax_dtypes_and_ties(op, dtype):
    x = rand((5, 7), dtype, low=-1, high=1)  # few distinct values: many ties, first index wins
    fn = getattr(torch, op)
    check_op(op, [x], {"axes": [1]}, lambda t: fn(t, dim=1))
    check_op(op, [x], {}, lambda t: fn(t))


def test_argmax_nan_is_largest():
    x = np.array([[1.0, np.nan, 3.0, np.nan]], dtype=np.float32)
    out = check_op("argmax", [x], {"axes": [1]}, lambda t: torch.argmax(t, dim=1))
    assert out[0].tolist() == [1]


@pytest.mark.parametrize("shape,axis", [((3, 4), 0), ((3, 4), -1), ((5,), 0), ((), 0), ((), -1), ((0, 2), 1)],
                         ids=str)
@pytest.mark.parametrize("dtype", ["f32", "f64", "i32", "bool", "f16"])
def test_cumsum(shape, axis, dtype):
    check_op("cumsum", [rand(shape, dtype)], {"axis": axis}, lambda t: torch.cumsum(t, dim=axis))


def test_result_dtypes():
    assert infer("sum", [("bool", (3,))])[0].dtype.name == "i64"
    assert infer("prod", [("i8", (3,))])[0].dtype.name == "i64"
    assert infer("sum", [("bf16", (3,))])[0].dtype.name == "bf16"
    assert infer("cumsum", [("u8", (3,))], {"axis": 0})[0].dtype.name == "i64"
    assert infer("max", [("i16", (3, 2))], {"axes": [0], "keepdim": True})[0].shape == (1, 2)
    assert infer("argmin", [("f32", (3, 2))], {"keepdim": True})[0].shape == (1, 1)


def test_cost_counts_input_elements():
    op = OPS["sum"]
    from partita.ir import TensorType, f32

    c = op.cost_of([TensorType((8, 16), f32)], [TensorType((8,), f32)], {"axes": (1,), "keepdim": False})
    assert (c.flops, c.bytes_read, c.bytes_written) == (128, 512, 32)


def test_errors_name_the_problem():
    expect_error("sum", [("f32", (2, 3))], {"axes": [2]}, "axis 2", "rank 2", "-2..1", error=TypeRuleError)
    expect_error("sum", [("f32", (2, 3))], {"axes": [1, -1]}, "repeat", error=TypeRuleError)
    expect_error("sum", [("f32", ())], {"axes": [1]}, "rank-0", error=TypeRuleError)
    expect_error("max", [("f32", (0, 3))], {"axes": [0]}, "axis 0 of size 0", "f32[0,3]", error=TypeRuleError)
    expect_error("min", [("f32", (0, 3))], {}, "size 0", error=TypeRuleError)
    expect_error("argmax", [("f32", (2, 3))], {"axes": [0, 1]}, "'axes'", "exactly one axis", "[0, 1]",
                 error=TypeRuleError)
    expect_error("argmax", [("f32", (0,))], {}, "no elements", error=TypeRuleError)
    expect_error("argmin", [("bool", (3,))], {}, "bool", "cast", error=TypeRuleError)
    expect_error("cumsum", [("f32", (2, 3))], {}, "missing required attribute 'axis'", error=AttributeError_)
    expect_error("cumsum", [("f32", (2, 3))], {"axis": 2}, "axis 2", "rank 2", error=TypeRuleError)
    expect_error("sum", [("f32", (2, 3))], {"axis": 1}, "unknown attribute 'axis'", "did you mean 'axes'",
                 error=AttributeError_)
    expect_error("mean", [("f32", (2,))], {"keepdim": 1}, "'keepdim'", "true or false", error=AttributeError_)
