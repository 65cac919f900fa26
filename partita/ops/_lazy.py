"""Lazy imports so that importing partita (and ``partita verify``) does not load torch."""

from __future__ import annotations

import importlib
from types import ModuleType


class _LazyModule(ModuleType):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__dict__["_target"] = None

    def _load(self) -> ModuleType:
        mod = self.__dict__["_target"]
        if mod is None:
            mod = self.__dict__["_target"] = importlib.import_module(self.__name__)
        return mod

    def __getattr__(self, attr: str):
        # Cached on first use: later lookups are plain attribute hits (the executors look up
        # torch functions on every op call).
        value = getattr(self._load(), attr)
        self.__dict__[attr] = value
        return value


torch = _LazyModule("torch")
F = _LazyModule("torch.nn.functional")
# bf16's and the storage types' NumPy home: its import costs half a second, which a command that
# holds no array of them (plan, simulate) does not pay.
ml_dtypes = _LazyModule("ml_dtypes")


_TORCH_DTYPE_NAMES = {"bool": "bool", "u8": "uint8", "i8": "int8", "i16": "int16", "i32": "int32",
                      "i64": "int64", "f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64",
                      "u16": "uint16", "u32": "uint32", "u64": "uint64",
                      "f8e4m3fn": "float8_e4m3fn", "f8e4m3fnuz": "float8_e4m3fnuz", "f8e5m2": "float8_e5m2",
                      "f8e5m2fnuz": "float8_e5m2fnuz", "f8e8m0": "float8_e8m0fnu"}

# How the torch executor holds dtypes torch has few CPU kernels for (its one "carrier" per
# dtype): u16 and u32 in the next wider signed type (exact), u64 in int64 as the same bits
# (two's complement), every storage type in float32 as its exact value.
CARRIER_NAMES = {"u16": "int32", "u32": "int64", "u64": "int64",
                 "f8e4m3fn": "float32", "f8e4m3fnuz": "float32", "f8e5m2": "float32", "f8e5m2fnuz": "float32",
                 "f8e8m0": "float32", "f4e2m1": "float32", "i4": "float32", "u4": "float32", "i2": "float32",
                 "u2": "float32"}


def to_torch_dtype(dt):
    """The torch dtype of a partita DType (torch's own, e.g. torch.uint16 for u16); KeyError
    for the 4- and 2-bit types, which torch cannot hold."""
    return getattr(torch, _TORCH_DTYPE_NAMES[dt.name])


def carrier_dtype(dt):
    """The torch dtype the torch executor holds values of partita dtype ``dt`` in."""
    return getattr(torch, CARRIER_NAMES.get(dt.name) or _TORCH_DTYPE_NAMES[dt.name])


def from_torch_dtype(tdt):
    """The partita DType of a torch dtype; KeyError if partita lacks it."""
    from ..ir.dtypes import DTYPES

    name = str(tdt).removeprefix("torch.")
    for k, v in _TORCH_DTYPE_NAMES.items():
        if v == name:
            return DTYPES[k]
    raise KeyError(name)
