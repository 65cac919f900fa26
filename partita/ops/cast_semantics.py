"""What ``cast`` means, on NumPy arrays: the one definition both executors follow.

ONNX Cast (onnx 1.23.2: the Cast-25 operator text and the 4-bit, 2-bit and float4 technical
notes), with partita's choice where ONNX leaves a case undefined. ``docs/ir.md`` has the
table; in short, by destination:

- bool: zero (and -0.0) is false, everything else (NaN included) is true.
- i8..i64, u8..u64 from bool or an integer: the low bits, reinterpreted (wraps modulo
  2**bits, as ONNX says). From a float: truncate toward zero, then saturate to the type's
  range; +-inf saturate too and NaN is 0 (ONNX leaves out-of-range values undefined; this
  is partita's choice, the same rule ONNX gives the 4- and 2-bit integers).
- i4, u4, i2, u2 from a float: round to nearest, ties to even, then saturate (ONNX: "rounding
  to the nearest-even integer and truncating" to the range); NaN is 0 (undefined in ONNX).
  From bool or an integer: the low bits, reinterpreted, as for the wider integers.
- f16, bf16, f32, f64: round to nearest even; beyond the range is +-inf; NaN stays NaN.
- f8e4m3fn, f8e4m3fnuz, f8e5m2, f8e5m2fnuz: the ONNX tables for ``saturate``: with it (the
  default) infinities and values beyond the largest finite value become +-max; without it
  they become NaN (inf for f8e5m2). Rounding is to nearest even, NaN stays NaN.
- f8e8m0 (powers of two): the ONNX ``round_mode`` ("up" by default) and ``saturate``.
- f4e2m1 (no inf, no NaN): round to nearest even, beyond +-6 (infinities too) is +-6, and
  NaN is +6, whatever ``saturate`` says (ONNX's float4 table).

Storage-typed sources are read as their exact values (floats as f32, integers as i64), so
a cast depends only on the value and on whether the source is a float.
"""

from __future__ import annotations

import numpy as np

from ..ir.dtypes import SATURATING_DTYPES, DType, f4e2m1, f8e8m0, u64
from ._lazy import ml_dtypes

ROUND_MODES = ("up", "down", "nearest")
F4E2M1_MAX = 6.0


def int_range(dt: DType) -> tuple[int, int]:
    """The smallest and largest value of integer dtype ``dt`` (the 4- and 2-bit types too)."""
    info = ml_dtypes.iinfo(dt.np) if dt.storage else np.iinfo(dt.np)
    return int(info.min), int(info.max)


def float_max(dt: DType) -> float:
    """The largest finite value of float dtype ``dt``."""
    return float(ml_dtypes.finfo(dt.np).max)


def cast_array(x: np.ndarray, dt: DType, saturate: bool = True, round_mode: str = "up") -> np.ndarray:
    """``x`` converted to partita dtype ``dt`` with partita's cast semantics (the module doc)."""
    x = np.asarray(x)
    if x.dtype.kind not in "biuf":
        # Storage types and bf16 hold values exact in f32 (floats) or i64 (integers); reading
        # them as those keeps the source's class (float or integer), which the rules depend on.
        x = x.astype(np.int64 if np.dtype(x.dtype).name in ("int4", "uint4", "int2", "uint2") else np.float32)
    elif x.dtype.kind == "f" and x.dtype.itemsize < 4:
        x = x.astype(np.float32)
    if dt.is_bool:
        return x != 0
    if dt.is_int:
        if x.dtype.kind == "f":
            return _float_to_int(x, dt)
        return _wrap(x, dt)
    if dt in SATURATING_DTYPES:
        if x.dtype.kind in "biu":
            x = x.astype(np.float64)
        if saturate:
            big = float_max(dt)
            x = np.clip(x, -big, big)  # NaN stays NaN
        return x.astype(dt.np)
    if dt is f8e8m0:
        return to_f8e8m0(x, saturate, round_mode)
    if dt is f4e2m1:
        if x.dtype.kind in "biu":
            x = x.astype(np.float64)
        y = np.clip(x, -F4E2M1_MAX, F4E2M1_MAX)  # +-0 and NaN pass through
        return np.where(np.isnan(y), F4E2M1_MAX, y).astype(dt.np)
    return x.astype(dt.np)


