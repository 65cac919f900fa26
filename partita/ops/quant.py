"""Quantization: affine integer forms of float tensors, and the integer matrix product.

The three records follow ONNX's QuantizeLinear, DequantizeLinear and MatMulInteger, so the
ONNX importer maps QDQ models onto them one for one, and ``partita.passes.quantize`` builds
the same forms from a float graph:

- ``quantize_linear(x, scale, zero_point)``: ``saturate(round(x / scale) + zero_point)``,
  rounding half to even, saturating to the range of ``zero_point``'s dtype (i8, u8, i16, u16),
  which is the result's dtype;
- ``dequantize_linear(q, scale, zero_point)``: ``(q - zero_point) * scale``, in ``scale``'s
  dtype;
- ``matmul_integer(a, b, a_zero_point, b_zero_point)``: ``(a - a_zp) @ (b - b_zp)``
  accumulated exactly in i32.

Granularity of ``scale`` (``zero_point`` always has ``scale``'s shape):

- per tensor: ``scale`` is rank 0;
- per axis: ``scale`` is 1-D, one entry per index of ``x``'s dim ``axis``;
- per block (``block_size`` > 0): ``scale`` has ``x``'s rank, and along ``axis`` one entry
  per run of ``block_size`` indices (the last run may be shorter), every other dim equal.
"""

from __future__ import annotations

import numpy as np

from ..ir import dtypes as dt
from ..ir.diagnostics import TypeRuleError
from ..ir.types import TensorType
from ._lazy import from_torch_dtype, torch
from .linalg import matmul_shapes
from .registry import AttrSpec, Cost, OpDef, normalize_axis, register

# Integer dtypes a quantized tensor may have, with their ranges.
QUANT_DTYPES = (dt.i8, dt.u8, dt.i16, dt.u16)
_SCALE_DTYPES = (dt.f32, dt.f16, dt.bf16)
_GRANULARITY_ATTRS = (AttrSpec("axis", "int", 1), AttrSpec("block_size", "int", 0))


def qrange(d: dt.DType) -> tuple[int, int]:
    """The smallest and largest value of integer dtype ``d``."""
    info = np.iinfo(d.np)
    return int(info.min), int(info.max)


