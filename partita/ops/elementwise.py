"""Elementwise ops: arithmetic, math functions, comparisons, logic, where and cast.

Binary ops broadcast like NumPy and promote dtypes like PyTorch (``dtypes.promote``).
Math functions on integer or bool inputs return f32 (PyTorch's default float). The NumPy
references compute f16/bf16 in f32 and round once, as PyTorch's CPU kernels do.
"""

from __future__ import annotations

import math

import numpy as np

from ..ir.diagnostics import IntegerDivisionByZeroError, TypeRuleError
from ..ir.dtypes import DType, bool_, f32, from_numpy, promote
from ..ir.types import TensorType
from ._lazy import F, to_torch_dtype, torch
from .cast_semantics import ROUND_MODES, cast_array, float_to_int_torch
from .numeric import compute_np
from .registry import AttrSpec, OpDef, broadcast_shapes, register


def _float_of(dt: DType) -> DType:
    return dt if dt.is_float else f32


# --- binary arithmetic ------------------------------------------------------------------

def _binary_infer(name: str, result: str = "promote"):
    def infer(ts: list[TensorType], attrs: dict) -> TensorType:
        a, b = ts
        shape = broadcast_shapes(a.shape, b.shape, op=name)
        if result == "no_bool" and (a.dtype.is_bool or b.dtype.is_bool):
            which, t = ("lhs", a) if a.dtype.is_bool else ("rhs", b)
            # PyTorch refuses even when the other operand would promote the result to a number.
            raise TypeRuleError(f"{name} is not defined on bool tensors ({which} is {t}); cast it to an "
                                "integer or float dtype first (use logical_not to invert a mask)")
        dt = promote(a.dtype, b.dtype)
        if result == "bool":
            dt = bool_
        elif result == "float":
            dt = _float_of(dt)
        elif result == "numeric" and dt.is_bool:
            raise TypeRuleError(f"{name} is not defined on bool tensors; cast to an integer or float dtype first")
        return TensorType(shape, dt)
    return infer


def _binary(name: str, np_fn, torch_fn, result: str = "promote", doc: str = "", **facts) -> OpDef:
    def reference(args, attrs):
        a, b = args
        if result == "float" and a.dtype.kind in "biu" and b.dtype.kind in "biu":
            a, b = a.astype(np.float32), b.astype(np.float32)
        return np_fn(compute_np(a), compute_np(b))

    def torch_impl(args, attrs):
        return torch_fn(args[0], args[1])

    return register(OpDef(name=name, operands=("lhs", "rhs"), infer=_binary_infer(name, result),
                          reference=reference, torch=torch_impl, doc=doc, elementwise=True, **facts))


def _np_pow(a, b):
    rt = np.result_type(a, b)
    if np.issubdtype(rt, np.integer):
        # NumPy raises on negative integer exponents; PyTorch's integer kernel computes
        # 1 ** -n = 1, (-1) ** -n = +-1 by parity and 0 for every other base (0 included).
        a, b = a.astype(rt), b.astype(rt)
        neg = b < 0
        pos = np.power(a, np.where(neg, 0, b).astype(rt))
        odd = (b % 2) != 0
        negexp = np.where(a == 1, 1, np.where(a == -1, np.where(odd, -1, 1), 0)).astype(rt)
        return np.where(neg, negexp, pos)
    return np.power(a, b)


def _torch_div(a, b):
    return torch.div(a, b)


_binary("add", np.add, lambda a, b: torch.add(a, b), "numeric", "lhs + rhs", commutative=True, right_identity=0.0, left_identity=0.0,
        pad_zeros="all_operands", linear_in=frozenset({0, 1}), linear_joint=True)
_binary("sub", np.subtract, lambda a, b: torch.sub(a, b), "no_bool", "lhs - rhs (no bool operand)", right_identity=0.0,
        pad_zeros="all_operands", linear_in=frozenset({0, 1}), linear_joint=True)
