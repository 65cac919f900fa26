"""ONNX's quantization operators, onto partita's ``quantize_linear``, ``dequantize_linear`` and
``matmul_integer`` (partita/ops/quant.py).

What quantizers write: the QDQ form (QuantizeLinear / DequantizeLinear pairs around float
ops, with int8 or uint8 weights stored as initializers: ONNX Runtime's ``quantize_static``
with ``QuantFormat.QDQ``, and most exporters' quantized models), and the dynamic form
(``DynamicQuantizeLinear`` of the activation and ``MatMulInteger``: ``quantize_dynamic``).

Checked at import, each error naming the node: a scale that is missing, not a float, or
(when it is a constant) not positive and finite; a zero point whose dtype is not one
partita quantizes to (i8, u8, i16, u16), or, as a constant, outside that dtype's range, or
of another shape than the scale's; ``block_size`` that does not fit; float8 and 4-bit
targets (not supported).
"""

from __future__ import annotations

import numpy as np

from ...ir import dtypes as dt
from ...ir.attrs import DenseAttr
from ...ir.graph import Value
from ...ops.quant import QUANT_DTYPES, qrange
from .common import OnnxNode, onnx_dtype
from .registry import converter


def _scale(n: OnnxNode, i: int) -> Value:
    if not n.has_input(i):
        raise n.error(f"the scale (input {i}) is missing; a quantized tensor needs its scale")
    s = _per_tensor(n, n.input(i))
    if not s.type.dtype.is_float:
        raise n.error(f"the scale (input {i}) is {s.type}; it must be a float tensor")
    arr = n.ctx.consts.get(n.proto.input[i])
    if arr is not None:
        a = np.asarray(arr, np.float64)
        if not np.all(np.isfinite(a)) or np.any(a <= 0):
            raise n.error(f"the scale (input {i}, '{n.proto.input[i]}') holds {_bad(a)}; scales must be positive "
                          "and finite (the quantizer that wrote the model failed)")
    return s


def _bad(a: np.ndarray) -> str:
    bad = a[~np.isfinite(a) | (a <= 0)]
    return f"{bad.size} value(s) that are zero, negative or not finite (e.g. {bad.ravel()[0]})"


def _zero_point(n: OnnxNode, i: int, scale: Value, default: dt.DType, allow_i32: bool = False) -> Value:
    """The zero point of input ``i``, checked; zeros of ``default`` with the scale's shape if absent."""
    if not n.has_input(i):
        return n.emit("constant", value=DenseAttr(np.zeros(scale.type.shape, default.np)))
    z = _per_tensor(n, n.input(i))
    ok = QUANT_DTYPES + ((dt.i32,) if allow_i32 else ())
    if z.type.dtype not in ok:
        raise n.error(f"the zero point (input {i}) is {z.type}; partita quantizes to "
                      f"{', '.join(d.name for d in ok)} (float8 and 4-bit forms are not supported)")
    if z.type.shape != scale.type.shape:
        raise n.error(f"the zero point (input {i}) {z.type} must have the scale's shape {list(scale.type.shape)}")
    arr = n.ctx.consts.get(n.proto.input[i])
    if arr is not None:
        lo, hi = qrange(z.type.dtype)
        a = np.asarray(arr).astype(np.int64)
        if a.size and (a.min() < lo or a.max() > hi):
            raise n.error(f"the zero point (input {i}) holds {a.min()}..{a.max()}, outside {z.type.dtype}'s range "
                          f"{lo}..{hi}")
        if z.type.dtype is dt.i32 and np.any(a != 0):
            raise n.error("an i32 input takes a zero point of 0 (ONNX DequantizeLinear); this one is not")
    return z


def _granularity(n: OnnxNode, x: Value, scale: Value) -> dict:
    block = int(n.attr("block_size", 0))
    axis = int(n.attr("axis", 1))
    if scale.type.rank == 0 or (scale.type.rank == 1 and scale.type.shape[0] == 1 and block == 0):
        return {"axis": 1 if x.type.rank > 1 else 0, "block_size": 0}
    if x.type.rank == 0 or not -x.type.rank <= axis < x.type.rank:
        raise n.error(f"axis {axis} is out of range for the input {x.type}")
    return {"axis": axis % x.type.rank, "block_size": block}


def _per_tensor(n: OnnxNode, v: Value) -> Value:
    """A [1] scale or zero point (some quantizers write them so) as a scalar."""
    if v.type.rank == 1 and v.type.shape[0] == 1:
        return n.emit("reshape", v, shape=())
    return v


# Storage types (partita casts to and from them, computes in none): quantized by a cast, which
# rounds half to even and saturates (float8 saturation per the node's 'saturate').
_STORAGE = (dt.f8e4m3fn, dt.f8e4m3fnuz, dt.f8e5m2, dt.f8e5m2fnuz, dt.f4e2m1, dt.i4, dt.u4, dt.i2, dt.u2)


def _along(n: OnnxNode, s: Value, x: Value, g: dict) -> Value:
    """A scale or zero point shaped to broadcast against ``x`` (per tensor or per axis)."""
    if s.type.rank == 0:
        return s
    if g["block_size"]:
        raise n.error(f"block quantization (block_size={g['block_size']}) to {x.type.dtype.name} is not supported")
    shape = [1] * x.type.rank
    shape[g["axis"]] = s.type.shape[0]
    return n.emit("reshape", s, shape=shape)


