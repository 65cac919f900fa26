"""ONNX's elementwise math, activation, logic and bitwise operators.

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

from ..ir import dtypes as dt
from ..ir.graph import Value
from .onnx_common import ONNX_TO_PARTITA, OnnxNode, attr_text, binary_converter, cast_attrs, unary_converter


def _float_attr(n: OnnxNode, name: str, default: float) -> float:
    return float(n.attr(name, default))


def _needs(n: OnnxNode, v: Value, what: str, ok: bool, want: str) -> None:
    if not ok:
        raise n.error(f"{what} is {v.type}; {n.proto.op_type} takes {want} tensors")


def _float_input(n: OnnxNode, i: int = 0) -> Value:
    x = n.input(i)
    _needs(n, x, f"input {i}", x.type.dtype.is_float, "floating-point")
    return x


def _bool_binary(op: str):
    def convert(n: OnnxNode) -> list[Value | None]:
        a, b = n.input(0), n.input(1)
        for i, v in enumerate((a, b)):
            _needs(n, v, f"input {i}", v.type.dtype.is_bool, "bool")
        return [n.emit(op, a, b)]
    return convert


def _not(n: OnnxNode) -> list[Value | None]:
    x = n.input(0)
    _needs(n, x, "input 0", x.type.dtype.is_bool, "bool")
    return [n.emit("logical_not", x)]


def _bitwise(op: str):
    def convert(n: OnnxNode) -> list[Value | None]:
        vals = [n.input(i) for i in range(len(n.inputs))]
        for i, v in enumerate(vals):
            _needs(n, v, f"input {i}", v.type.dtype.is_int, "integer")
        return [n.emit(op, *vals)]
    return convert


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


def _mod(n: OnnxNode) -> list[Value | None]:
    fmod = n.attr("fmod", 0)
    if fmod not in (0, 1):
        raise n.error(f"attribute 'fmod' is {fmod}; it must be 0 (the divisor's sign, Python's %) "
                      "or 1 (the dividend's sign, C's fmod)")
    a, b = n.input(0), n.input(1)
    for i, v in enumerate((a, b)):
        _needs(n, v, f"input {i}", v.type.dtype.is_int or v.type.dtype.is_float, "integer or floating-point")
    return [n.emit("fmod" if fmod else "remainder", a, b)]


def _is_inf(n: OnnxNode) -> list[Value | None]:
    x = _float_input(n)
    pos, neg = bool(n.attr("detect_positive", 1)), bool(n.attr("detect_negative", 1))
    if pos and neg:
        return [n.emit("isinf", x)]
    if pos or neg:
        return [n.emit("equal", x, n.scalar(float("inf") if pos else -float("inf"), x))]
    # Neither sign asked for: nothing is detected.
    return [n.emit("full", shape=list(x.type.shape), value=0.0, dtype=dt.bool_)]


def _reciprocal(n: OnnxNode) -> list[Value | None]:
    x = _float_input(n)
    return [n.emit("div", n.scalar(1.0, x), x)]


def _gelu(n: OnnxNode) -> list[Value | None]:
    approximate = attr_text(n.attr("approximate", "none"))
    if approximate not in ("none", "tanh"):
        raise n.error(f"attribute 'approximate' is {approximate!r}; it must be 'none' (the erf form) or 'tanh'")
    return [n.emit("gelu", _float_input(n), approximate=approximate)]


def _hard_sigmoid_of(n: OnnxNode, x: Value, alpha: float, beta: float) -> Value:
    y = n.emit("add", n.emit("mul", x, n.scalar(alpha, x)), n.scalar(beta, x))
    return n.emit("maximum", n.emit("minimum", y, n.scalar(1.0, x)), n.scalar(0.0, x))


def _hard_sigmoid(n: OnnxNode) -> list[Value | None]:
    x = _float_input(n)
    return [_hard_sigmoid_of(n, x, _float_attr(n, "alpha", 0.2), _float_attr(n, "beta", 0.5))]


def _hard_swish(n: OnnxNode) -> list[Value | None]:
    # x * HardSigmoid(x) with alpha = 1/6, beta = 0.5, as the specification defines it.
    x = _float_input(n)
    return [n.emit("mul", x, _hard_sigmoid_of(n, x, 1.0 / 6.0, 0.5))]


def _mish(n: OnnxNode) -> list[Value | None]:
    # x * tanh(softplus(x)), softplus(x) = max(x, 0) + log(1 + exp(-|x|)) (no overflow).
    x = _float_input(n)
    soft = n.emit("add", n.emit("maximum", x, n.scalar(0.0, x)),
                  n.emit("log", n.emit("add", n.scalar(1.0, x), n.emit("exp", n.emit("neg", n.emit("abs", x))))))
    return [n.emit("mul", x, n.emit("tanh", soft))]


def _celu(n: OnnxNode) -> list[Value | None]:
    x = _float_input(n)
    alpha = _float_attr(n, "alpha", 1.0)
    if alpha == 0.0:
        raise n.error("attribute 'alpha' is 0; Celu divides by it (max(0, x) + min(0, alpha * (exp(x / alpha) - 1)))")
    zero = n.scalar(0.0, x)
    e = n.emit("exp", n.emit("div", x, n.scalar(alpha, x)))
    neg = n.emit("mul", n.emit("sub", e, n.scalar(1.0, x)), n.scalar(alpha, x))
    return [n.emit("add", n.emit("maximum", x, zero), n.emit("minimum", neg, zero))]


def _thresholded_relu(n: OnnxNode) -> list[Value | None]:
    x = _float_input(n)
    alpha = _float_attr(n, "alpha", 1.0)
    return [n.emit("where", n.emit("greater", x, n.scalar(alpha, x)), x, n.scalar(0.0, x))]


def _swish_of(n: OnnxNode, x: Value, alpha: float) -> Value:
    if alpha == 1.0:
        return n.emit("silu", x)
    return n.emit("mul", x, n.emit("sigmoid", n.emit("mul", x, n.scalar(alpha, x))))


def _swish(n: OnnxNode) -> list[Value | None]:
    return [_swish_of(n, _float_input(n), _float_attr(n, "alpha", 1.0))]


def _swiglu(n: OnnxNode) -> list[Value | None]:
    a, b = _float_input(n, 0), _float_input(n, 1)
    if a.type.shape != b.type.shape or a.type.dtype is not b.type.dtype:
        raise n.error(f"the gate A {a.type} and the value B {b.type} must have one shape and dtype "
                      "(SwiGLU does not broadcast); split or expand them before the node")
    return [n.emit("mul", _swish_of(n, a, _float_attr(n, "alpha", 1.0)), b)]


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


def _cast_like(n: OnnxNode) -> list[Value | None]:
    return [n.emit("cast", n.input(0), dtype=n.input(1).type.dtype, **cast_attrs(n))]


ONNX_TO_PARTITA.update({
    "Sin": unary_converter("sin"), "Cos": unary_converter("cos"), "Tan": unary_converter("tan"), "Asin": unary_converter("asin"),
    "Acos": unary_converter("acos"), "Atan": unary_converter("atan"), "Sinh": unary_converter("sinh"), "Cosh": unary_converter("cosh"),
    "Asinh": unary_converter("asinh"), "Acosh": unary_converter("acosh"), "Atanh": unary_converter("atanh"),
    "Floor": unary_converter("floor"), "Ceil": unary_converter("ceil"), "Round": unary_converter("round"),
    "Reciprocal": _reciprocal, "Gelu": _gelu, "HardSigmoid": _hard_sigmoid, "HardSwish": _hard_swish,
    "Mish": _mish, "Celu": _celu, "ThresholdedRelu": _thresholded_relu, "Swish": _swish, "SwiGLU": _swiglu,
    "And": _bool_binary("logical_and"), "Or": _bool_binary("logical_or"), "Xor": _bool_binary("not_equal"),
    "Not": _not, "IsNaN": lambda n: [n.emit("isnan", _float_input(n))], "IsInf": _is_inf,
    "GreaterOrEqual": binary_converter("greater_equal"), "LessOrEqual": binary_converter("less_equal"),
    "BitwiseAnd": _bitwise("bitwise_and"), "BitwiseOr": _bitwise("bitwise_or"),
    "BitwiseXor": _bitwise("bitwise_xor"), "BitwiseNot": _bitwise("bitwise_not"), "BitShift": _bit_shift,
    "Mod": _mod, "Mean": _mean, "CastLike": _cast_like,
})