_binary("mul", np.multiply, lambda a, b: torch.mul(a, b), "promote", "lhs * rhs", commutative=True, right_identity=1.0, left_identity=1.0,
        pad_zeros="any", linear_in=frozenset({0, 1}))
_binary("div", np.true_divide, _torch_div, "float", "lhs / rhs (true division; integers give f32)", right_identity=1.0,
        linear_in=frozenset({0}))
def _torch_pow(a, b):
    # A rank-0 exponent of the base's float dtype (x ** 3.0 in a model) goes through torch's
    # scalar-exponent kernel, which special-cases 2, 3, 0.5, -1, ... and is what eager runs
    # for x ** 3.0; the tensor-tensor kernel is some 30 times slower and rounds differently.
    if b.dim() == 0 and a.dtype == b.dtype and a.is_floating_point() and not b.requires_grad:
        return torch.pow(a, b.item())
    return torch.pow(a, b)


_binary("pow", _np_pow, _torch_pow, "numeric",
        "lhs ** rhs; integer tensors follow PyTorch for negative exponents (1, +-1 for base -1, else 0)",
        right_identity=1.0)
_binary("maximum", np.maximum, lambda a, b: torch.maximum(a, b), "promote", "elementwise max (NaN propagates)", commutative=True)
_binary("minimum", np.minimum, lambda a, b: torch.minimum(a, b), "promote", "elementwise min (NaN propagates)", commutative=True)

# --- comparisons and logic --------------------------------------------------------------

_binary("equal", np.equal, lambda a, b: torch.eq(a, b), "bool", "lhs == rhs", commutative=True)
_binary("not_equal", np.not_equal, lambda a, b: torch.ne(a, b), "bool", "lhs != rhs", commutative=True)
_binary("less", np.less, lambda a, b: torch.lt(a, b), "bool", "lhs < rhs")
_binary("less_equal", np.less_equal, lambda a, b: torch.le(a, b), "bool", "lhs <= rhs")
_binary("greater", np.greater, lambda a, b: torch.gt(a, b), "bool", "lhs > rhs")
_binary("greater_equal", np.greater_equal, lambda a, b: torch.ge(a, b), "bool", "lhs >= rhs")
_binary("logical_and", np.logical_and, lambda a, b: torch.logical_and(a, b), "bool", "nonzero and nonzero", commutative=True)
_binary("logical_or", np.logical_or, lambda a, b: torch.logical_or(a, b), "bool", "nonzero or nonzero", commutative=True)


# --- unary ------------------------------------------------------------------------------

def _unary(name: str, np_fn, torch_fn, result: str = "same", doc: str = "", attrs=(), **facts) -> OpDef:
    """result: "same" keeps the dtype; "float" maps integers and bool to f32; "bool" gives bool;
    "numeric" keeps the dtype but rejects bool."""

    def infer(ts, a):
        (t,) = ts
        dt = t.dtype
        if result == "float":
            dt = _float_of(dt)
        elif result == "bool":
            dt = bool_
        elif result == "numeric" and dt.is_bool:
            raise TypeRuleError(f"{name} is not defined on bool tensors")
        return TensorType(t.shape, dt)

    def reference(args, a):
        x = args[0]
        if result == "float" and x.dtype.kind in "biu":
            x = x.astype(np.float32)
        return np_fn(compute_np(x), a)

    def torch_impl(args, a):
        x = args[0]
        if result == "float" and not x.is_floating_point():
            x = x.to(torch.float32)
        return torch_fn(x, a)

    return register(OpDef(name=name, operands=("x",), infer=infer, reference=reference, torch=torch_impl,
                          attrs=tuple(attrs), doc=doc, elementwise=True, **facts))


_erf_scalar = np.frompyfunc(math.erf, 1, 1)


def np_erf(x):
    """erf without SciPy (not a dependency): math.erf per element, exact to double
    precision; slow, as a reference may be."""
    return np.asarray(_erf_scalar(np.asarray(x, dtype=np.float64))).astype(x.dtype)


