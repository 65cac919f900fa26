"""The torch executor: runs a graph with each op record's torch implementation.

A graph is compiled once into a flat list of steps over numbered slots (no dict lookups or
attribute access per op at run time); slots are released after their last use.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ..ir.diagnostics import ExecutionError, PartitaError
from ..ir.graph import Graph, Value
from ..ops._lazy import to_torch_dtype, torch
from ..ops.registry import OPS
from .common import bind_inputs, check_array


class TorchProgram:
    """A graph prepared for repeated execution with torch."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        slot: dict[Value, int] = {}
        for v in graph.inputs:
            slot[v] = len(slot)
        last_use: dict[Value, int] = {}
        nodes = list(graph.nodes)
        for i, n in enumerate(nodes):
            for v in n.operands:
                last_use[v] = i
            for r in n.results:
                slot[r] = len(slot)
        outputs = set(graph.outputs)
        self.steps = []
        for i, n in enumerate(nodes):
            opdef = OPS[n.op]
            frees = tuple(slot[v] for v in dict.fromkeys(n.operands) if last_use[v] == i and v not in outputs)
            dtypes = tuple(to_torch_dtype(r.type.dtype) for r in n.results)
            self.steps.append((opdef.torch, tuple(slot[v] for v in n.operands), n.attrs,
                               tuple(slot[r] for r in n.results), dtypes, frees, n))
        self.num_slots = len(slot)
        self.input_slots = [(v, slot[v]) for v in graph.inputs]
        self.output_slots = [slot[v] for v in graph.outputs]

    def __call__(self, inputs: Sequence[Any] | Mapping[str, Any] | None = None,
                 weights: Mapping[str, Any] | None = None) -> list:
        env: list = [None] * self.num_slots
        for v, a in bind_inputs(self.graph, inputs, weights):
            t = to_tensor(a)
            check_array(v, tuple(t.shape), _dtype_name(t))
            env[v.index] = t
        with torch.inference_mode():
            for fn, args, attrs, outs, dtypes, frees, node in self.steps:
                try:
                    res = fn([env[i] for i in args], attrs)
                except PartitaError:
                    raise
                except Exception as e:
                    where = f" at {node.text_loc or node.loc}" if (node.text_loc or node.loc) else ""
                    raise ExecutionError(f"{node.op}{where}: the torch implementation failed: "
                                         f"{type(e).__name__}: {e}") from e
                if len(outs) == 1:
                    if type(res) in (list, tuple):
                        res = res[0]
                    if res.dtype is not dtypes[0]:
                        res = res.to(dtypes[0])
                    env[outs[0]] = res
                else:
                    for o, r, dt in zip(outs, res, dtypes):
                        env[o] = r if r.dtype is dt else r.to(dt)
                for i in frees:
                    env[i] = None
        return [env[i] for i in self.output_slots]


def to_tensor(a: Any):
    if isinstance(a, torch.Tensor):
        return a
    arr = np.asarray(a)
    if arr.dtype.name == "bfloat16":
        return torch.from_numpy(arr.view(np.uint16).copy()).view(torch.bfloat16)
    # np.ascontiguousarray turns a 0-d array into shape (1,); np.require keeps the rank.
    # A read-only array (a constant's payload, a memory-mapped weight) is copied: torch
    # tensors are always writable, and sharing would let a later in-place op change it.
    return torch.from_numpy(np.require(arr, requirements=("C", "W")))


def to_numpy(t) -> np.ndarray:
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.detach().cpu().view(torch.uint16).numpy().view(ml_dtypes.bfloat16)
    return t.detach().cpu().numpy()


def _dtype_name(t) -> str:
    from ..ops._lazy import from_torch_dtype

    try:
        return from_torch_dtype(t.dtype).name
    except KeyError:
        return str(t.dtype)


def run(graph: Graph, inputs: Sequence[Any] | Mapping[str, Any] | None = None,
        weights: Mapping[str, Any] | None = None) -> list:
    """Run ``graph`` once with torch; returns torch tensors."""
    return TorchProgram(graph)(inputs, weights)
