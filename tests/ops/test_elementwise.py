"""Elementwise ops against torch eager on both executors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from optest import check_op, expect_error, infer, rand
from partita.ir import TypeRuleError
from partita.ir.diagnostics import AttributeError_
from partita.ops import OPS

BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "pow": torch.pow,
    "maximum": torch.maximum, "minimum": torch.minimum,
    "equal": torch.eq, "not_equal": torch.ne, "less": torch.lt, "less_equal": torch.le,
    "greater": torch.gt, "greater_equal": torch.ge,
    "logical_and": torch.logical_and, "logical_or": torch.logical_or,
}
NO_BOOL = {"add", "sub", "pow"}

UNARY = {
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt, "sin": torch.sin, "cos": torch.cos, "tanh": torch.tanh,
    "sigmoid": torch.sigmoid, "relu": torch.relu, "silu": F.silu, "erf": torch.erf,
    "gelu": F.gelu, "logical_not": torch.logical_not, "sign": torch.sign,
}
# Unary ops that PyTorch runs only on floating tensors: partita maps ints to f32 first.
FLOAT_ONLY_IN_TORCH = {"silu", "gelu", "sigmoid"}
NUMERIC_UNARY = {"neg", "abs", "relu", "sign"}


def _float_torch(fn):
    def run(x):
        return fn(x if x.is_floating_point() else x.to(torch.float32))
    return run


def test_every_elementwise_op_is_tested():
    ours = {n for n, o in OPS.items() if o.elementwise and o.defined_at and "elementwise" in o.defined_at.file}
    # sign is defined in backward.py (the derivative of abs) and tested here with the unary ops.
    assert OPS["sign"].defined_at.file.endswith("backward.py")
    assert ours | {"sign"} == set(BINARY) | set(UNARY) | {"where", "cast"}


@pytest.mark.parametrize("op", sorted(BINARY))
@pytest.mark.parametrize("shapes", [((2, 3), (2, 3)), ((2, 3), (3,)), ((), (2, 1)), ((4, 1, 3), (2, 1)),
                                    ((0, 3), (1, 3))], ids=str)
def test_binary_broadcast_f32(op, shapes):
    lo = 0.5 if op == "pow" else -3.0
    x, y = rand(shapes[0], "f32", low=lo), rand(shapes[1], "f32")
    check_op(op, [x, y], {}, BINARY[op])


@pytest.mark.parametrize("op", sorted(BINARY))
@pytest.mark.parametrize("dtypes", [("f64", "f64"), ("i64", "i64"), ("i32", "i64"), ("bool", "bool"),
                                    ("i32", "f32"), ("u8", "i8"), ("bool", "f64"), ("f16", "f16"),
                                    ("bf16", "bf16"), ("bf16", "f16")], ids=str)
def test_binary_dtypes(op, dtypes):
    a, b = dtypes
    x, y = rand((3, 4), a), rand((4,), b)
    if (op in NO_BOOL and a == b == "bool") or (op == "sub" and "bool" in dtypes):
        # sub refuses any bool operand, as PyTorch does; add and pow only bool results.
        expect_error(op, [(a, (3, 4)), (b, (4,))], {}, "not defined on bool")
        return
    check_op(op, [x, y], {}, BINARY[op])


def test_integer_pow_negative_exponent_matches_torch():
    x = torch.arange(-3, 4).repeat_interleave(4).numpy()
    y = torch.tensor([-3, -2, -1, 0] * 7).numpy()
    check_op("pow", [x, y], {}, torch.pow)


def test_integer_div_by_zero_gives_inf_and_nan():
    x, y = torch.tensor([1, 0, -2]).numpy(), torch.tensor([0, 0, 0]).numpy()
    check_op("div", [x, y], {}, torch.div)


@pytest.mark.parametrize("op", sorted(UNARY))
@pytest.mark.parametrize("dtype", ["f32", "f64", "i64", "bool", "f16", "bf16"])
def test_unary(op, dtype):
    shape = (2, 0) if dtype == "f64" else (3, 5) if dtype != "f32" else ()
    x = rand(shape, dtype, low=0.1 if op in ("log", "sqrt", "rsqrt") else -3.0)
    if dtype == "bool" and op in NUMERIC_UNARY:
        expect_error(op, [("bool", shape)], {}, "bool")
        return
    fn = UNARY[op]
    if op in FLOAT_ONLY_IN_TORCH:
        fn = _float_torch(fn)
    check_op(op, [x], {}, fn)


@pytest.mark.parametrize("dtype", ["f32", "f64", "bf16"])
def test_gelu_tanh(dtype):
    check_op("gelu", [rand((4, 5), dtype)], {"approximate": "tanh"}, lambda x: F.gelu(x, approximate="tanh"))


def test_special_float_values():
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e30]).numpy()
    for op in ("exp", "tanh", "sigmoid", "erf", "abs", "relu", "silu"):
        check_op(op, [x], {}, UNARY[op])
    check_op("maximum", [x, x[::-1].copy()], {}, torch.maximum)


@pytest.mark.parametrize("dtypes", [("f32", "f32"), ("i64", "f32"), ("bf16", "f16"), ("bool", "bool")], ids=str)
def test_where(dtypes):
    c = rand((2, 1, 3), "bool")
    x, y = rand((4, 1), dtypes[0]), rand((3,), dtypes[1])
    check_op("where", [c, x, y], {}, torch.where)


@pytest.mark.parametrize("src", ["f32", "f64", "i64", "bool", "bf16", "f16", "u8"])
@pytest.mark.parametrize("dst", ["f32", "i32", "bool", "bf16", "f16", "u8", "i64"])
def test_cast(src, dst):
    x = rand((6,), src, low=0.0 if dst == "u8" else -5.0, high=5.0)
    from partita.ops._lazy import to_torch_dtype
    from partita.ir.dtypes import DTYPES

    check_op("cast", [x], {"dtype": dst}, lambda t: t.to(to_torch_dtype(DTYPES[dst])))


def test_cast_truncates_toward_zero():
    x = torch.tensor([-2.7, -0.5, 0.5, 2.7]).numpy()
    out = check_op("cast", [x], {"dtype": "i32"}, lambda t: t.to(torch.int32))
    assert out[0].tolist() == [-2, 0, 0, 2]


def test_type_rules():
    assert infer("div", [("i64", (2,)), ("i32", ())])[0].dtype.name == "f32"
    assert infer("exp", [("i32", (2,))])[0].dtype.name == "f32"
    assert infer("less", [("f16", (2, 1)), ("bf16", (3,))])[0].shape == (2, 3)
    assert infer("add", [("u8", ()), ("i8", ())])[0].dtype.name == "i16"


def test_errors_name_the_problem():
    msg = expect_error("add", [("f32", (2, 3)), ("f32", (4,))], {}, "[2,3]", "[4]", "do not broadcast",
                       error=TypeRuleError)
    assert "equal or 1" in msg
    expect_error("where", [("f32", (2,)), ("f32", (2,)), ("f32", (2,))], {}, "condition must be bool", "f32")
    expect_error("sub", [("bool", (2,)), ("bool", (2,))], {}, "not defined on bool", "cast")
    expect_error("gelu", [("f32", (2,))], {"approximate": "fast"}, "'approximate'", "'tanh'",
                 error=AttributeError_)
    expect_error("cast", [("f32", (2,))], {"dtype": "f31"}, "'dtype'", "dtype name", error=AttributeError_)
    expect_error("cast", [("f32", (2,))], {}, "missing required attribute 'dtype'", error=AttributeError_)
    expect_error("add", [("f32", (2,))], {}, "2 operand", "1", error=TypeRuleError)
    expect_error("relu", [("f32", (2,))], {"alpha": 1.0}, "unknown attribute 'alpha'", error=AttributeError_)
