"""ONNX's elementwise math, activation, logic and bitwise operators, and Gemm.

The arithmetic (Add, Sub, Mul, Div, Pow, MatMul, Sum, Max, Min, Clip, Sign, Neg, Abs, ...) and
the activations of the core importer (Relu, Sigmoid, Tanh, LeakyRelu, Elu, Selu, PRelu,
Softplus, Softsign, Shrink) are one partita op each or a short composition of them.

The inverse and hyperbolic trigonometric functions, Floor/Ceil/Round, IsNaN/IsInf, the
Bitwise* ops, BitShift and Mod map onto partita's core ops of the same meaning
(partita/ops/elementwise.py), whose integer semantics are exact; the activations (Gelu,
HardSigmoid, HardSwish, Mish, Celu, ThresholdedRelu, Swish, SwiGLU), Reciprocal, Mean and
the comparisons compose existing ops as the ONNX specification defines them.

Checked at import, each error naming the node: attribute values outside what the
specification allows (Gelu's ``approximate``, BitShift's ``direction``, Mod's ``fmod``,
Celu's ``alpha`` of 0), operand dtypes an operator does not take (And/Or/Xor/Not need bool,
the bitwise ops integers), and SwiGLU operands of different shapes.
"""

from __future__ import annotations

from ...ir import dtypes as dt
from ...ir.graph import Value
from ...ops.registry import TypeRuleError, broadcast_shapes
from .common import Converter, OnnxNode, attr_text, cast_attrs
from .registry import converter


def _float_attr(n: OnnxNode, name: str, default: float) -> float:
    return float(n.attr(name, default))


def _needs(n: OnnxNode, v: Value, what: str, ok: bool, want: str) -> None:
    if not ok:
        raise n.error(f"{what} is {v.type}; {n.proto.op_type} takes {want} tensors")


def _float_input(n: OnnxNode, i: int = 0) -> Value:
    x = n.input(i)
    _needs(n, x, f"input {i}", x.type.dtype.is_float, "floating-point")
    return x


def _bool_binary(op: str) -> Converter:
    def convert(n: OnnxNode) -> list[Value | None]:
        a, b = n.input(0), n.input(1)
        for i, v in enumerate((a, b)):
            _needs(n, v, f"input {i}", v.type.dtype.is_bool, "bool")
        return [n.emit(op, a, b)]
    return convert


@converter("Not")
def _not(n: OnnxNode) -> list[Value | None]:
    x = n.input(0)
    _needs(n, x, "input 0", x.type.dtype.is_bool, "bool")
    return [n.emit("logical_not", x)]


def _bitwise(op: str) -> Converter:
    def convert(n: OnnxNode) -> list[Value | None]:
        vals = [n.input(i) for i in range(len(n.inputs))]
        for i, v in enumerate(vals):
            _needs(n, v, f"input {i}", v.type.dtype.is_int, "integer")
        return [n.emit(op, *vals)]
    return convert


@converter("BitShift")
def _bit_shift(n: OnnxNode) -> list[Value | None]:
    direction = attr_text(n.attr("direction", ""))
    ops = {"LEFT": "bitwise_left_shift", "RIGHT": "bitwise_right_shift"}
    if direction not in ops:
        raise n.error(f"attribute 'direction' is {direction!r}; it must be 'LEFT' or 'RIGHT'")
    x, y = n.input(0), n.input(1)
    for i, v in enumerate((x, y)):
        _needs(n, v, f"input {i}", v.type.dtype.is_int, "integer")
    if y.type.dtype is not x.type.dtype:
        raise n.error(f"the shift amount {y.type} must have the input's dtype {x.type.dtype.name}")
    return [n.emit(ops[direction], x, y)]


@converter("Mod")
def _mod(n: OnnxNode) -> list[Value | None]:
    fmod = n.attr("fmod", 0)
    if fmod not in (0, 1):
        raise n.error(f"attribute 'fmod' is {fmod}; it must be 0 (the divisor's sign, Python's %) "
                      "or 1 (the dividend's sign, C's fmod)")
    a, b = n.input(0), n.input(1)
    for i, v in enumerate((a, b)):
        _needs(n, v, f"input {i}", v.type.dtype.is_int or v.type.dtype.is_float, "integer or floating-point")
    return [n.emit("fmod" if fmod else "remainder", a, b)]


@converter("IsInf")
def _is_inf(n: OnnxNode) -> list[Value | None]:
    x = _float_input(n)
    pos, neg = bool(n.attr("detect_positive", 1)), bool(n.attr("detect_negative", 1))
    if pos and neg:
        return [n.emit("isinf", x)]
    if pos or neg:
        return [n.emit("equal", x, n.scalar(float("inf") if pos else -float("inf"), x))]
    # Neither sign asked for: nothing is detected.
    return [n.emit("full", shape=list(x.type.shape), value=0.0, dtype=dt.bool_)]


