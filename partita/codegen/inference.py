"""Graph rewrites for inference: ``fold-params`` and ``fold-batch-norm``.

``fold-params``: a node with no effects whose operands are all known (params and state whose
values ``graph.weights`` holds, constants, or results folded before it), at least one of them a
param or state (or an ``iota``: values made from shapes alone, such as a causal mask), is
computed once, by its op's torch implementation (what the program would compute at every call),
and its results become new ``param`` inputs named ``<first param's name>.folded`` with their
values in ``graph.weights``. It is what torch's freezing does to an inference graph's
param-only subgraphs: a weight standardized at every call (BiT's convolutions), a weight
transposed or reshaped before its matmul, a bias scaled by a constant. A node is left when its
results are graph outputs, or when they hold more elements than its largest operand and more
than ``MAX_GROWTH`` (folding a bias broadcast to an activation's shape would store the
activation-sized copy). Like ``fold-batch-norm``, it assumes the params are the values
``graph.weights`` holds: a compiled inference program's. After folding, an ``index_select``
whose known index is ``0 .. n-1`` along its axis is dropped (its uses read its input).

``fold-batch-norm``: a ``batch_norm`` in inference mode (``training=false``: it normalizes with
its running statistics) whose input is a ``conv2d`` or ``conv3d`` read by nothing else becomes
part of that convolution. With ``s = gamma / sqrt(running_var + eps)``:

    conv(x, W, b) -> batch_norm   ==   conv(x, W * s[:, None, ...], (b - running_mean) * s + beta)

(``b`` is 0 for a convolution without a bias). It applies only where every value it reads is
known: params and state whose values ``graph.weights`` holds (by input name), and constants.
The new weight and bias are computed once, in float64, and stored in the convolution's dtype:

- for a convolution whose weight is a graph input, as new ``param`` inputs named
  ``<weight name>.bn_folded`` and ``<weight name>.bn_folded_bias`` with their values in
  ``graph.weights``;
- for a constant weight, as new ``constant`` nodes.

The batch_norm node goes. An input nothing reads any more (the old weight, the statistics) is
removed from the graph's inputs and from ``graph.weights``; one that something else still reads
stays. The folded graph computes the same function up to f32 rounding (about 1e-6 relative),
not bit for bit: the normalization's arithmetic moves into the convolution's sums.
"""

from __future__ import annotations

import numpy as np

from ..ir.attrs import DenseAttr
from ..ir.graph import Graph, Node, Value, input_name
from ..passes.manager import Pass, register_pass
from ..passes.rewrite import constant_array, erase_if_dead

__all__ = ["FoldBatchNorm", "FoldParams", "known_value", "drop_identity_gathers", "MAX_GROWTH", "SHAPE_SOURCES"]

# Ops without operands whose results depend on their attributes alone (the counts a mask or a
# position index is built from): fold-params computes them, and what only they and params
# feed, once. (``full`` and splat constants stay: kernels read them as immediates.)
SHAPE_SOURCES = ("iota",)

# A folded node whose results hold more elements than its largest operand is kept only up to
# this many elements (a small table, not an activation-sized broadcast).
MAX_GROWTH = 4096

_CONVS = ("conv2d", "conv3d")


def known_value(graph: Graph, v: Value) -> np.ndarray | None:
    """The value ``v`` has at every call, when the graph knows it: a param or state input's
    array in ``graph.weights``, or a constant's. None otherwise (or when the stored array does
    not have ``v``'s type)."""
    if v.is_input:
        if v.role not in ("param", "state"):
            return None
        a = graph.weights.get(input_name(v))
    else:
        p = v.producer
        a = None if p is None else constant_array(p)
    if a is None:
        return None
    a = np.asarray(a)
    if a.shape != v.type.shape or a.dtype != v.type.dtype.np:
        return None
    return a


def _unique_input_name(graph: Graph, name: str) -> str:
    names = {input_name(v) for v in graph.inputs} | set(graph.weights)
    if name not in names:
        return name
    i = 1
    while f"{name}.{i}" in names:
        i += 1
    return f"{name}.{i}"


def _drop_if_unused(graph: Graph, v: Value) -> None:
    if v.has_uses:
        return
    if v.is_input:
        name = input_name(v)
        graph.remove_input(v)
        if name in graph.weights:
            del graph.weights[name]
    elif v.producer is not None and v.producer.graph is graph:
        erase_if_dead(graph, v.producer)


@register_pass
class FoldParams(Pass):
    """Nodes computed from params (and constants) alone are computed once; their results
    become params (see the module doc)."""

    name = "fold-params"

    def run(self, graph: Graph) -> Graph:
        from ..ops.registry import OPS
        from ..passes.rewrite import has_effects

        folded: dict[Value, np.ndarray] = {}
        outputs = set(graph.outputs)
        for node in list(graph.nodes):
            if node.graph is not graph or has_effects(node) or node.op not in OPS:
                continue
            if not node.operands and node.op not in SHAPE_SOURCES:
                continue
            if any(r in outputs for r in node.results):
                continue
            if node.operands and not any(v in folded or (v.is_input and v.role in ("param", "state"))
                                         for v in node.operands):
                continue
            maybe = [folded.get(v) if v in folded else known_value(graph, v) for v in node.operands]
            args = [a for a in maybe if a is not None]
            if len(args) != len(maybe):
                continue
            biggest = max((a.size for a in args), default=0)
            if sum(r.type.numel for r in node.results) > max(biggest, MAX_GROWTH):
                continue
            results = _compute(node, args)
            if results is None:
                continue
            base = next(input_name(v) for v in node.operands if v.is_input) if any(
                v.is_input for v in node.operands) else ("param" if node.operands else node.op)
            for r, a in zip(node.results, results):
                name = base if base.endswith(".folded") else f"{base}.folded"   # a chain: one suffix
                nv = graph.add_input(_unique_input_name(graph, name), r.type, "param")
                graph.weights[input_name(nv)] = a
                folded[nv] = a
                graph.replace_all_uses(r, nv)
            operands = list(node.operands)
            graph.erase(node)
            for v in dict.fromkeys(operands):
                _drop_if_unused(graph, v)
        drop_identity_gathers(graph, folded)
        return graph