def _np_gelu(x, a):
    if a["approximate"] == "tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1.0 + np_erf(x / np.asarray(math.sqrt(2.0), dtype=x.dtype)))


def np_sigmoid(x, a=None):
    """The logistic function in NumPy, in x's dtype (``a``: the op's attributes, unused)."""
    # Stable in both tails.
    return np.where(x >= 0, 1.0 / (1.0 + np.exp(-np.abs(x))), np.exp(-np.abs(x)) / (1.0 + np.exp(-np.abs(x)))).astype(x.dtype)


_unary("neg", lambda x, a: np.negative(x), lambda x, a: torch.neg(x), "numeric", "-x", involution=True, pad_zeros="all",
       linear_in=frozenset({0}))
_unary("abs", lambda x, a: np.abs(x), lambda x, a: torch.abs(x), "numeric", "|x|", idempotent=True)
_unary("exp", lambda x, a: np.exp(x), lambda x, a: torch.exp(x), "float", "e ** x")
_unary("log", lambda x, a: np.log(x), lambda x, a: torch.log(x), "float", "natural logarithm")
_unary("sqrt", lambda x, a: np.sqrt(x), lambda x, a: torch.sqrt(x), "float", "square root")
_unary("rsqrt", lambda x, a: 1.0 / np.sqrt(x), lambda x, a: torch.rsqrt(x), "float", "1 / sqrt(x)")
_unary("sin", lambda x, a: np.sin(x), lambda x, a: torch.sin(x), "float", "sine")
_unary("cos", lambda x, a: np.cos(x), lambda x, a: torch.cos(x), "float", "cosine")
_unary("tanh", lambda x, a: np.tanh(x), lambda x, a: torch.tanh(x), "float", "hyperbolic tangent")
_unary("sigmoid", np_sigmoid, lambda x, a: torch.sigmoid(x), "float", "1 / (1 + e ** -x)")
_unary("relu", lambda x, a: np.maximum(x, np.zeros((), x.dtype)), lambda x, a: torch.relu(x), "numeric",
       "max(x, 0)", idempotent=True)
_unary("gelu", _np_gelu, lambda x, a: F.gelu(x, approximate=a["approximate"]), "float",
       "Gaussian error linear unit; approximate='tanh' uses the tanh formula",
       attrs=(AttrSpec("approximate", "str", "none", choices=("none", "tanh")),))
_unary("silu", lambda x, a: x * np_sigmoid(x), lambda x, a: F.silu(x), "float", "x * sigmoid(x)")
_unary("erf", lambda x, a: np_erf(x), lambda x, a: torch.erf(x), "float", "the error function")
# An involution on bool tensors; on others not(not(x)) is bool, not x's type, so no
# rewrite can use the fact there (a rewrite must keep the type).
_unary("logical_not", lambda x, a: np.logical_not(x), lambda x, a: torch.logical_not(x), "bool",
       "x == 0", involution=True)


# --- where and cast -----------------------------------------------------------------------

def _where_infer(ts, attrs):
    c, a, b = ts
    if not c.dtype.is_bool:
        raise TypeRuleError(f"where: the condition must be bool, got {c.dtype} (compare it with a value first)")
    return TensorType(broadcast_shapes(c.shape, a.shape, b.shape, op="where"), promote(a.dtype, b.dtype))


def _where_reference(c, x, y):
    # NumPy cannot promote bf16 with f16; use the type rule's dtype for both branches.
    dt = promote(from_numpy(x.dtype), from_numpy(y.dtype)).np
    return np.where(c, x.astype(dt, copy=False), y.astype(dt, copy=False))


register(OpDef(
    name="where", operands=("cond", "x", "y"), infer=_where_infer,
    reference=lambda args, a: _where_reference(*args),
    torch=lambda args, a: torch.where(args[0], args[1], args[2]),
    doc="cond ? x : y, broadcasting all three", elementwise=True,
    linear_in=frozenset({1, 2}), linear_joint=True,
))