def _wrap(x: np.ndarray, dt: DType) -> np.ndarray:
    """Bool or integer ``x`` as integer dtype ``dt``: its low ``dt.bits`` bits, reinterpreted."""
    if not dt.storage:
        return x.astype(dt.np)  # NumPy's integer casts keep the low bits
    low = x.astype(np.int64) & ((1 << dt.bits) - 1)
    if dt.kind == "int":
        low = np.where(low >= 1 << (dt.bits - 1), low - (1 << dt.bits), low)
    return low.astype(dt.np)


def _float_to_int(x: np.ndarray, dt: DType) -> np.ndarray:
    """Float ``x`` as integer dtype ``dt``: rounded (4/2-bit: to nearest even; else toward
    zero), saturated to the range, NaN as 0. Every step is exact in f64: the bounds -2**k and
    2**k are powers of two, and a value reaching hi + 1 (= 2**k) is set to hi at the end, so
    NumPy's conversions (undefined out of range) only ever see values in range."""
    lo, hi = int_range(dt)
    t = x.astype(np.float64)
    t = np.rint(t) if dt.storage else np.trunc(t)
    t = np.maximum(np.where(np.isnan(t), 0.0, t), float(lo))
    over = t >= float(hi + 1)
    t = np.where(over, 0.0, t)
    if dt is u64:
        return np.where(over, np.uint64(hi), t.astype(np.uint64))
    return np.where(over, hi, t.astype(np.int64)).astype(dt.np)


def to_f8e8m0(x: np.ndarray, saturate: bool, round_mode: str) -> np.ndarray:
    """f32 values as f8e8m0 (the f32 exponent byte; NaN and inf map to NaN), rounding the
    mantissa away per ``round_mode``; with ``saturate`` rounding never passes 2**127."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    exponent = ((bits >> 23) & 0xFF).astype(np.uint16)
    special = exponent == 0xFF
    if round_mode == "nearest":
        g = (bits & 0x400000) > 0
        r = (bits & 0x200000) > 0
        s = (bits & 0x1FFFFF) > 0
        up = g & (r | s | (exponent > 0)) & ~special
    elif round_mode == "up":
        up = ((bits & 0x7FFFFF) > 0) & ~special
    elif round_mode == "down":
        up = np.zeros(bits.shape, dtype=bool)
    else:
        raise ValueError(f"round_mode must be one of {ROUND_MODES}, got {round_mode!r}")
    if saturate:
        up &= exponent != 0xFE
    exponent = exponent + up.astype(np.uint16)
    out = np.where(special, 0xFF, np.minimum(exponent, 0xFF)).astype(np.uint8)
    return out.view(ml_dtypes.float8_e8m0fnu)


def float_to_int_torch(t, dt: DType):
    """Float tensor ``t`` as integer dtype ``dt`` by the rule of ``cast_array`` (rounded,
    saturated, NaN as 0), on torch's int64: values for u64 come back as their bits (the torch
    executor's u64 carrier), every other dtype's values in range, ready for ``.to``."""
    from ._lazy import torch

    lo, hi = int_range(dt)
    t = t.double()
    t = torch.round(t) if dt.storage else torch.trunc(t)  # torch.round: ties to even
    t = torch.where(torch.isnan(t), 0.0, t).clamp(min=float(lo))
    over = t >= float(hi + 1)
    t = torch.where(over, 0.0, t)
    if dt is u64:
        # torch's float -> uint64 conversion is wrong from 2**63 up on CPU: those values are
        # shifted down, converted, and get the top bit back; 2**64 - 1 is all bits set (-1).
        high = t >= 2.0 ** 63
        bits = torch.where(high, (t - 2.0 ** 63).to(torch.int64) ^ -(2 ** 63), t.to(torch.int64))
        return torch.where(over, -1, bits)
    return torch.where(over, hi, t.to(torch.int64))
