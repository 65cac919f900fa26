"""Tensor types and source locations: small frozen records carried by the IR."""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

from .dtypes import DType


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


@dataclass(frozen=True, slots=True)
class Location:
    """Where something came from: a file, a 1-based line and an optional 1-based column, and
    the module path of the model that ran it (``scope``, e.g. ``"transformer.h.3.attn"``;
    empty when unknown), which is how a pipeline cut names a layer.

    ``recompute`` is empty on the model's own nodes; on a node that recomputes a forward value
    for the backward (activation recomputation, partita/autodiff/memory.py) it names the
    policy that made it (``"cheap"``, ``"selective"``, ``"full"``). It lives here because the
    location is what every transformation carries from a node to what it makes of it (clone,
    text, the parallel partition's local nodes and collectives, the pipeline's copies), so
    later passes and cost models can tell recomputed work from the model's own."""

    file: str
    line: int
    col: int = 0
    scope: str = ""
    recompute: str = ""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}" + (f":{self.col}" if self.col else "")