def _cast_reference(args, a):
    return cast_array(args[0], a["dtype"], a["saturate"], a["round_mode"])


def _cast_torch(args, a):
    # Casts that touch u16/u32/u64 or a storage type are taken over by the torch executor
    # (partita.backend.torch_exec), which knows how it carries those values. torch's own
    # float -> integer conversion is undefined out of range, so that one follows cast_array.
    x, dt = args[0], a["dtype"]
    if dt.is_int and x.is_floating_point():
        return float_to_int_torch(x, dt).to(to_torch_dtype(dt))
    return x.to(to_torch_dtype(dt))


register(OpDef(
    name="cast", operands=("x",),
    attrs=(AttrSpec("dtype", "dtype"), AttrSpec("saturate", "bool", True),
           AttrSpec("round_mode", "str", "up", choices=ROUND_MODES)),
    infer=lambda ts, a: TensorType(ts[0].shape, a["dtype"]),
    reference=_cast_reference, torch=_cast_torch, storage_ok=True, pad_zeros="all",
    doc="convert to dtype (ONNX Cast semantics, docs/ir.md): float to int truncates toward zero "
        "(to i4/u4/i2/u2: rounds to nearest even) and saturates, NaN to 0; int to int keeps the low "
        "bits; nonzero to bool is true; saturate (f8 targets) clamps out-of-range values and "
        "infinities to +-max; f4e2m1 always saturates (NaN to 6); round_mode (f8e8m0 target) is "
        "up, down or nearest",
    elementwise=True,
))


# --- rounding, more math functions, float classes, bitwise, remainders --------------------
# floor/ceil/round/trunc keep integer inputs as they are; round is half to even (as NumPy,
# PyTorch and ONNX round). The bitwise ops take integers and bools, the shifts integers of one
# dtype: a shift by a negative amount or by the width or more gives 0 (left, and right of an
# unsigned or non-negative value) or -1 (right of a negative value), which is what a shift
# one bit at a time would give. Integer division (int_div) and integer remainder and fmod are
# exact in every integer dtype; a zero divisor raises IntegerDivisionByZeroError at run time
# (PyTorch raises too; C leaves it undefined), and INT_MIN / -1 wraps to INT_MIN (docs/ir.md,
# "Integer division and remainders").

def _keep_int(np_fn):
    return lambda x, a: x if x.dtype.kind in "iu" else np_fn(x)


_unary("floor", _keep_int(np.floor), lambda x, a: torch.floor(x), "numeric",
       "largest integer <= x (integers unchanged)", idempotent=True, pad_zeros="all")
_unary("ceil", _keep_int(np.ceil), lambda x, a: torch.ceil(x), "numeric",
       "smallest integer >= x (integers unchanged)", idempotent=True, pad_zeros="all")
_unary("round", _keep_int(np.round), lambda x, a: torch.round(x), "numeric",
       "nearest integer, halves to even (integers unchanged)", idempotent=True, pad_zeros="all")
_unary("trunc", _keep_int(np.trunc), lambda x, a: torch.trunc(x), "numeric",
       "x rounded toward zero (integers unchanged)", idempotent=True, pad_zeros="all")
_unary("tan", lambda x, a: np.tan(x), lambda x, a: torch.tan(x), "float", "tangent", pad_zeros="all")
_unary("asin", lambda x, a: np.arcsin(x), lambda x, a: torch.asin(x), "float", "inverse sine (NaN outside [-1, 1])",
       pad_zeros="all")
