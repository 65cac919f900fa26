"""NumPy helpers the op families' reference implementations share."""

from __future__ import annotations

import functools

import numpy as np

from ..ir.dtypes import bf16


@functools.cache
def low_precision_dtypes() -> tuple[np.dtype, ...]:
    """f16's and bf16's NumPy dtypes (bf16's is ml_dtypes', imported at the first ask)."""
    return (np.dtype(np.float16), bf16.np)


class LowPrecision:
    """f16 and bf16 (``dtype in LOW_PRECISION``): the references compute them in f32, and the
    interpreter rounds the result once."""

    def __contains__(self, dtype: object) -> bool:
        return dtype in low_precision_dtypes()


LOW_PRECISION = LowPrecision()


def compute_np(a: np.ndarray) -> np.ndarray:
    """Arrays of f16/bf16 are computed in f32 (the interpreter rounds the result once)."""
    return a.astype(np.float32) if a.dtype in LOW_PRECISION else a
