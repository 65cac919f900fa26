"""NumPy helpers the op families' reference implementations share."""

from __future__ import annotations

import ml_dtypes
import numpy as np

# f16 and bf16: the references compute them in f32, and the interpreter rounds the result once.
LOW_PRECISION = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


def compute_np(a: np.ndarray) -> np.ndarray:
    """Arrays of f16/bf16 are computed in f32 (the interpreter rounds the result once)."""
    return a.astype(np.float32) if a.dtype in LOW_PRECISION else a