_unary("acos", lambda x, a: np.arccos(x), lambda x, a: torch.acos(x), "float", "inverse cosine (NaN outside [-1, 1])")
_unary("atan", lambda x, a: np.arctan(x), lambda x, a: torch.atan(x), "float", "inverse tangent", pad_zeros="all")
_unary("sinh", lambda x, a: np.sinh(x), lambda x, a: torch.sinh(x), "float", "hyperbolic sine", pad_zeros="all")
_unary("cosh", lambda x, a: np.cosh(x), lambda x, a: torch.cosh(x), "float", "hyperbolic cosine")
_unary("asinh", lambda x, a: np.arcsinh(x), lambda x, a: torch.asinh(x), "float", "inverse hyperbolic sine",
       pad_zeros="all")
_unary("acosh", lambda x, a: np.arccosh(x), lambda x, a: torch.acosh(x), "float",
       "inverse hyperbolic cosine (NaN below 1)")
_unary("atanh", lambda x, a: np.arctanh(x), lambda x, a: torch.atanh(x), "float",
       "inverse hyperbolic tangent (NaN outside [-1, 1], +-inf at +-1)", pad_zeros="all")
_unary("isnan", lambda x, a: np.isnan(x), lambda x, a: torch.isnan(x), "bool", "x is NaN (false for integers)")
_unary("isinf", lambda x, a: np.isinf(x), lambda x, a: torch.isinf(x), "bool",
       "x is +inf or -inf (false for integers)")


def _np_bitwise_not(x, a):
    return np.invert(x)


_unary("bitwise_not", _np_bitwise_not, lambda x, a: torch.bitwise_not(x), "same",
       "~x: every bit inverted (logical not on bool)", involution=True)


def _int_binary_infer(name: str, allow_bool: bool, same_dtype: bool):
    def infer(ts: list[TensorType], attrs: dict) -> TensorType:
        a, b = ts
        shape = broadcast_shapes(a.shape, b.shape, op=name)
        for which, t in (("lhs", a), ("rhs", b)):
            if t.dtype.is_float or (t.dtype.is_bool and not allow_bool) or not (t.dtype.is_int or t.dtype.is_bool):
                kinds = "integer or bool" if allow_bool else "integer"
                raise TypeRuleError(f"{name} takes {kinds} tensors; {which} is {t} (cast it to an integer dtype first)")
        if same_dtype and a.dtype is not b.dtype:
            raise TypeRuleError(f"{name} takes operands of one integer dtype; lhs is {a}, rhs is {b} "
                                "(cast the shift amount to the value's dtype)")
        return TensorType(shape, promote(a.dtype, b.dtype))
    return infer


def _int_binary(name: str, np_fn, torch_fn, doc: str, allow_bool: bool = True, same_dtype: bool = False,
                **facts) -> OpDef:
    infer = _int_binary_infer(name, allow_bool, same_dtype)

    def reference(args, attrs):
        a, b = args
        dt = promote(from_numpy(a.dtype), from_numpy(b.dtype)).np
        return np_fn(a.astype(dt, copy=False), b.astype(dt, copy=False))

    return register(OpDef(name=name, operands=("lhs", "rhs"), infer=infer, reference=reference,
                          torch=lambda args, attrs: torch_fn(args[0], args[1]), doc=doc, elementwise=True,
                          **facts))


_int_binary("bitwise_and", np.bitwise_and, lambda a, b: torch.bitwise_and(a, b), "lhs & rhs (integers, bools)",
            commutative=True, pad_zeros="any")
_int_binary("bitwise_or", np.bitwise_or, lambda a, b: torch.bitwise_or(a, b), "lhs | rhs (integers, bools)",
            commutative=True, pad_zeros="all_operands")
_int_binary("bitwise_xor", np.bitwise_xor, lambda a, b: torch.bitwise_xor(a, b), "lhs ^ rhs (integers, bools)",
            commutative=True, pad_zeros="all_operands")


def _np_shift(left: bool):
    def shift(a, b):
        bits = a.dtype.itemsize * 8
        valid = (b >= 0) & (b < bits)
        s = np.where(valid, b, 0).astype(a.dtype)
        if left:
            return np.where(valid, np.left_shift(a, s), 0).astype(a.dtype)
        fill = np.right_shift(a, bits - 1) if a.dtype.kind == "i" else np.zeros_like(a)
        return np.where(valid, np.right_shift(a, s), fill).astype(a.dtype)
    return shift


