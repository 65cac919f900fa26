"""scatter_elements and cumprod (partita/ops/index_scan.py) against torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import partita
from optest import build, check_op, expect_error, rand
from partita.ir import PartitaError, TensorType
from partita.ir.dtypes import DTYPES

_TORCH = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


@pytest.mark.parametrize("xs,idxs,srcs,axis", [((4, 5), (3, 5), (3, 5), 0), ((4, 5), (2, 3), (3, 4), 1),
                                                ((3, 4, 2), (3, 6, 2), (3, 6, 2), 1), ((6,), (9,), (9,), -1)])
@pytest.mark.parametrize("reduction", ["add", "mul", "max", "min"])
@pytest.mark.parametrize("dt", ["f32", "f64", "i32", "i64", "f16"])
def test_scatter_elements_reductions_match_torch(xs, idxs, srcs, axis, reduction, dt):
    x, src = rand(xs, dt), rand(srcs, dt)
    idx = rand(idxs, "i64", 0, xs[axis] - 1)
    check_op("scatter_elements", [x, idx, src], {"axis": axis, "reduction": reduction},
             lambda a, i, s: torch.scatter_reduce(a, axis, i, s, reduce=_TORCH[reduction], include_self=True))


@pytest.mark.parametrize("dt", ["f32", "i32", "bool", "bf16"])
def test_scatter_elements_none_writes_src(dt):
    x, src = rand((4, 5), dt), rand((2, 5), dt)
    # One write per position: a permutation's first two rows along axis 0.
    idx = np.argsort(np.random.default_rng(1).random((4, 5)), axis=0)[:2].astype(np.int32)
    check_op("scatter_elements", [x, idx, src], {"axis": 0}, lambda a, i, s: torch.scatter(a, 0, i.long(), s))


def test_scatter_elements_errors():
    expect_error("scatter_elements", [("f32", (4, 5)), ("i64", (4,)), ("f32", (4, 5))], {"axis": 0}, "must have the rank")
    expect_error("scatter_elements", [("f32", (4, 5)), ("f32", (4, 5)), ("f32", (4, 5))], {"axis": 0}, "i32 or i64")
    expect_error("scatter_elements", [("f32", (4, 5)), ("i64", (4, 5)), ("f64", (4, 5))], {"axis": 0},
                 "cast src to f32")
    expect_error("scatter_elements", [("bool", (4, 5)), ("i64", (4, 5)), ("bool", (4, 5))],
                 {"axis": 0, "reduction": "add"}, "needs a numeric input")
    expect_error("scatter_elements", [("f32", (4, 5)), ("i64", (4, 5)), ("f32", (4, 5))],
                 {"axis": 0, "reduction": "mean"}, "reduction")
    g = build("scatter_elements", [TensorType((4,), DTYPES["f32"]), TensorType((2,), DTYPES["i64"]),
                                   TensorType((2,), DTYPES["f32"])], {"axis": 0})
    with pytest.raises(PartitaError, match="index 4 is out of range"):
        partita.run(g, [rand((4,)), np.array([1, 4]), rand((2,))])


@pytest.mark.parametrize("shape,axis", [((3, 4), 1), ((3, 4), 0), ((5,), -1), ((2, 3, 4), 1), ((), 0)])
@pytest.mark.parametrize("dtype", ["f32", "f64", "i32", "i64", "bool", "f16"])
def test_cumprod_matches_torch(shape, axis, dtype):
    check_op("cumprod", [rand(shape, dtype, -2, 2)], {"axis": axis}, lambda t: torch.cumprod(t, dim=axis))


def test_cumprod_gradient_is_exact_with_zeros():
    x = np.array([[1.5, 0.0, 2.0, -1.0], [0.0, 0.0, 3.0, 0.5], [2.0, 1.0, 0.0, 4.0]])
    g = np.array([[0.3, -1.0, 2.0, 0.7], [1.0, 0.2, -0.4, 1.1], [0.5, 0.5, -2.0, 1.0]])
    t = torch.tensor(x, requires_grad=True)
    (want,) = torch.autograd.grad((torch.cumprod(t, 1) * torch.tensor(g)).sum(), [t])
    from partita.autodiff import grad
    from partita.ir import Builder, Graph
    gr = Graph("cumprod_zeros")
    b = Builder(gr)
    xv = b.input("x", TensorType(x.shape, DTYPES["f64"]), "param")
    cv = b.input("c", TensorType(x.shape, DTYPES["f64"]))
    b.ret(b.sum(b.mul(b.cumprod(xv, axis=1), cv)))
    grad(gr)
    gr.weights["x"] = x
    outs = partita.run(gr, [g])
    np.testing.assert_allclose(np.asarray(outs[-1]), want.numpy(), rtol=1e-12, atol=1e-12)


def test_cumprod_errors():
    expect_error("cumprod", [("f32", (2, 3))], {"axis": 2}, "axis 2")


def test_scatter_elements_gradient_is_refused_for_mul_max_min():
    from partita.autodiff import grad
    from partita.autodiff.grad import AutodiffError
    from partita.ir import Builder, Graph
    gr = Graph("scatter_max")
    b = Builder(gr)
    xv = b.input("x", TensorType((4, 3), DTYPES["f32"]), "param")
    iv = b.input("i", TensorType((2, 3), DTYPES["i64"]))
    sv = b.input("s", TensorType((2, 3), DTYPES["f32"]), "param")
    b.ret(b.sum(b.scatter_elements(xv, iv, sv, axis=0, reduction="max")))
    with pytest.raises(AutodiffError, match="reduction 'max' is not differentiable"):
        grad(gr)