def _check_scale(op: str, x: TensorType, scale: TensorType, zp: TensorType, attrs: dict,
                 zp_dtypes: tuple = QUANT_DTYPES) -> None:
    """``scale`` and ``zero_point`` fit ``x`` at one of the three granularities."""
    if scale.dtype not in _SCALE_DTYPES:
        raise TypeRuleError(f"{op}: the scale {scale} must be f32, f16 or bf16")
    if zp.shape != scale.shape:
        raise TypeRuleError(f"{op}: the zero point {zp} must have the scale's shape [{','.join(map(str, scale.shape))}]")
    if zp.dtype not in zp_dtypes:
        names = ", ".join(d.name for d in zp_dtypes)
        raise TypeRuleError(f"{op}: the zero point {zp} must be one of {names} (it sets the quantized dtype)")
    block = attrs["block_size"]
    if block < 0:
        raise TypeRuleError(f"{op}: block_size {block} must be >= 0 (0: per tensor or per axis)")
    if scale.rank == 0 and block == 0:
        return
    if x.rank == 0:
        raise TypeRuleError(f"{op}: a rank-0 input takes a rank-0 scale, got {scale}")
    axis = normalize_axis(attrs["axis"], x.rank, op)
    if block == 0:
        if scale.shape != (x.shape[axis],):
            raise TypeRuleError(f"{op}: a per-axis scale must be 1-D with {x.shape[axis]} entries (dim {axis} of "
                                f"{x}), got {scale}; or give a rank-0 scale for one per tensor")
        return
    want = x.shape[:axis] + (-(-x.shape[axis] // block),) + x.shape[axis + 1:]
    if scale.shape != want:
        raise TypeRuleError(f"{op}: with block_size {block} along axis {axis}, the scale of {x} must have shape "
                            f"[{','.join(map(str, want))}], got {scale}")


def _broadcast(s: np.ndarray, x_shape: tuple, attrs: dict) -> np.ndarray:
    """``s`` (a scale or zero point) shaped to broadcast against a tensor of ``x_shape``."""
    if s.ndim == 0:
        return s
    axis = attrs["axis"] % len(x_shape)
    if attrs["block_size"]:
        return np.repeat(s, attrs["block_size"], axis=axis)[(slice(None),) * axis + (slice(0, x_shape[axis]),)]
    return s.reshape((-1,) + (1,) * (len(x_shape) - axis - 1))


def _broadcast_torch(s, x_shape, attrs):
    if s.dim() == 0:
        return s
    axis = attrs["axis"] % len(x_shape)
    if attrs["block_size"]:
        return torch.repeat_interleave(s, attrs["block_size"], dim=axis).narrow(axis, 0, x_shape[axis])
    return s.reshape((-1,) + (1,) * (len(x_shape) - axis - 1))


# --- quantize_linear ------------------------------------------------------------------------

def _quantize_infer(ts: list[TensorType], attrs: dict) -> TensorType:
    x, scale, zp = ts
    if not x.dtype.is_float or x.dtype not in _SCALE_DTYPES:
        raise TypeRuleError(f"quantize_linear: the input {x} must be f32, f16 or bf16")
    if scale.dtype is not x.dtype:
        raise TypeRuleError(f"quantize_linear: the scale {scale} must have the input's dtype {x.dtype}")
    _check_scale("quantize_linear", x, scale, zp, attrs)
    return TensorType(x.shape, zp.dtype)


def _quantize_reference(args, attrs):
    x, scale, zp = args
    lo, hi = qrange(dt.from_numpy(zp.dtype))
    q = np.rint(x.astype(np.float32) / _broadcast(scale.astype(np.float32), x.shape, attrs))
    q = q + _broadcast(zp.astype(np.float32), x.shape, attrs)
    return np.clip(q, lo, hi).astype(zp.dtype)


def _torch_qdtype(zp) -> dt.DType:
    """The quantized dtype of a zero point as the torch executor holds it: u16 travels as an
    int32 carrier (quantize_linear's zero point is never a real i32)."""
    if zp.dtype == torch.int32:
        return dt.u16
    return from_torch_dtype(zp.dtype)


def _quantize_torch(args, attrs):
    x, scale, zp = args
    lo, hi = qrange(_torch_qdtype(zp))
    q = torch.round(x.float() / _broadcast_torch(scale.float(), x.shape, attrs))
    q = q + _broadcast_torch(zp.float(), x.shape, attrs)
    return q.clamp(lo, hi).to(zp.dtype)


register(OpDef(
    name="quantize_linear", operands=("x", "scale", "zero_point"), attrs=_GRANULARITY_ATTRS,
    infer=_quantize_infer, reference=_quantize_reference, torch=_quantize_torch,
    cost=lambda ins, outs, a: Cost(3 * outs[0].numel, sum(t.nbytes for t in ins), outs[0].nbytes),
    doc="saturate(round(x / scale) + zero_point) (ONNX QuantizeLinear): rounds half to even, saturates "
        "to the range of zero_point's dtype (i8, u8, i16, u16), the result's dtype; scale rank 0 (per "
        "tensor), 1-D along axis (per axis), or x's rank with block_size > 0 (per block along axis); "
        "zero_point has scale's shape. Cost: 3 FLOPs per element.",
))


# --- dequantize_linear ----------------------------------------------------------------------

def _dequantize_infer(ts: list[TensorType], attrs: dict) -> TensorType:
    q, scale, zp = ts
    if zp.dtype is not q.dtype:
        raise TypeRuleError(f"dequantize_linear: the zero point {zp} must have the input's dtype {q.dtype}")
    if q.dtype not in QUANT_DTYPES and q.dtype is not dt.i32:
        raise TypeRuleError(f"dequantize_linear: the input {q} must be i8, u8, i16, u16 or i32")
    # An i32 accumulator (from matmul_integer) dequantizes with an i32 zero point.
    _check_scale("dequantize_linear", q, scale, zp, attrs, QUANT_DTYPES + (dt.i32,))
    return TensorType(q.shape, scale.dtype)


def _dequantize_reference(args, attrs):
    q, scale, zp = args
    # An i32 accumulator is centred in f64, where every i32 is exact.
    wide = np.float64 if q.dtype == np.int32 else np.float32
    centered = q.astype(wide) - _broadcast(zp.astype(wide), q.shape, attrs)
    out = centered * _broadcast(scale.astype(np.float32), q.shape, attrs)
    return out.astype(scale.dtype)


def _dequantize_torch(args, attrs):
    q, scale, zp = args
    wide = torch.float64 if q.dtype == torch.int32 else torch.float32
    centered = q.to(wide) - _broadcast_torch(zp.to(wide), q.shape, attrs)
    out = centered * _broadcast_torch(scale.float(), q.shape, attrs)
    return out.to(scale.dtype)


register(OpDef(
    name="dequantize_linear", operands=("q", "scale", "zero_point"), attrs=_GRANULARITY_ATTRS,
    infer=_dequantize_infer, reference=_dequantize_reference, torch=_dequantize_torch,
    cost=lambda ins, outs, a: Cost(2 * outs[0].numel, sum(t.nbytes for t in ins), outs[0].nbytes),
    doc="(q - zero_point) * scale (ONNX DequantizeLinear), in scale's dtype: q i8, u8, i16 or u16 with "
        "zero_point of q's dtype and scale's shape (rank 0, 1-D along axis, or per block with "
        "block_size > 0), or q i32 (an integer accumulator). Cost: 2 FLOPs per element.",
))


# --- matmul_integer -------------------------------------------------------------------------

def _mmi_infer(ts: list[TensorType], attrs: dict) -> TensorType:
    a, b, azp, bzp = ts
    for name, t in (("lhs", a), ("rhs", b)):
        if t.dtype not in (dt.i8, dt.u8):
            raise TypeRuleError(f"matmul_integer: {name} {t} must be i8 or u8")
    shape, _ = matmul_shapes(a, b)
    m = a.shape[-2] if a.rank >= 2 else 1
    n = b.shape[-1] if b.rank >= 2 else 1
    for name, zp, x, per in (("lhs", azp, a, m), ("rhs", bzp, b, n)):
        if zp.dtype is not x.dtype:
            raise TypeRuleError(f"matmul_integer: the {name} zero point {zp} must have the {name}'s dtype {x.dtype}")
        if zp.rank > 1 or (zp.rank == 1 and zp.shape[0] != per):
            what = "row" if name == "lhs" else "column"
            raise TypeRuleError(f"matmul_integer: the {name} zero point {zp} must be rank 0, or 1-D with one entry "
                                f"per {what} ({per})")
    return TensorType(shape, dt.i32)


def _centered_np(x, zp, lhs: bool):
    x = x.astype(np.int32)
    zp = zp.astype(np.int32)
    if zp.ndim == 1:
        zp = zp.reshape(-1, 1) if lhs else zp
    return x - zp


def _mmi_reference(args, attrs):
    a, b, azp, bzp = args
    return np.matmul(_centered_np(a, azp, True), _centered_np(b, bzp, False)).astype(np.int32)


def _mmi_torch(args, attrs):
    a, b, azp, bzp = args
    if (a.dim() >= 2 and b.dim() == 2 and a.dtype == b.dtype == torch.int8 and azp.dim() == 0 and bzp.dim() == 0
            and not azp.any() and not bzp.any()):
        # The int8 GEMM with exact i32 accumulation, over the rows of every batch at once;
        # zero points of zero need no correction.
        rows = a.reshape(-1, a.shape[-1]).contiguous()
        return torch._int_mm(rows, b.contiguous()).reshape(*a.shape[:-1], b.shape[1])
    za = azp.to(torch.int32)
    zb = bzp.to(torch.int32)
    if za.dim() == 1:
        za = za.reshape(-1, 1)
    return torch.matmul(a.to(torch.int32) - za, b.to(torch.int32) - zb)


def _mmi_cost(ins: list[TensorType], outs: list[TensorType], attrs: dict) -> Cost:
    _, k = matmul_shapes(ins[0], ins[1])
    return Cost(2 * outs[0].numel * k, sum(t.nbytes for t in ins), outs[0].nbytes)


register(OpDef(
    name="matmul_integer", operands=("lhs", "rhs", "lhs_zero_point", "rhs_zero_point"),
    infer=_mmi_infer, reference=_mmi_reference, torch=_mmi_torch, cost=_mmi_cost,
    doc="(lhs - lhs_zero_point) @ (rhs - rhs_zero_point) accumulated exactly in i32 (ONNX "
        "MatMulInteger), matmul's shape rules; operands i8 or u8, each zero point of its operand's "
        "dtype, rank 0 or 1-D per row of lhs / per column of rhs. Cost: 2*M*N*K integer ops.",
))
