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
        return getattr(self._load(), attr)


torch = _LazyModule("torch")
F = _LazyModule("torch.nn.functional")


_TORCH_DTYPE_NAMES = {"bool": "bool", "u8": "uint8", "i8": "int8", "i16": "int16", "i32": "int32",
                      "i64": "int64", "f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64"}


def to_torch_dtype(dt):
    """The torch dtype of a partita DType."""
    return getattr(torch, _TORCH_DTYPE_NAMES[dt.name])


def from_torch_dtype(tdt):
    """The partita DType of a torch dtype; KeyError if partita lacks it."""
    from ..ir.dtypes import DTYPES

    name = str(tdt).removeprefix("torch.")
    for k, v in _TORCH_DTYPE_NAMES.items():
        if v == name:
            return DTYPES[k]
    raise KeyError(name)