def _torch_shift(left: bool):
    # The bits of the tensor's own dtype: u16/u32 travel in wider signed carriers, whose
    # results the executor reduces modulo 2**bits (a shift past 16 or 32 bits gives 0 either way).
    def shift(a, b):
        bits = torch.iinfo(a.dtype).bits
        valid = (b >= 0) & (b < bits)
        s = torch.where(valid, b, torch.zeros_like(b))
        if left:
            return torch.where(valid, torch.bitwise_left_shift(a, s), torch.zeros_like(a))
        fill = torch.bitwise_right_shift(a, bits - 1) if a.dtype.is_signed else torch.zeros_like(a)
        return torch.where(valid, torch.bitwise_right_shift(a, s), fill)
    return shift


_int_binary("bitwise_left_shift", _np_shift(True), _torch_shift(True),
            "lhs << rhs, wrapping in the dtype; a shift < 0 or >= the width gives 0",
            allow_bool=False, same_dtype=True)
_int_binary("bitwise_right_shift", _np_shift(False), _torch_shift(False),
            "lhs >> rhs (arithmetic for signed dtypes); a shift < 0 or >= the width gives -1 for a negative "
            "lhs, else 0", allow_bool=False, same_dtype=True)


def _zero_divisor_error(op: str) -> IntegerDivisionByZeroError:
    # The executors put the node (results, op, place) in front of the message.
    return IntegerDivisionByZeroError(
        f"integer division by zero: the divisor (rhs of {op}) has a zero element, where PyTorch raises "
        "too; make the divisor nonzero first, e.g. where(rhs == 0, 1, rhs), or divide floats")


def _np_check_divisor(op: str, a: np.ndarray, b: np.ndarray) -> None:
    """Raise where an integer divisor element is 0. A broadcast result is empty exactly when an
    operand is, and then nothing is divided."""
    if a.size and b.size and not np.all(b):
        raise _zero_divisor_error(op)


def _torch_check_divisor(op: str, a, b) -> None:
    # One host sync on an accelerator; integer division is rare in models and a wrong value is
    # worse (a CUDA kernel gives -1 or garbage where the CPU kernel raises).
    if a.numel() and b.numel() and not bool(torch.all(b)):
        raise _zero_divisor_error(op)


def _np_safe_divisor(b):
    """Integer divisors 0 and -1 replaced by 1 (after the zero check): x % 1 == x % -1 == 0, and
    no INT_MIN / -1 (undefined in C, a trap on x86) is attempted."""
    trivial = (b == 0) | (b == -1) if b.dtype.kind == "i" else (b == 0)
    return np.where(trivial, np.ones((), b.dtype), b)


def _torch_safe_divisor(b):
    trivial = (b == 0) | (b == -1) if b.dtype.is_signed else (b == 0)
    return torch.where(trivial, torch.ones_like(b), b)


def _np_mod(name: str, np_fn):
    def mod(a, b):
        if a.dtype.kind in "iu" and b.dtype.kind in "iu":
            _np_check_divisor(name, a, b)
            return np_fn(a, _np_safe_divisor(b))
        with np.errstate(divide="ignore", invalid="ignore"):
            return np_fn(a, b)
    return mod


def _np_remainder_float(a, b):
    # NumPy's remainder is Python's %: the result takes the divisor's sign (-0.0 for a zero
    # result of a negative divisor), x % +-inf is x or +-inf by the signs, inf % y and x % 0 NaN.
    return np.remainder(a, b)


def _torch_mod(name: str, torch_fn, floats):
    def mod(a, b):
        if a.is_floating_point() or b.is_floating_point():
            return floats(a, b)
        _torch_check_divisor(name, a, b)
        return torch_fn(a, _torch_safe_divisor(b))
    return mod


