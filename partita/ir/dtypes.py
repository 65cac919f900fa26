"""Element types of partita tensors and their promotion rules.

A ``DType`` is a frozen record; the module-level constants (``f32``, ``i64``, ...) are the
only instances. NumPy dtypes come from NumPy itself, plus ``ml_dtypes`` for bfloat16 and the
storage types, so the reference interpreter can hold every partita dtype in a NumPy array.

Storage types (8-, 4- and 2-bit floats and integers for quantized data) have ``storage=True``:
they can be cast to and from every dtype and moved (reshape, transpose, concat, slice,
constant), but no arithmetic op accepts them (see ``check_storage_operands``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .diagnostics import TypeRuleError


@dataclass(frozen=True, slots=True)
class DType:
    name: str          # the text-form spelling: f32, i64, bool, ...
    kind: str          # "bool", "uint", "int" or "float": promotion category
    bits: int
    storage: bool = False  # quantized storage type: cast and data movement only

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
        return to_numpy(self.name)

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
u16 = DType("u16", "uint", 16)
u32 = DType("u32", "uint", 32)
u64 = DType("u64", "uint", 64)
i8 = DType("i8", "int", 8)
i16 = DType("i16", "int", 16)
i32 = DType("i32", "int", 32)
i64 = DType("i64", "int", 64)
f16 = DType("f16", "float", 16)
bf16 = DType("bf16", "float", 16)
f32 = DType("f32", "float", 32)
f64 = DType("f64", "float", 64)
# Storage types. The names follow the ONNX / ml_dtypes spelling: e<exponent bits>m<mantissa
# bits>, "fn" = finite (no infinities), "uz" = unsigned zero (no -0, a single NaN).
f8e4m3fn = DType("f8e4m3fn", "float", 8, storage=True)
f8e4m3fnuz = DType("f8e4m3fnuz", "float", 8, storage=True)
f8e5m2 = DType("f8e5m2", "float", 8, storage=True)
f8e5m2fnuz = DType("f8e5m2fnuz", "float", 8, storage=True)
f8e8m0 = DType("f8e8m0", "float", 8, storage=True)      # powers of two only (MX scales)
f4e2m1 = DType("f4e2m1", "float", 4, storage=True)
i4 = DType("i4", "int", 4, storage=True)
u4 = DType("u4", "uint", 4, storage=True)
i2 = DType("i2", "int", 2, storage=True)
u2 = DType("u2", "uint", 2, storage=True)

COMPUTE_DTYPES: tuple[DType, ...] = (bool_, u8, u16, u32, u64, i8, i16, i32, i64, f16, bf16, f32, f64)
STORAGE_DTYPES: tuple[DType, ...] = (f8e4m3fn, f8e4m3fnuz, f8e5m2, f8e5m2fnuz, f8e8m0, f4e2m1, i4, u4, i2, u2)
ALL_DTYPES: tuple[DType, ...] = COMPUTE_DTYPES + STORAGE_DTYPES
DTYPES: dict[str, DType] = {d.name: d for d in ALL_DTYPES}
FLOAT_DTYPES = tuple(d for d in COMPUTE_DTYPES if d.is_float)
INT_DTYPES = tuple(d for d in COMPUTE_DTYPES if d.is_int)
# The float8 types whose casts obey the ``saturate`` flag (ONNX Cast).
SATURATING_DTYPES = (f8e4m3fn, f8e4m3fnuz, f8e5m2, f8e5m2fnuz)

_TO_NUMPY: dict[str, np.dtype] = {
    "bool": np.dtype(np.bool_),
    "u8": np.dtype(np.uint8),
    "u16": np.dtype(np.uint16),
    "u32": np.dtype(np.uint32),
    "u64": np.dtype(np.uint64),
    "i8": np.dtype(np.int8),
    "i16": np.dtype(np.int16),
    "i32": np.dtype(np.int32),
    "i64": np.dtype(np.int64),
    "f16": np.dtype(np.float16),
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
}
# The types NumPy lacks come from ml_dtypes, imported at the first use of one (its import
# costs half a second; planning and simulating never touch an array of them).
_ML_DTYPES = {"bf16": "bfloat16", "f8e4m3fn": "float8_e4m3fn", "f8e4m3fnuz": "float8_e4m3fnuz",
              "f8e5m2": "float8_e5m2", "f8e5m2fnuz": "float8_e5m2fnuz", "f8e8m0": "float8_e8m0fnu",
              "f4e2m1": "float4_e2m1fn", "i4": "int4", "u4": "uint4", "i2": "int2", "u2": "uint2"}
_FROM_NUMPY: dict[np.dtype, DType] = {v: DTYPES[k] for k, v in _TO_NUMPY.items()}


def _load_ml_dtypes() -> None:
    """Add ml_dtypes' NumPy types (bf16 and the storage types) to the two tables."""
    import ml_dtypes

    for name, attr in _ML_DTYPES.items():
        _TO_NUMPY[name] = np.dtype(getattr(ml_dtypes, attr))
        _FROM_NUMPY[_TO_NUMPY[name]] = DTYPES[name]


