"""What both executors share: binding inputs and weights to a graph's input values."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ..ir.diagnostics import ExecutionError
from ..ir.dtypes import from_numpy
from ..ir.graph import Graph, Value, input_name


def bind_inputs(graph: Graph, inputs: Sequence[Any] | Mapping[str, Any] | None,
                weights: Mapping[str, Any] | None) -> list[tuple[Value, Any]]:
    """Pair each graph input with its array.

    ``input``-role values come from ``inputs`` (a sequence in order, or a mapping by name);
    ``param`` and ``state`` values come from ``weights`` (default: ``graph.weights``), or from
    ``inputs`` when given there by name.
    """
    weights = graph.weights if weights is None else weights
    data_inputs = [v for v in graph.inputs if v.role == "input"]
    by_name: Mapping[str, Any]
    if inputs is None:
        by_name = {}
    elif isinstance(inputs, Mapping):
        by_name = inputs
        unknown = set(inputs) - {input_name(v) for v in graph.inputs}
        if unknown:
            raise ExecutionError(f"@{graph.name} has no input named {', '.join(sorted(unknown))}; "
                                 f"its inputs are {', '.join(input_name(v) for v in graph.inputs)}")
    else:
        seq = list(inputs)
        if len(seq) != len(data_inputs):
            raise ExecutionError(f"@{graph.name} takes {len(data_inputs)} input(s) "
                                 f"({', '.join('%' + input_name(v) for v in data_inputs)}), got {len(seq)}")
        by_name = {input_name(v): a for v, a in zip(data_inputs, seq)}
    out = []
    missing = []
    for v in graph.inputs:
        name = input_name(v)
        if name in by_name:
            out.append((v, by_name[name]))
        elif v.role != "input" and name in weights:
            out.append((v, weights[name]))
        else:
            missing.append(v)
    if missing:
        what = ", ".join(f"%{v.name} ({v.role})" for v in missing)
        hint = " (weights are loaded from the .safetensors file beside the .pir file)" if any(
            v.role != "input" for v in missing) else ""
        raise ExecutionError(f"@{graph.name}: no value given for {what}{hint}")
    return out


def check_array(v: Value, shape: tuple[int, ...], dtype_name: str) -> None:
    t = v.type
    if tuple(shape) != t.shape or dtype_name != t.dtype.name:
        raise ExecutionError(f"input %{v.name} ({v.role}) expects {t}, got {dtype_name}[{','.join(map(str, shape))}]")


def numpy_dtype_name(a: np.ndarray) -> str:
    try:
        return from_numpy(a.dtype).name
    except KeyError:
        return str(a.dtype)