def _storage_quantize(n: OnnxNode, x: Value, scale: Value, zp: Value, g: dict) -> Value:
    y = n.emit("div", x, _along(n, n.emit("cast", scale, dtype=x.type.dtype), x, g))
    zf = n.emit("cast", zp, dtype=x.type.dtype)
    y = n.emit("add", y, _along(n, zf, x, g))
    return n.emit("cast", y, dtype=zp.type.dtype, saturate=bool(n.attr("saturate", 1)))


def _storage_dequantize(n: OnnxNode, q: Value, scale: Value, zp: Value, g: dict) -> Value:
    f = scale.type.dtype
    centred = n.emit("sub", n.emit("cast", q, dtype=f), _along(n, n.emit("cast", zp, dtype=f), q, g))
    return n.emit("mul", centred, _along(n, scale, q, g))


def _storage_zero_point(n: OnnxNode, i: int, scale: Value, default: dt.DType) -> Value:
    if not n.has_input(i):
        return n.emit("cast", n.emit("constant", value=DenseAttr(np.zeros(scale.type.shape, np.float32))),
                      dtype=default)
    z = _per_tensor(n, n.input(i))
    if z.type.shape != scale.type.shape:
        raise n.error(f"the zero point (input {i}) {z.type} must have the scale's shape {list(scale.type.shape)}")
    return z


@converter("QuantizeLinear")
def _quantize_linear(n: OnnxNode) -> list[Value | None]:
    x = n.input(0)
    scale = _scale(n, 1)
    out_dtype = n.attr("output_dtype", 0)
    default = onnx_dtype(out_dtype, f"{n.where}: attribute 'output_dtype'") if out_dtype else dt.u8
    target = n.ctx.values[n.proto.input[2]].type.dtype if n.has_input(2) else default
    if target in _STORAGE:
        g = _granularity(n, x, scale)
        zp = _per_tensor(n, _storage_zero_point(n, 2, scale, target))
        return [_storage_quantize(n, x, _per_tensor(n, scale), zp, g)]
    zp = _zero_point(n, 2, scale, default)
    if out_dtype and zp.type.dtype is not default:
        raise n.error(f"output_dtype {default.name} differs from the zero point's dtype {zp.type.dtype.name}")
    if not x.type.dtype.is_float:
        raise n.error(f"the input {x.type} must be a float tensor (int32 inputs are not supported)")
    g = _granularity(n, x, scale)
    scale, zp = _per_tensor(n, scale), _per_tensor(n, zp)
    if scale.type.dtype is not x.type.dtype:
        scale = n.emit("cast", scale, dtype=x.type.dtype)
    return [n.emit("quantize_linear", x, scale, zp, **g)]


@converter("DequantizeLinear")
def _dequantize_linear(n: OnnxNode) -> list[Value | None]:
    q = n.input(0)
    scale = _scale(n, 1)
    if q.type.dtype in _STORAGE:
        g = _granularity(n, q, scale)
        zp = _per_tensor(n, _storage_zero_point(n, 2, scale, q.type.dtype))
        return [_storage_dequantize(n, q, _per_tensor(n, scale), zp, g)]
    if q.type.dtype not in QUANT_DTYPES + (dt.i32,):
        raise n.error(f"the input {q.type} must be i8, u8, i16, u16 or i32 (float8 and 4-bit forms are not supported)")
    zp = _zero_point(n, 2, scale, q.type.dtype, allow_i32=True)
    if zp.type.dtype is not q.type.dtype:
        raise n.error(f"the zero point's dtype {zp.type.dtype.name} differs from the input's {q.type.dtype.name}")
    g = _granularity(n, q, scale)
    return [n.emit("dequantize_linear", q, _per_tensor(n, scale), _per_tensor(n, zp), **g)]


@converter("DynamicQuantizeLinear")
def _dynamic_quantize_linear(n: OnnxNode) -> list[Value | None]:
    """u8 quantization of x over the range of its values and 0 (ONNX DynamicQuantizeLinear):
    scale = (max(0, max x) - min(0, min x)) / 255, zero point = saturate(round(-min / scale))."""
    x = n.input(0)
    if x.type.dtype is not dt.f32:
        raise n.error(f"the input {x.type} must be f32")
    zero = n.scalar(0.0, x)
    hi = n.emit("maximum", n.emit("max", x), zero)
    lo = n.emit("minimum", n.emit("min", x), zero)
    scale = n.emit("div", n.emit("sub", hi, lo), n.scalar(255.0, x))
    # An all-zero input: scale 0 would divide by zero; its quantized values are 0 either way.
    safe = n.emit("where", n.emit("equal", scale, zero), n.scalar(1.0, x), scale)
    zp_f = n.emit("maximum", n.emit("minimum", n.emit("neg", n.emit("div", lo, safe)), n.scalar(255.0, x)), zero)
    # round half to even, as ONNX specifies, through quantize_linear by a unit scale
    zp = n.emit("quantize_linear", zp_f, n.scalar(1.0, x), n.emit("constant", value=DenseAttr(np.array(0, np.uint8))))
    y = n.emit("quantize_linear", x, safe, zp)
    return [y, scale, zp]


@converter("MatMulInteger")
def _matmul_integer(n: OnnxNode) -> list[Value | None]:
    a, b = n.input(0), n.input(1)
    for name, v in (("A", a), ("B", b)):
        if v.type.dtype not in (dt.i8, dt.u8):
            raise n.error(f"{name} {v.type} must be int8 or uint8")

    def zp(i: int, like: Value) -> Value:
        if not n.has_input(i):
            return n.emit("constant", value=DenseAttr(np.zeros((), like.type.dtype.np)))
        return _per_tensor(n, n.input(i))
    return [n.emit("matmul_integer", a, b, zp(2, a), zp(3, b))]