def _torch_remainder_float(a, b):
    # fmod, moved into the divisor's sign as Python does (torch.remainder gives +0.0 where
    # Python gives -0.0).
    r = torch.fmod(a, b)
    move = (r != 0) & ((r < 0) != (b < 0))
    r = torch.where(move, r + b, r)
    return torch.where(r == 0, torch.copysign(torch.zeros_like(r), b), r)


_binary("remainder", _np_mod("remainder", np.remainder),
        _torch_mod("remainder", lambda x, y: torch.remainder(x, y), _torch_remainder_float), "numeric",
        "lhs mod rhs with the divisor's sign (Python's %); integers: exact, a zero divisor raises "
        "IntegerDivisionByZeroError at run time, INT_MIN % -1 is 0; floats: x % 0 is NaN")
_binary("fmod", _np_mod("fmod", np.fmod), _torch_mod("fmod", lambda x, y: torch.fmod(x, y), lambda x, y: torch.fmod(x, y)), "numeric",
        "C's fmod: lhs - trunc(lhs / rhs) * rhs, with the dividend's sign; integers: exact, a zero "
        "divisor raises IntegerDivisionByZeroError at run time, fmod(INT_MIN, -1) is 0; floats: "
        "fmod(x, 0) is NaN")


# --- integer division ------------------------------------------------------------------------

def _int_div_infer(ts: list[TensorType], attrs: dict) -> TensorType:
    a, b = ts
    shape = broadcast_shapes(a.shape, b.shape, op="int_div")
    for which, t in (("lhs", a), ("rhs", b)):
        if not t.dtype.is_int:
            raise TypeRuleError(f"int_div takes integer tensors; {which} is {t} (for floats use div, then "
                                "floor or trunc; cast a bool to an integer dtype first)")
    return TensorType(shape, promote(a.dtype, b.dtype))


def _np_int_div(args, attrs):
    a, b = args
    dt = promote(from_numpy(a.dtype), from_numpy(b.dtype)).np
    a, b = a.astype(dt, copy=False), b.astype(dt, copy=False)
    _np_check_divisor("int_div", a, b)
    safe = _np_safe_divisor(b)
    q = np.floor_divide(a, safe)
    if dt.kind == "u":
        return q  # floor and trunc agree
    if attrs["rounding"] == "trunc":
        # One up where floor went below a negative, inexact quotient; q + 1 cannot overflow there.
        q = q + ((np.remainder(a, safe) != 0) & ((a < 0) != (safe < 0))).astype(dt)
    # x / -1 is -x, wrapping (INT_MIN / -1 is INT_MIN, as PyTorch's floor division gives).
    return np.where(b == -1, np.negative(a), q)


def _torch_int_div(args, attrs):
    a, b = args
    dt = torch.promote_types(a.dtype, b.dtype)
    a, b = a.to(dt), b.to(dt)
    _torch_check_divisor("int_div", a, b)
    # torch's truncating kernel traps (SIGFPE) on INT_MIN / -1: divisors -1 become negations.
    q = torch.div(a, _torch_safe_divisor(b), rounding_mode=attrs["rounding"])
    return torch.where(b == -1, torch.neg(a), q) if dt.is_signed else q


register(OpDef(
    name="int_div", operands=("lhs", "rhs"), infer=_int_div_infer, reference=_np_int_div, torch=_torch_int_div,
    attrs=(AttrSpec("rounding", "str", choices=("floor", "trunc")),),
    doc="integer division of integer tensors (broadcast, promoted), exact in every integer dtype: "
        "rounding='floor' rounds the quotient down (Python's //, torch.div(rounding_mode='floor')), "
        "'trunc' toward zero (C's /, ONNX Div); x / -1 is -x, wrapping (INT_MIN / -1 is INT_MIN); a zero "
        "divisor raises IntegerDivisionByZeroError at run time, as PyTorch raises",
    elementwise=True, right_identity=1.0,
))
