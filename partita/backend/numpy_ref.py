"""The reference interpreter: runs a graph op by op with the NumPy references.

Slow and simple on purpose: it is the definition of what a graph means. Every result is
checked against the type the verifier agreed to (shape exactly; dtype by casting), so a
reference that disagrees with its own type rule is caught at once.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ..ir.diagnostics import ExecutionError
from ..ir.graph import Graph, Node, Value
from ..ops.registry import OPS
from .common import bind_inputs, check_array, describe_node, host_array, node_error, numpy_dtype_name


def run(graph: Graph, inputs: Sequence[Any] | Mapping[str, Any] | None = None,
        weights: Mapping[str, Any] | None = None) -> list[np.ndarray]:
    env: dict[Value, np.ndarray] = {}
    for v, a in bind_inputs(graph, inputs, weights):
        arr = host_array(v, a)
        check_array(v, arr.shape, numpy_dtype_name(arr))
        env[v] = arr
    remaining = {v: v.num_uses for v in env}
    outputs = set(graph.outputs)
    for node in graph.nodes:
        for r, a in zip(node.results, run_node_reference(node, [env[v] for v in node.operands])):
            env[r] = a
            remaining[r] = r.num_uses
        for v in node.operands:  # free values after their last use
            n = remaining.get(v)
            if n is not None:
                if n <= 1 and v not in outputs:
                    env.pop(v, None)
                    remaining.pop(v, None)
                else:
                    remaining[v] = n - 1
    return [env[v] for v in graph.outputs]


def run_node_reference(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
    """Run one node's NumPy reference on ``args``; results in the node's result dtypes,
    their shapes checked against the type rule. Any error names the node (results, op, place)."""
    opdef = OPS[node.op]
    try:
        with np.errstate(all="ignore"):
            res = opdef.reference(args, node.attrs)
    except Exception as e:
        err = node_error(node, e, "reference implementation")
        if err is e:
            raise
        raise err from e
    if not isinstance(res, (list, tuple)):
        res = (res,)
    if len(res) != len(node.results):
        raise ExecutionError(f"{describe_node(node)}: the reference returned {len(res)} result(s), "
                             f"expected {len(node.results)}")
    out = []
    for r, a in zip(node.results, res):
        t = r.type
        a = np.asarray(a)
        if a.dtype != t.dtype.np:
            a = a.astype(t.dtype.np)
        if a.shape != t.shape:
            raise ExecutionError(f"{describe_node(node)}: the reference returned shape {list(a.shape)}, "
                                 f"the type rule says {t}")
        out.append(a)
    return out
