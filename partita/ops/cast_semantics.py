"""What ``cast`` means, on NumPy arrays: the one definition both executors follow.

ONNX Cast semantics: float to integer truncates toward zero and wraps modulo 2**bits (as
PyTorch and NumPy do for in-range values); nonzero to bool is true. Casts into the four
float8 types follow the ONNX table for ``saturate``: with saturate (the default) a finite
value beyond the largest finite value, and an infinity, become +-max; without it they become
NaN (inf for f8e5m2). Rounding is to nearest even. Casts into f8e8m0 (powers of two) use the
ONNX ``round_mode`` ("up" by default: any fraction bit rounds the exponent up).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ..ir.dtypes import SATURATING_DTYPES, DType, f8e8m0

ROUND_MODES = ("up", "down", "nearest")


def cast_array(x: np.ndarray, dt: DType, saturate: bool = True, round_mode: str = "up") -> np.ndarray:
    """``x`` converted to partita dtype ``dt`` with ONNX Cast semantics (see the module doc)."""
    x = np.asarray(x)
    if x.dtype.kind not in "biuf" or x.dtype.itemsize < 4 and x.dtype.kind == "f":
        # Storage types, f16 and bf16 hold values exactly representable in f32; converting
        # first gives one rounding step below and lets NumPy's own kernels do the rest.
        x = x.astype(np.float32)
    if dt.is_bool:
        return x != 0
    if dt in SATURATING_DTYPES:
        if x.dtype.kind in "biu":
            x = x.astype(np.float64)
        if saturate:
            big = float(ml_dtypes.finfo(dt.np).max)
            x = np.clip(x, -big, big)  # NaN stays NaN
        return x.astype(dt.np)
    if dt is f8e8m0:
        return to_f8e8m0(x, saturate, round_mode)
    if dt.is_int and x.dtype.kind == "f":
        # Truncate toward zero, then wrap like the integer casts (NumPy's float->int cast
        # is undefined out of range, so go through i64 / u64 explicitly).
        t = np.trunc(x.astype(np.float64))
        if dt.kind == "uint" and dt.bits == 64:
            return t.astype(np.uint64)
        return t.astype(np.int64).astype(dt.np)
    return x.astype(dt.np)


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
