"""matmul against torch eager on both executors."""

from __future__ import annotations

import pytest
import torch

from optest import check_op, expect_error, infer, rand
from partita.ir import TensorType, f32
from partita.ir.diagnostics import TypeRuleError
from partita.ops import OPS

SHAPES = [
    ((4,), (4,)),               # dot -> scalar
    ((4,), (4, 3)),             # vector x matrix
    ((2, 5, 4), (4,)),          # batched matrix x vector
    ((4,), (2, 4, 3)),          # vector x batched matrix
    ((3, 4), (4, 5)),
    ((2, 3, 4), (4, 5)),        # batch on one side
    ((2, 1, 3, 4), (5, 4, 2)),  # broadcast batch dims
    ((1, 4), (4, 1)),
    ((0, 4), (4, 3)),           # empty M
    ((3, 0), (0, 2)),           # empty K: zeros
    ((0,), (0,)),
]


@pytest.mark.parametrize("a,b", SHAPES, ids=str)
def test_matmul_shapes_f32(a, b):
    check_op("matmul", [rand(a, "f32"), rand(b, "f32")], {}, torch.matmul)


@pytest.mark.parametrize("dtype", ["f64", "i32", "i64", "f16", "bf16"])
@pytest.mark.parametrize("a,b", [((3, 8), (8, 2)), ((2, 2, 8), (8,))], ids=str)
def test_matmul_dtypes(dtype, a, b):
    # K=8 keeps f16/bf16 rounding differences within the default low-precision tolerance.
    check_op("matmul", [rand(a, dtype, low=-1, high=1), rand(b, dtype, low=-1, high=1)], {}, torch.matmul)


def test_matmul_long_contraction():
    check_op("matmul", [rand((3, 500), "f32"), rand((500, 2), "f32")], {}, torch.matmul, rtol=1e-4, atol=1e-4)


def test_result_types():
    assert infer("matmul", [("f32", (7,)), ("f32", (7,))])[0] == TensorType((), f32)
    assert infer("matmul", [("f32", (6, 1, 2, 7)), ("f32", (3, 7, 5))])[0].shape == (6, 3, 2, 5)


@pytest.mark.parametrize("a,b,flops", [((4,), (4,), 8), ((3, 4), (4, 5), 120), ((2, 3, 4), (4, 5), 240),
                                       ((2, 3, 4), (4,), 48)], ids=str)
def test_cost_is_2mnk_per_batch(a, b, flops):
    ta, tb = TensorType(a, f32), TensorType(b, f32)
    (out,) = OPS["matmul"].infer_types([ta, tb], {})
    c = OPS["matmul"].cost_of([ta, tb], [out], {})
    assert c.flops == flops
    assert c.bytes_read == ta.nbytes + tb.nbytes and c.bytes_written == out.nbytes


def test_errors_name_the_problem():
    msg = expect_error("matmul", [("f32", (32, 784)), ("f32", (785, 10))], {},
                       "contraction dims differ", "lhs f32[32,K=784]", "rhs f32[K=785,10]", error=TypeRuleError)
    assert "second-to-last" in msg
    expect_error("matmul", [("f32", (3, 4)), ("f32", (5,))], {}, "K=4", "K=5", "only", error=TypeRuleError)
    expect_error("matmul", [("f32", (2, 3, 4)), ("f32", (3, 4, 5))], {}, "batch dims [2]", "[3]",
                 "do not broadcast", error=TypeRuleError)
    expect_error("matmul", [("f32", ()), ("f32", (3,))], {}, "rank-0", "mul", error=TypeRuleError)
    expect_error("matmul", [("f32", (2, 3)), ("f16", (3, 2))], {}, "dtypes differ", "cast", error=TypeRuleError)
    expect_error("matmul", [("bool", (2, 3)), ("bool", (3, 2))], {}, "bool", error=TypeRuleError)
