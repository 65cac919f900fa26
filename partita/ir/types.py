"""Tensor types and source locations (``Location``, from partita/ir/location.py): small frozen
records carried by the IR."""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

from .dtypes import DType
from .location import Location  # noqa: F401  (defined apart so the error classes need no type records)


@dataclass(frozen=True, slots=True)
class TensorType:
    """A statically shaped tensor type: ``f32[32,784]``; a scalar is ``f32[]``."""

    shape: tuple[int, ...]
    dtype: DType
    # Types are dict keys everywhere (type-rule caches, CSE); the hash is computed once.
    # It uses only ints, so it is the same in every process and safe to pickle.
    _hash: int = field(default=-1, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if type(self.shape) is not tuple:
            object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))

    def __hash__(self) -> int:
        h = self._hash
        if h == -1:
            h = hash((self.shape, self.dtype.bits, self.dtype.kind == "float"))
            object.__setattr__(self, "_hash", h)
        return h

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def with_shape(self, shape) -> "TensorType":
        return TensorType(tuple(shape), self.dtype)

    def with_dtype(self, dtype: DType) -> "TensorType":
        return TensorType(self.shape, dtype)

    def __str__(self) -> str:
        return f"{self.dtype.name}[{','.join(map(str, self.shape))}]"

    __repr__ = __str__
