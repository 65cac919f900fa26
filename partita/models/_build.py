"""What gpt and llama share: a Builder that stamps every node with its module scope."""

from __future__ import annotations

from ..ir.builder import Builder
from ..ir.diagnostics import PartitaError
from ..ir.dtypes import DType, bf16, f16, f32
from ..ir.graph import Graph, Value
from ..ir.types import Location, TensorType

_DTYPES = {"f32": f32, "bf16": bf16, "f16": f16}


class ModelError(PartitaError, ValueError):
    """A model config that cannot be built (also a ValueError, as the builders raised before)."""


def model_dtype(name: str | DType) -> DType:
    if isinstance(name, DType):
        name = name.name
    if name not in _DTYPES:
        raise ModelError(f"model dtype {name!r:.40} is not one of {', '.join(_DTYPES)}")
    return _DTYPES[name]


def check_positive(model: str, **sizes: int) -> None:
    for k, n in sizes.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ModelError(f"{model}: {k} must be a positive int, got {n!r:.40}")


class ScopedBuilder:
    """A Builder whose nodes carry ``Location(file, 1, scope=...)``; ``at(scope)`` sets it.
    The scope is the module path a torch import would record (``transformer.h.3.attn``),
    which is how the pipeline stage cut finds the layers."""

    def __init__(self, graph: Graph, file: str) -> None:
        self.b = Builder(graph)
        self.file = file
        self.graph = graph

    def at(self, scope: str) -> Builder:
        self.b.loc = Location(self.file, 1, scope=scope)
        return self.b

    def param(self, name: str, shape: tuple[int, ...], dtype: DType) -> Value:
        return self.b.param(name, TensorType(tuple(shape), dtype))


def linear(b: Builder, x2d: Value, w: Value, bias: Value | None, transposed: bool) -> Value:
    """``x2d @ w (+ bias)``; ``transposed``: ``w`` is stored ``[out, in]`` (torch.nn.Linear),
    and the matmul reads ``transpose(w)``, as the import of a Linear does."""
    y = b.matmul(x2d, b.transpose(w, perm=(1, 0)) if transposed else w)
    return b.add(y, bias) if bias is not None else y
