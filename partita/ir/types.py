"""Tensor types and source locations: small frozen records carried by the IR."""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from .dtypes import DType


@dataclass(frozen=True, slots=True)
class TensorType:
    """A statically shaped tensor type: ``f32[32,784]``; a scalar is ``f32[]``."""

    shape: tuple[int, ...]
    dtype: DType

    def __post_init__(self) -> None:
        if type(self.shape) is not tuple:
            object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))

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


@dataclass(frozen=True, slots=True)
class Location:
    """Where something came from: a file, a 1-based line and an optional 1-based column."""

    file: str
    line: int
    col: int = 0

    def __str__(self) -> str:
        return f"{self.file}:{self.line}" + (f":{self.col}" if self.col else "")
