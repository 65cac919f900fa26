"""Element types of partita tensors and their promotion rules.

A ``DType`` is a frozen record; the module-level constants (``f32``, ``i64``, ...) are the
only instances. NumPy dtypes come from NumPy itself, plus ``ml_dtypes`` for bfloat16, so the
reference interpreter can hold every partita dtype in a NumPy array.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np


@dataclass(frozen=True, slots=True)
class DType:
    name: str          # the text-form spelling: f32, i64, bool, ...
    kind: str          # "bool", "uint", "int" or "float": promotion category
    bits: int

    @property
    def itemsize(self) -> int:
        return max(1, self.bits // 8)

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        return self.kind in ("int", "uint")

    @property
    def is_bool(self) -> bool:
        return self.kind == "bool"

    @property
    def np(self) -> np.dtype:
        return _TO_NUMPY[self.name]

    def __repr__(self) -> str:
        return self.name

    __str__ = __repr__

    def __hash__(self) -> int:
        return hash(self.name)

    def __reduce__(self):
        # The module constants are the only instances: unpickling returns them.
        return (parse_dtype, (self.name,))


bool_ = DType("bool", "bool", 8)
u8 = DType("u8", "uint", 8)
i8 = DType("i8", "int", 8)
i16 = DType("i16", "int", 16)
i32 = DType("i32", "int", 32)
i64 = DType("i64", "int", 64)
f16 = DType("f16", "float", 16)
bf16 = DType("bf16", "float", 16)
f32 = DType("f32", "float", 32)
f64 = DType("f64", "float", 64)

ALL_DTYPES: tuple[DType, ...] = (bool_, u8, i8, i16, i32, i64, f16, bf16, f32, f64)
DTYPES: dict[str, DType] = {d.name: d for d in ALL_DTYPES}
FLOAT_DTYPES = tuple(d for d in ALL_DTYPES if d.is_float)
INT_DTYPES = tuple(d for d in ALL_DTYPES if d.is_int)

_TO_NUMPY: dict[str, np.dtype] = {
    "bool": np.dtype(np.bool_),
    "u8": np.dtype(np.uint8),
    "i8": np.dtype(np.int8),
    "i16": np.dtype(np.int16),
    "i32": np.dtype(np.int32),
    "i64": np.dtype(np.int64),
    "f16": np.dtype(np.float16),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
}
_FROM_NUMPY: dict[np.dtype, DType] = {v: DTYPES[k] for k, v in _TO_NUMPY.items()}


def from_numpy(dtype: np.dtype | type) -> DType:
    """The partita dtype of a NumPy dtype; raises ``KeyError`` for one partita lacks."""
    return _FROM_NUMPY[np.dtype(dtype)]


def parse_dtype(name: str) -> DType:
    return DTYPES[name]


_KIND_RANK = {"bool": 0, "uint": 1, "int": 1, "float": 2}


def promote(a: DType, b: DType) -> DType:
    """Result dtype of a binary op on tensors of dtypes ``a`` and ``b``.

    The rule is PyTorch's tensor-tensor promotion: a higher category wins (bool < integer <
    float); within a category the wider type wins; u8 with a signed integer gives the
    smallest signed type holding both; f16 with bf16 gives f32.
    """
    if a is b:
        return a
    ra, rb = _KIND_RANK[a.kind], _KIND_RANK[b.kind]
    if ra != rb:
        return a if ra > rb else b
    if a.kind == "float":
        if a.bits == b.bits:  # f16 and bf16
            return f32
        return a if a.bits > b.bits else b
    if a.kind == b.kind:
        return a if a.bits > b.bits else b
    # one unsigned (u8), one signed
    signed, unsigned = (a, b) if a.kind == "int" else (b, a)
    if signed.bits > unsigned.bits:
        return signed
    return {8: i16, 16: i32, 32: i64}.get(unsigned.bits, i64)


def promote_all(dtypes) -> DType:
    it = iter(dtypes)
    out = next(it)
    for d in it:
        out = promote(out, d)
    return out
