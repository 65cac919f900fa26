"""Constant folding."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir.attrs import DenseAttr
from ..ir.builder import Builder
from ..ir.graph import Graph, Node, Value
from ..ops.registry import OPS
from .manager import Pass, register_pass
from .rewrite import constant_array, emit_splat, erase_if_dead, has_effects, splat_value


@register_pass
class FoldConstants(Pass):
    """Evaluate nodes whose operands are all constants and replace them by constants.

    A constant is the result of a node with no operands and no effects (``constant``,
    ``full``, ``iota``, ...). A foldable node (no effects, at least one operand, all of them
    constants) is evaluated with its op's NumPy reference, exactly as the reference
    interpreter would (results cast to the inferred dtype), and each result becomes a
    ``full`` when all its elements are equal, else a ``constant`` with a DenseAttr.

    Elementwise ops on splat operands are evaluated on one element, so they fold at any
    size. Otherwise a node is skipped when an operand or a result has more than
    ``max-elements`` elements (folding would put a large tensor into the IR), or when its
    reference raises (the error is left for run time). Constants left unused are erased.
    """

    name = "fold-constants"

    @dataclass
    class Options:
        max_elements: int = 1 << 16

    def run(self, graph: Graph) -> Graph:
        cap = self.options.max_elements
        arrays: dict[Value, np.ndarray] = {}   # materialized constants, by value
        builder = Builder(graph)
        for node in graph.nodes:
            ops = node.operands
            if not ops or node.graph is not graph:
                continue
            if not all(_is_constant(v) for v in ops) or has_effects(node):
                continue
            opdef = OPS[node.op]
            results = self._evaluate_splat(node, opdef) if opdef.elementwise else None
            if results is None:
                if any(v.type.numel > cap for v in ops) or any(r.type.numel > cap for r in node.results):
                    continue
                args = [self._materialize(v, arrays) for v in ops]
                known = [a for a in args if a is not None]
                results = _evaluate(node, opdef, known) if len(known) == len(args) else None
                if results is None:
                    continue
            builder.loc = node.loc
            builder.set_insertion_before(node)
            for r, a in zip(node.results, results):
                new = _emit_constant(builder, r.type, a)
                if new is None:
                    break
                if a.shape == r.type.shape and a.size <= cap:
                    arrays[new] = a
                graph.replace_all_uses(r, new)
            erase_if_dead(graph, node)
        return graph

    @staticmethod
    def _materialize(v: Value, arrays: dict[Value, np.ndarray]) -> np.ndarray | None:
        """The array of constant ``v`` (cached); None when its reference fails."""
        a = arrays.get(v)
        if a is None:
            producer = v.producer
            if producer is None:  # a graph input: no value known at compile time
                return None
            try:
                a = constant_array(producer)
            except Exception:  # a creation op rejecting its attributes: leave it to run time
                return None
            if a is None or a.shape != v.type.shape:
                return None
            arrays[v] = a
        return a

    @staticmethod
    def _evaluate_splat(node: Node, opdef) -> list[np.ndarray] | None:
        """Evaluate an elementwise node whose operands are all splats on a single element;
        returns 0-d results (None when an operand is not a known splat)."""
        args = []
        for v in node.operands:
            s = splat_value(v)
            if s is None:
                return None
            with np.errstate(all="ignore"):
                args.append(np.asarray(s).astype(v.type.dtype.np))
        return _evaluate(node, opdef, args, [r.type.with_shape(()) for r in node.results])


def _is_constant(v: Value) -> bool:
    p = v.producer
    return p is not None and not p.operands and len(p.results) == 1 and p.op in OPS and not has_effects(p)


def _evaluate(node: Node, opdef, args: list[np.ndarray], types=None) -> list[np.ndarray] | None:
    """Run the op's reference as the interpreter does; None when it fails or disagrees
    with the node's result types."""
    types = types if types is not None else [r.type for r in node.results]
    try:
        with np.errstate(all="ignore"):
            res = opdef.reference(args, node.attrs)
    except Exception:  # the reference rejects these inputs; the interpreter would fail at run time
        return None
    if not isinstance(res, (list, tuple)):
        res = (res,)
    if len(res) != len(types):
        return None
    out = []
    for a, t in zip(res, types):
        a = np.asarray(a)
        if a.dtype != t.dtype.np:
            with np.errstate(all="ignore"):  # NaN to int is undefined, as at run time
                a = a.astype(t.dtype.np)
        if a.shape != t.shape:
            return None
        out.append(a)
    return out


def _emit_constant(builder: Builder, t, a: np.ndarray) -> Value | None:
    """A node holding ``a``: a ``full`` when ``a`` has several elements, all equal, or is the
    single element computed for a splat result; else a ``constant``."""
    emit = lambda op, *xs, **attrs: builder.emit(op, *xs, **attrs)  # noqa: E731
    if a.shape != t.shape:  # the one element of a splat result
        return emit_splat(emit, t, a[()])
    d = DenseAttr(a)
    if a.size > 1 and d.is_splat():
        return emit_splat(emit, t, a.reshape(-1)[0])
    if "constant" in OPS:
        return emit("constant", value=d)
    return None