@converter("Reciprocal")
def _reciprocal(n: OnnxNode) -> list[Value | None]:
    x = _float_input(n)
    return [n.emit("div", n.scalar(1.0, x), x)]


@converter("Gelu")
def _gelu(n: OnnxNode) -> list[Value | None]:
    approximate = attr_text(n.attr("approximate", "none"))
    if approximate not in ("none", "tanh"):
        raise n.error(f"attribute 'approximate' is {approximate!r}; it must be 'none' (the erf form) or 'tanh'")
    return [n.emit("gelu", _float_input(n), approximate=approximate)]


def _hard_sigmoid_of(n: OnnxNode, x: Value, alpha: float, beta: float) -> Value:
    y = n.emit("add", n.emit("mul", x, n.scalar(alpha, x)), n.scalar(beta, x))
    return n.emit("maximum", n.emit("minimum", y, n.scalar(1.0, x)), n.scalar(0.0, x))


@converter("HardSigmoid")
def _hard_sigmoid(n: OnnxNode) -> list[Value | None]:
    x = _float_input(n)
    return [_hard_sigmoid_of(n, x, _float_attr(n, "alpha", 0.2), _float_attr(n, "beta", 0.5))]


@converter("HardSwish")
def _hard_swish(n: OnnxNode) -> list[Value | None]:
    # x * HardSigmoid(x) with alpha = 1/6, beta = 0.5, as the specification defines it.
    x = _float_input(n)
    return [n.emit("mul", x, _hard_sigmoid_of(n, x, 1.0 / 6.0, 0.5))]


@converter("Mish")
def _mish(n: OnnxNode) -> list[Value | None]:
    # x * tanh(softplus(x)), softplus(x) = max(x, 0) + log(1 + exp(-|x|)) (no overflow).
    x = _float_input(n)
    soft = n.emit("add", n.emit("maximum", x, n.scalar(0.0, x)),
                  n.emit("log", n.emit("add", n.scalar(1.0, x), n.emit("exp", n.emit("neg", n.emit("abs", x))))))
    return [n.emit("mul", x, n.emit("tanh", soft))]


@converter("Celu")
def _celu(n: OnnxNode) -> list[Value | None]:
    x = _float_input(n)
    alpha = _float_attr(n, "alpha", 1.0)
    if alpha == 0.0:
        raise n.error("attribute 'alpha' is 0; Celu divides by it (max(0, x) + min(0, alpha * (exp(x / alpha) - 1)))")
    zero = n.scalar(0.0, x)
    e = n.emit("exp", n.emit("div", x, n.scalar(alpha, x)))
    neg = n.emit("mul", n.emit("sub", e, n.scalar(1.0, x)), n.scalar(alpha, x))
    return [n.emit("add", n.emit("maximum", x, zero), n.emit("minimum", neg, zero))]


@converter("ThresholdedRelu")
def _thresholded_relu(n: OnnxNode) -> list[Value | None]:
    x = _float_input(n)
    alpha = _float_attr(n, "alpha", 1.0)
    return [n.emit("where", n.emit("greater", x, n.scalar(alpha, x)), x, n.scalar(0.0, x))]


def _swish_of(n: OnnxNode, x: Value, alpha: float) -> Value:
    if alpha == 1.0:
        return n.emit("silu", x)
    return n.emit("mul", x, n.emit("sigmoid", n.emit("mul", x, n.scalar(alpha, x))))


@converter("Swish")
def _swish(n: OnnxNode) -> list[Value | None]:
    return [_swish_of(n, _float_input(n), _float_attr(n, "alpha", 1.0))]


@converter("SwiGLU")
def _swiglu(n: OnnxNode) -> list[Value | None]:
    a, b = _float_input(n, 0), _float_input(n, 1)
    if a.type.shape != b.type.shape or a.type.dtype is not b.type.dtype:
        raise n.error(f"the gate A {a.type} and the value B {b.type} must have one shape and dtype "
                      "(SwiGLU does not broadcast); split or expand them before the node")
    return [n.emit("mul", _swish_of(n, a, _float_attr(n, "alpha", 1.0)), b)]


@converter("Mean")
def _mean(n: OnnxNode) -> list[Value | None]:
    vals = [n.input(i) for i in range(len(n.inputs))]
    if not vals:
        raise n.error("Mean needs at least one input")
    for i, v in enumerate(vals):
        _needs(n, v, f"input {i}", v.type.dtype.is_float, "floating-point")
    acc = vals[0]
    for v in vals[1:]:
        acc = n.emit("add", acc, v)
    return [acc if len(vals) == 1 else n.emit("div", acc, n.scalar(float(len(vals)), acc))]


