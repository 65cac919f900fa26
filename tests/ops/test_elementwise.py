"""Elementwise ops against torch eager on both executors."""

from __future__ import annotations

import numpy as np
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
    "floor": torch.floor, "ceil": torch.ceil, "round": torch.round, "trunc": torch.trunc,
    "tan": torch.tan, "asin": torch.asin, "acos": torch.acos, "atan": torch.atan, "sinh": torch.sinh,
    "cosh": torch.cosh, "asinh": torch.asinh, "acosh": torch.acosh, "atanh": torch.atanh,
    "isnan": torch.isnan, "isinf": torch.isinf,
}
# Unary ops that PyTorch runs only on floating tensors: partita maps ints to f32 first.
FLOAT_ONLY_IN_TORCH = {"silu", "gelu", "sigmoid"}
NUMERIC_UNARY = {"neg", "abs", "relu", "sign", "floor", "ceil", "round", "trunc"}


def _float_torch(fn):
    def run(x):
        return fn(x if x.is_floating_point() else x.to(torch.float32))
    return run


def test_every_elementwise_op_is_tested():
    ours = {n for n, o in OPS.items() if o.elementwise and o.defined_at and "elementwise" in o.defined_at.file}
    # sign is defined in backward.py (the derivative of abs) and tested here with the unary ops.
    assert OPS["sign"].defined_at.file.endswith("backward.py")
    assert ours | {"sign"} == set(BINARY) | set(UNARY) | set(INTEGER_OPS) | {"where", "cast"}


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


# --- integer ops: bitwise, shifts, remainders ------------------------------------------------

def _nonzero(b: np.ndarray) -> np.ndarray:
    """An integer divisor with its zeros made 1: a zero divisor raises (tested in
    tests/frontend/test_integer_division.py)."""
    return np.where(b == 0, np.ones((), b.dtype), b) if b.dtype.kind in "iu" else b


INTEGER_OPS = {
    "bitwise_and": torch.bitwise_and, "bitwise_or": torch.bitwise_or, "bitwise_xor": torch.bitwise_xor,
    "bitwise_not": torch.bitwise_not, "bitwise_left_shift": torch.bitwise_left_shift,
    "bitwise_right_shift": torch.bitwise_right_shift,
    "remainder": torch.remainder, "fmod": torch.fmod,
    "int_div": lambda a, b: torch.div(a, b, rounding_mode="floor"),
}


@pytest.mark.parametrize("op", ["bitwise_and", "bitwise_or", "bitwise_xor"])
@pytest.mark.parametrize("dtypes", [("i32", "i32"), ("u8", "u8"), ("i64", "i32"), ("bool", "bool"), ("i16", "i16")],
                         ids=str)
def test_bitwise_binary(op, dtypes):
    x, y = rand((3, 4), dtypes[0], low=-100, high=100), rand((4,), dtypes[1], low=-100, high=100)
    check_op(op, [x, y], {}, INTEGER_OPS[op])


@pytest.mark.parametrize("dtype", ["i8", "u8", "i32", "i64", "bool"])
def test_bitwise_not(dtype):
    check_op("bitwise_not", [rand((3, 4), dtype, low=-100, high=100)], {}, torch.bitwise_not)


@pytest.mark.parametrize("op", ["bitwise_left_shift", "bitwise_right_shift"])
@pytest.mark.parametrize("dtype", ["i8", "u8", "i16", "i32", "i64"])
def test_shifts_in_range_match_torch(op, dtype):
    x = rand((3, 5), dtype, low=-100, high=100)
    s = rand((5,), dtype, low=0, high=7)
    check_op(op, [x, s], {}, INTEGER_OPS[op])


def test_shifts_out_of_range_fill_as_bit_by_bit_shifts():
    x = torch.tensor([-8, 4, -1, 64, -128], dtype=torch.int8).numpy()
    s = torch.tensor([8, 9, 127, -1, -16], dtype=torch.int8).numpy()
    left = check_op("bitwise_left_shift", [x, s], {}, lambda a, b: torch.zeros_like(a))
    right = check_op("bitwise_right_shift", [x, s], {}, lambda a, b: torch.where(a < 0, -1, 0).to(a.dtype))
    assert left[0].tolist() == [0] * 5 and right[0].tolist() == [-1, 0, -1, 0, -1]
    # Overflow wraps in the dtype.
    out = check_op("bitwise_left_shift", [x[3:4], np.array([1], np.int8)], {}, torch.bitwise_left_shift)
    assert out[0].tolist() == [-128]


