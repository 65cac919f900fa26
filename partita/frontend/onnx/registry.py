"""The converter of each ONNX op type, and the ``converter`` decorator that fills the table.

A converter module registers each of its converters where it defines it::

    @converter("Conv", constant_operands=(...))
    def _conv(n: OnnxNode) -> list[Value | None]: ...

The package's ``__init__`` imports every converter module, so the table is complete whatever
the caller imported. The table records the module that registered each op type
(``CONVERTER_MODULES``); an op type registered twice is an error.
"""

from __future__ import annotations

from typing import Callable, TypeVar

from .common import AnyConverter

# The converter of each ONNX op type partita imports; filled by ``converter``.
ONNX_TO_PARTITA: dict[str, AnyConverter] = {}
# The module whose ``converter`` decorator registered each op type.
CONVERTER_MODULES: dict[str, str] = {}
# Operand positions whose values must be known at import time (they set shapes or axes).
CONSTANT_OPERANDS: dict[str, tuple[int, ...]] = {}
# Op type -> the input positions that take a sequence (sequences are unrolled at import).
SEQUENCE_OPERANDS: dict[str, tuple[int, ...]] = {}

F = TypeVar("F", bound=AnyConverter)


def converter(*op_types: str, constant_operands: tuple[int, ...] = (),
              sequence_operands: tuple[int, ...] = ()) -> Callable[[F], F]:
    """Register the decorated function as the converter of ``op_types``, with the operand
    positions that must be constants and those that take a sequence."""
    if not op_types:
        raise ValueError("converter() needs at least one ONNX op type")

    def register(fn: F) -> F:
        for op in op_types:
            if op in ONNX_TO_PARTITA:
                raise ValueError(f"ONNX op type {op} is registered twice: by {CONVERTER_MODULES[op]} "
                                 f"and by {fn.__module__}")
            ONNX_TO_PARTITA[op] = fn
            CONVERTER_MODULES[op] = fn.__module__
            if constant_operands:
                CONSTANT_OPERANDS[op] = tuple(constant_operands)
            if sequence_operands:
                SEQUENCE_OPERANDS[op] = tuple(sequence_operands)
        return fn
    return register