@converter("CastLike")
def _cast_like(n: OnnxNode) -> list[Value | None]:
    return [n.emit("cast", n.input(0), dtype=n.input(1).type.dtype, **cast_attrs(n))]


# --- arithmetic and activations of the core importer ----------------------------------------

@converter("Div")
def _div(n: OnnxNode) -> list[Value | None]:
    x, y = n.input(0), n.input(1)
    if x.type.dtype.is_float:
        return [n.emit("div", x, y)]
    # ONNX integer Div truncates toward zero and keeps the integer type (partita's div is true
    # division). ONNX leaves a zero divisor undefined; int_div raises there, as PyTorch does.
    return [n.emit("int_div", x, y, rounding="trunc")]


@converter("Pow")
def _pow(n: OnnxNode) -> list[Value | None]:
    x, y = n.input(0), n.input(1)
    # ONNX Pow keeps the base's type whatever the exponent's; partita would promote.
    if y.type.dtype is not x.type.dtype:
        y = n.emit("cast", y, dtype=x.type.dtype)
    return [n.emit("pow", x, y)]


def _variadic(op: str) -> Converter:
    """Sum/Max/Min/Mean over any number of broadcasting inputs, folded left to right."""
    def convert(n: OnnxNode) -> list[Value | None]:
        vals = [n.input(i) for i in range(len(n.inputs))]
        acc = vals[0]
        for v in vals[1:]:
            acc = n.emit(op, acc, v)
        return [acc]
    return convert


@converter("LeakyRelu")
def _leaky_relu(n: OnnxNode) -> list[Value | None]:
    x = n.input(0)
    neg = n.emit("mul", x, n.scalar(float(n.attr("alpha", 0.01)), x))
    return [n.emit("where", n.emit("less", x, n.scalar(0, x)), neg, x)]


def _elu_like(n: OnnxNode, alpha: float, gamma: float) -> Value:
    x = n.input(0)
    neg = n.emit("mul", n.emit("sub", n.emit("exp", x), n.scalar(1, x)), n.scalar(alpha, x))
    y = n.emit("where", n.emit("less", x, n.scalar(0, x)), neg, x)
    return y if gamma == 1.0 else n.emit("mul", y, n.scalar(gamma, x))


@converter("Elu")
def _elu(n: OnnxNode) -> list[Value | None]:
    return [_elu_like(n, float(n.attr("alpha", 1.0)), 1.0)]


@converter("Selu")
def _selu(n: OnnxNode) -> list[Value | None]:
    return [_elu_like(n, float(n.attr("alpha", 1.67326319217681884765625)),
                      float(n.attr("gamma", 1.05070102214813232421875)))]


@converter("PRelu")
def _prelu(n: OnnxNode) -> list[Value | None]:
    x, slope = n.input(0), n.input(1)
    try:
        broadcast_shapes(tuple(x.type.shape), tuple(slope.type.shape))
    except TypeRuleError:
        # Opset < 7 applied a 1-D slope per channel (axis 1); the version converter keeps
        # such models as they are, so read the slope that way when it cannot broadcast.
        if slope.type.rank == 1 and x.type.rank >= 2 and slope.type.shape[0] == x.type.shape[1]:
            slope = n.emit("reshape", slope, shape=[slope.type.shape[0]] + [1] * (x.type.rank - 2))
    return [n.emit("where", n.emit("less", x, n.scalar(0, x)), n.emit("mul", x, slope), x)]


@converter("Softplus")
def _softplus(n: OnnxNode) -> list[Value | None]:
    x = n.input(0)
    return [n.emit("log", n.emit("add", n.emit("exp", x), n.scalar(1, x)))]


@converter("Softsign")
def _softsign(n: OnnxNode) -> list[Value | None]:
    x = n.input(0)
    return [n.emit("div", x, n.emit("add", n.emit("abs", x), n.scalar(1, x)))]


@converter("Sign")
def _sign(n: OnnxNode) -> list[Value | None]:
    x = n.input(0)
    zero = n.scalar(0, x)
    pos = n.emit("cast", n.emit("greater", x, zero), dtype=x.type.dtype)
    neg = n.emit("cast", n.emit("less", x, zero), dtype=x.type.dtype)
    return [n.emit("sub", pos, neg)]


