"""Attribute values that are not plain Python scalars: dense tensors.

Attribute values in the IR are immutable and hashable so that CSE and caches can key on
them: ``int``, ``float``, ``bool``, ``str``, ``DType``, tuples of these, ``None`` and
``DenseAttr``.
"""

from __future__ import annotations

import os
from math import prod

import numpy as np

from .diagnostics import DenseTooLargeError
from .dtypes import DType, from_numpy
from .types import TensorType


def memory_limit() -> int:
    """The most bytes one materialized dense tensor may take: the machine's physical memory
    (a larger array cannot be held; NumPy would fail or the system would kill the process)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows): NumPy's own limit
        return 1 << 62


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def check_size(t: TensorType, what: str) -> None:
    """Raise DenseTooLargeError when a tensor of type ``t`` cannot be held in memory."""
    limit = memory_limit()
    if t.nbytes > limit:
        raise DenseTooLargeError(
            f"{what} has {t.numel:,} elements ({_gib(t.nbytes)}), more than this machine's "
            f"{_gib(limit)} of memory can hold; make it smaller, or hold the one value in a small "
            f"constant (dense<{t.dtype}[], ...>) and broadcast it where it is used")


class DenseAttr:
    """An immutable dense tensor value (the payload of ``constant``).

    Either an array (``DenseAttr(array)``) or a *splat*, one value repeated over a shape
    (``DenseAttr.splat(value, shape, dtype)``), which is kept as that one value: its type,
    ``is_splat``, ``splat_value``, equality, hashing and printing never build the full
    array. ``array`` builds it on first use (refused with DenseTooLargeError when it
    would not fit in memory) and keeps it.
    """

    __slots__ = ("_array", "_scalar", "_shape", "_hash")

    def __init__(self, array: np.ndarray) -> None:
        arr = np.array(array, copy=True)
        arr.setflags(write=False)
        self._array: np.ndarray | None = arr
        self._scalar: np.ndarray | None = None  # the one value of a lazy splat, 0-d
        self._shape: tuple[int, ...] = tuple(arr.shape)
        self._hash: int | None = None

    @classmethod
    def splat(cls, value, shape, dtype: DType) -> DenseAttr:
        """``value`` (converted to ``dtype`` as NumPy does) in every element of ``shape``,
        without building the array."""
        d = cls.__new__(cls)
        with np.errstate(all="ignore"):
            scalar = np.array(value, dtype=dtype.np)
        if scalar.ndim:
            raise ValueError(f"a splat value is one scalar, not an array of shape {list(scalar.shape)}")
        scalar.setflags(write=False)
        d._array, d._scalar, d._shape, d._hash = None, scalar, tuple(int(n) for n in shape), None
        return d

    @property
    def array(self) -> np.ndarray:
        """The values as a read-only NumPy array (a splat is built here, once)."""
        a = self._array
        if a is None:
            check_size(self.type, f"dense<{self.type}> (a splat)")
            s = self._held()
            try:
                a = np.full(self._shape, s, dtype=s.dtype)
            except (MemoryError, ValueError) as e:
                raise DenseTooLargeError(f"dense<{self.type}> (a splat) cannot be built as an array: "
                                         f"{type(e).__name__}: {e}") from None
            a.setflags(write=False)
            self._array = a
        return a

    @property
    def dtype(self) -> DType:
        return from_numpy(self._held().dtype)

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def size(self) -> int:
        return prod(self._shape)

    @property
    def type(self) -> TensorType:
        return TensorType(self._shape, self.dtype)

    def _held(self) -> np.ndarray:
        """What this holds: a splat's one value (0-d), else the array."""
        if self._scalar is not None:
            return self._scalar
        if self._array is None:
            raise AssertionError("a DenseAttr holds an array or a splat value")
        return self._array

    def is_lazy_splat(self) -> bool:
        """True when this is a splat whose array has not been built."""
        return self._array is None

    def splat_array(self) -> np.ndarray | None:
        """The single value of a splat as a read-only 0-d array of the dtype (None if not a
        splat or empty)."""
        if self._scalar is not None:
            return self._scalar if self.size else None
        a = self._held()
        if a.size == 0 or not self.is_splat():
            return None
        return a.reshape(-1)[0:1].reshape(())

    def is_splat(self) -> bool:
        if self._scalar is not None:
            return True
        a = self._held()
        if a.size <= 1:
            return True
        flat = a.reshape(-1)
        return bool(np.all(flat.view(np.uint8).reshape(a.size, -1) == flat[:1].view(np.uint8)))

    def splat_value(self):
        """The single value of a splat tensor as a Python scalar (None if not a splat)."""
        s = self.splat_array()
        return None if s is None else s.item()

    def _key(self) -> tuple:
        """What equality and hashing compare: dtype, shape and the bytes, a splat's as one
        element (so a splat equals the same values given as an array)."""
        dt = self._held().dtype.str
        if self.size == 0:
            return (dt, self._shape, b"")
        s = self.splat_array()
        if s is not None:
            return (dt, self._shape, "splat", s.tobytes())
        return (dt, self._shape, self._held().tobytes())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DenseAttr):
            return NotImplemented
        if self is other:
            return True
        return self._key() == other._key()

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(self._key())
        return self._hash

    def __repr__(self) -> str:
        return f"DenseAttr({self.type})"