def to_numpy(name: str) -> np.dtype:
    """The NumPy dtype of the partita dtype named ``name``."""
    try:
        return _TO_NUMPY[name]
    except KeyError:
        if name not in _ML_DTYPES or name in _TO_NUMPY:
            raise
        _load_ml_dtypes()
        return _TO_NUMPY[name]


def from_numpy(dtype: np.dtype | type) -> DType:
    """The partita dtype of a NumPy dtype; raises ``KeyError`` for one partita lacks."""
    try:
        return _FROM_NUMPY[np.dtype(dtype)]
    except (KeyError, TypeError):  # one of ml_dtypes' types (or its name) before they were loaded
        if "bf16" in _TO_NUMPY:
            raise
        _load_ml_dtypes()
        return _FROM_NUMPY[np.dtype(dtype)]


def parse_dtype(name: str) -> DType:
    return DTYPES[name]


_KIND_RANK = {"bool": 0, "uint": 1, "int": 1, "float": 2}


def storage_error(dt: DType, op: str) -> TypeRuleError:
    """The error for an arithmetic use of storage type ``dt`` (in ``op``)."""
    from .diagnostics import TypeRuleError  # diagnostics -> types -> dtypes: import late
    return TypeRuleError(f"{op}: {dt} is a storage type (cast and data movement only): cast it to "
                         "f16/f32 first" if dt.is_float else
                         f"{op}: {dt} is a storage type (cast and data movement only): cast it to i8/i32 first")


def promote(a: DType, b: DType) -> DType:
    """Result dtype of a binary op on tensors of dtypes ``a`` and ``b``.

    For the dtypes PyTorch promotes (bool, u8, signed integers, floats) the rule is PyTorch's
    tensor-tensor promotion: a higher category wins (bool < integer < float); within a
    category the wider type wins; an unsigned with a signed integer gives the smallest signed
    type holding both; f16 with bf16 gives f32.

    The wide unsigned types (u16, u32, u64), which PyTorch does not promote, follow the same
    rule: with a float or bool the other side decides as above, two unsigned types give the
    wider, and an unsigned with a signed type gives the smallest signed type holding both
    (u16 + i16 -> i32, u32 + i8 -> i64, u16 + i64 -> i64). No signed type holds u64, so
    u64 with a signed integer raises a TypeRuleError asking for an explicit cast. A storage
    type meets only itself (TypeRuleError otherwise).
    """
    if a is b:  # the same type, storage types included (concat of two f8 tensors)
        return a
    if a.storage or b.storage:
        raise storage_error(a if a.storage else b, "promotion")
    ra, rb = _KIND_RANK[a.kind], _KIND_RANK[b.kind]
    if ra != rb:
        return a if ra > rb else b
    if a.kind == "float":
        if a.bits == b.bits:  # f16 and bf16
            return f32
        return a if a.bits > b.bits else b
    if a.kind == b.kind:
        return a if a.bits > b.bits else b
    signed, unsigned = (a, b) if a.kind == "int" else (b, a)
    if signed.bits > unsigned.bits:
        return signed
    if unsigned.bits >= 64:
        from .diagnostics import TypeRuleError

        raise TypeRuleError(f"no signed integer type holds both {unsigned} and {signed} (u64 values reach 2**64 - 1); "
                            f"cast one operand explicitly first (to {unsigned} if the values are non-negative, "
                            "else to i64 or f64)")
    return {8: i16, 16: i32, 32: i64}[unsigned.bits]


def promote_all(dtypes) -> DType:
    """``promote`` folded left over a non-empty iterable of dtypes."""
    it = iter(dtypes)
    out = next(it)
    for d in it:
        out = promote(out, d)
    return out
