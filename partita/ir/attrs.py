"""Attribute values that are not plain Python scalars: dense tensors.

Attribute values in the IR are immutable and hashable so that CSE and caches can key on
them: ``int``, ``float``, ``bool``, ``str``, ``DType``, tuples of these, ``None`` and
``DenseAttr``.
"""

from __future__ import annotations

import numpy as np

from .dtypes import DType, from_numpy
from .types import TensorType


class DenseAttr:
    """An immutable dense tensor value (the payload of ``constant``)."""

    __slots__ = ("array", "_hash")

    def __init__(self, array: np.ndarray) -> None:
        arr = np.array(array, copy=True)
        arr.setflags(write=False)
        self.array = arr
        self._hash: int | None = None

    @property
    def dtype(self) -> DType:
        return from_numpy(self.array.dtype)

    @property
    def type(self) -> TensorType:
        return TensorType(tuple(self.array.shape), self.dtype)

    def is_splat(self) -> bool:
        a = self.array
        if a.size <= 1:
            return True
        flat = a.reshape(-1)
        return bool(np.all(flat.view(np.uint8).reshape(a.size, -1) == flat[:1].view(np.uint8)))

    def splat_value(self):
        """The single value of a splat tensor as a Python scalar (None if not a splat)."""
        if self.array.size == 0 or not self.is_splat():
            return None
        return self.array.reshape(-1)[0].item()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DenseAttr):
            return NotImplemented
        a, b = self.array, other.array
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()

    def __hash__(self) -> int:
        if self._hash is None:
            a = self.array
            self._hash = hash((a.dtype.str, a.shape, a.tobytes()))
        return self._hash

    def __repr__(self) -> str:
        return f"DenseAttr({self.type})"