@converter("Clip")
def _clip(n: OnnxNode) -> list[Value | None]:
    y = n.input(0)
    if n.has_input(1):
        y = n.emit("maximum", y, n.input(1))
    if n.has_input(2):
        y = n.emit("minimum", y, n.input(2))
    return [y]


@converter("Shrink")
def _shrink(n: OnnxNode) -> list[Value | None]:
    x = n.input(0)
    lambd, bias = float(n.attr("lambd", 0.5)), float(n.attr("bias", 0.0))
    lo = n.emit("less", x, n.scalar(-lambd, x))
    hi = n.emit("greater", x, n.scalar(lambd, x))
    inner = n.emit("where", hi, n.emit("sub", x, n.scalar(bias, x)), n.scalar(0, x))
    return [n.emit("where", lo, n.emit("add", x, n.scalar(bias, x)), inner)]


@converter("Gemm")
def _gemm(n: OnnxNode) -> list[Value | None]:
    a, b = n.input(0), n.input(1)
    if a.type.rank != 2 or b.type.rank != 2:
        raise n.error(f"A {a.type} and B {b.type} must both be 2-D")
    if n.attr("transA", 0):
        a = n.emit("transpose", a, perm=[1, 0])
    if n.attr("transB", 0):
        b = n.emit("transpose", b, perm=[1, 0])
    y = n.emit("matmul", a, b)
    alpha, beta = float(n.attr("alpha", 1.0)), float(n.attr("beta", 1.0))
    if alpha != 1.0:
        y = n.emit("mul", y, n.scalar(alpha, y))
    if n.has_input(2) and beta != 0.0:
        c = n.input(2)
        if beta != 1.0:
            c = n.emit("mul", c, n.scalar(beta, c))
        y = n.emit("add", y, c)
    return [y]


# --- one partita op per node, and the op families made by a factory -------------------------

# ONNX op type -> the partita op of a one-input node that is exactly that op.
_UNARY_OPS: dict[str, str] = {
    "Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Erf": "erf", "Sqrt": "sqrt", "Neg": "neg",
    "Exp": "exp", "Log": "log", "Abs": "abs",
    "Sin": "sin", "Cos": "cos", "Tan": "tan", "Asin": "asin", "Acos": "acos", "Atan": "atan", "Sinh": "sinh",
    "Cosh": "cosh", "Asinh": "asinh", "Acosh": "acosh", "Atanh": "atanh",
    "Floor": "floor", "Ceil": "ceil", "Round": "round",
}
# ONNX op type -> the partita op of a two-input node that is exactly that op (partita's binary
# ops broadcast as NumPy does, which is ONNX's multidirectional rule).
_BINARY_OPS: dict[str, str] = {
    "Add": "add", "Sub": "sub", "Mul": "mul", "MatMul": "matmul", "Equal": "equal", "Less": "less",
    "Greater": "greater", "GreaterOrEqual": "greater_equal", "LessOrEqual": "less_equal",
}


@converter(*_UNARY_OPS)
def _unary(n: OnnxNode) -> list[Value | None]:
    """A one-input node that is one partita op."""
    return [n.emit(_UNARY_OPS[n.proto.op_type], n.input(0))]


@converter(*_BINARY_OPS)
def _binary(n: OnnxNode) -> list[Value | None]:
    """A two-input node that is one partita op."""
    return [n.emit(_BINARY_OPS[n.proto.op_type], n.input(0), n.input(1))]


@converter("Where")
def _where(n: OnnxNode) -> list[Value | None]:
    return [n.emit("where", n.input(0), n.input(1), n.input(2))]


@converter("IsNaN")
def _is_nan(n: OnnxNode) -> list[Value | None]:
    return [n.emit("isnan", _float_input(n))]


_FOLDS: dict[str, Converter] = {"Sum": _variadic("add"), "Max": _variadic("maximum"), "Min": _variadic("minimum")}
_LOGIC: dict[str, Converter] = {
    "And": _bool_binary("logical_and"), "Or": _bool_binary("logical_or"), "Xor": _bool_binary("not_equal"),
    "BitwiseAnd": _bitwise("bitwise_and"), "BitwiseOr": _bitwise("bitwise_or"),
    "BitwiseXor": _bitwise("bitwise_xor"), "BitwiseNot": _bitwise("bitwise_not"),
}


@converter(*_FOLDS)
def _fold(n: OnnxNode) -> list[Value | None]:
    """Sum, Max and Min: their op folded over the inputs."""
    return list(_FOLDS[n.proto.op_type](n))


@converter(*_LOGIC)
def _logic(n: OnnxNode) -> list[Value | None]:
    """The boolean (And, Or, Xor) and bitwise ops, their operand dtypes checked."""
    return list(_LOGIC[n.proto.op_type](n))