def drop_identity_gathers(graph: Graph, folded: dict[Value, np.ndarray]) -> int:
    """An ``index_select`` whose index is known and counts 0, 1, ..., n - 1 along an axis of
    length n returns its input unchanged: its uses read the input (a causal mask gathered
    row by row through indices made from shapes). Returns how many went."""
    count = 0
    for node in list(graph.nodes):
        if node.graph is not graph or node.op != "index_select" or len(node.operands) != 2:
            continue
        x, idx, r = node.operands[0], node.operands[1], node.results[0]
        if r.is_output or r.type != x.type:
            continue
        a = folded.get(idx) if idx in folded else known_value(graph, idx)
        axis = node.attrs.get("axis", 0)
        n = x.type.shape[axis] if -len(x.type.shape) <= axis < len(x.type.shape) else None
        if a is None or n is None or a.shape != (n,) or not np.array_equal(a, np.arange(n)):
            continue
        graph.replace_all_uses(r, x)
        graph.erase(node)
        _drop_if_unused(graph, idx)
        count += 1
    return count


def _compute(node: Node, args: list[np.ndarray]) -> list[np.ndarray] | None:
    """``node``'s results on ``args`` by its op's torch implementation, as NumPy arrays of the
    results' types; None when it raises or gives another shape or dtype (left for run time)."""
    from ..backend.common import to_numpy
    from ..backend.torch_exec import to_tensor
    from ..ops._lazy import torch
    from ..ops.registry import OPS

    try:
        with torch.inference_mode():
            res = OPS[node.op].torch([to_tensor(np.ascontiguousarray(a)) for a in args], dict(node.attrs))
    except Exception:
        return None
    if not isinstance(res, (list, tuple)):
        res = (res,)
    out = []
    for r, t in zip(node.results, res):
        a = np.ascontiguousarray(to_numpy(t))
        if a.shape != r.type.shape or a.dtype != r.type.dtype.np:
            return None
        out.append(a)
    return out if len(out) == len(node.results) else None


@register_pass
class FoldBatchNorm(Pass):
    """batch_norm in inference mode after a convolution (read by nothing else), with every
    weight and statistic known, is folded into the convolution's weight and bias."""

    name = "fold-batch-norm"

    def run(self, graph: Graph) -> Graph:
        for bn in list(graph.nodes):
            if bn.graph is graph and bn.op == "batch_norm" and not bn.attrs["training"]:
                _fold(graph, bn)
        return graph


def _fold(graph: Graph, bn: Node) -> bool:
    y = bn.operands[0]
    conv = y.producer
    if conv is None or conv.op not in _CONVS or len(conv.results) != 1:
        return False
    if y.is_output or len(y.users) != 1 or y.users.get(bn) != 1:
        return False  # the unnormalized result is read elsewhere
    dt = y.type.dtype
    if not dt.is_float or dt.storage:
        return False
    w = conv.operands[1]
    b = conv.operands[2] if len(conv.operands) > 2 else None
    stats = bn.operands[1:5]
    values: list[np.ndarray] = []
    for v in [w, *stats] + ([b] if b is not None else []):
        a = known_value(graph, v)
        if a is None:
            return False
        values.append(a.astype(np.float64))
    W, gamma, beta, mean, var = values[:5]
    B = values[5] if b is not None else np.zeros(W.shape[0])
    scale = gamma / np.sqrt(var + float(bn.attrs["eps"]))
    w_new = (W * scale.reshape((-1,) + (1,) * (W.ndim - 1))).astype(dt.np)
    b_new = ((B - mean) * scale + beta).astype(dt.np)
    btype = bn.operands[2].type  # [O], the convolution's dtype
    before: list[Node] = []
    if w.is_input:
        base = input_name(w)
        wv = graph.add_input(_unique_input_name(graph, f"{base}.bn_folded"), w.type, "param")
        graph.weights[input_name(wv)] = w_new
        bv = graph.add_input(_unique_input_name(graph, f"{base}.bn_folded_bias"), btype, "param")
        graph.weights[input_name(bv)] = b_new
    else:
        cw = Node("constant", [], {"value": DenseAttr(w_new)}, [w.type], conv.loc)
        cb = Node("constant", [], {"value": DenseAttr(b_new)}, [btype], bn.loc)
        before += [cw, cb]
        wv, bv = cw.results[0], cb.results[0]
    new = Node(conv.op, [conv.operands[0], wv, bv], dict(conv.attrs), [bn.results[0].type], conv.loc)
    for n in before:
        graph.insert_before(conv, n)
    graph.insert_before(conv, new)
    graph.replace_all_uses(bn.results[0], new.results[0])
    graph.erase(bn)
    graph.erase(conv)
    for v in dict.fromkeys([w, *stats] + ([b] if b is not None else [])):
        _drop_if_unused(graph, v)
    return True