def test_shift_errors():
    expect_error("bitwise_left_shift", [("i32", (2,)), ("i64", (2,))], {}, "one integer dtype", "cast")
    expect_error("bitwise_right_shift", [("f32", (2,)), ("f32", (2,))], {}, "integer tensors", "f32")
    expect_error("bitwise_and", [("f32", (2,)), ("i32", (2,))], {}, "integer or bool", "lhs")
    expect_error("bitwise_left_shift", [("bool", (2,)), ("bool", (2,))], {}, "integer tensors")


@pytest.mark.parametrize("op", ["remainder", "fmod"])
@pytest.mark.parametrize("dtypes", [("f32", "f32"), ("f64", "f64"), ("i32", "i32"), ("i64", "i8"), ("u8", "u8"),
                                    ("f16", "f16"), ("bf16", "bf16"), ("i32", "f32")], ids=str)
def test_remainders(op, dtypes):
    x, y = rand((3, 4), dtypes[0], low=-20, high=20), _nonzero(rand((4,), dtypes[1], low=-5, high=5))
    check_op(op, [x, y], {}, INTEGER_OPS[op])


@pytest.mark.parametrize("rounding", ["floor", "trunc"])
@pytest.mark.parametrize("dtypes", [("i32", "i32"), ("i64", "i8"), ("u8", "u8"), ("i8", "u8"), ("i16", "i16")], ids=str)
def test_int_div(rounding, dtypes):
    x, y = rand((3, 4), dtypes[0], low=-100, high=100), _nonzero(rand((4,), dtypes[1], low=-9, high=9))
    check_op("int_div", [x, y], {"rounding": rounding}, lambda a, b: torch.div(a, b, rounding_mode=rounding))


def test_remainder_signs_and_special_values():
    a = np.array([-4.3, 7.2, 5.0, 4.3, -7.2, 0.0, -3.0, 3.0, 1.0, np.inf, 1.0], np.float32)
    b = np.array([2.1, -3.4, 8.0, -2.1, 3.4, -2.0, np.inf, np.inf, -np.inf, 2.0, 0.0], np.float32)
    r = check_op("remainder", [a, b], {}, torch.remainder)[0]
    np.testing.assert_allclose(r, np.remainder(a, b), rtol=1e-6)
    assert np.signbit(r[5]) and r[6] == np.inf and r[8] == -np.inf and np.isnan(r[9]) and np.isnan(r[10])
    f = check_op("fmod", [a, b], {}, torch.fmod)[0]
    np.testing.assert_allclose(f, np.fmod(a, b), rtol=1e-6)
    ia = np.array([-4, 7, 5, 4, -7, 8, -128], np.int8)
    ib = np.array([2, -3, 8, -2, 3, 5, -1], np.int8)
    assert check_op("remainder", [ia, ib], {}, INTEGER_OPS["remainder"])[0].tolist() == [0, -2, 5, 0, 2, 3, 0]
    assert check_op("fmod", [ia, ib], {}, INTEGER_OPS["fmod"])[0].tolist() == [0, 1, 5, 0, -1, 3, 0]


def test_round_is_half_to_even_and_integers_pass_through():
    x = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 2.6, -2.6], np.float32)
    assert check_op("round", [x], {}, torch.round)[0].tolist() == [-2, -2, -0, 0, 2, 2, 3, -3]
    i = np.array([-3, 0, 7], np.int32)
    for op in ("floor", "ceil", "round", "trunc"):
        assert check_op(op, [i], {}, UNARY[op])[0].tolist() == [-3, 0, 7]
    assert infer("floor", [("i32", (2,))])[0].dtype.name == "i32"


def test_isnan_isinf_special_values():
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, 1.0]).numpy()
    assert check_op("isnan", [x], {}, torch.isnan)[0].tolist() == [True, False, False, False, False]
    assert check_op("isinf", [x], {}, torch.isinf)[0].tolist() == [False, True, True, False, False]
