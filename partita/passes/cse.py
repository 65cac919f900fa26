"""Common subexpression elimination."""

from __future__ import annotations

from typing import Any

from ..ir.graph import Graph
from ..ops.registry import OPS
from .manager import Pass, register_pass
from .rewrite import DEPENDS, PURE, effect_classes, has_effects


def _attr_key(v: Any) -> Any:
    """A hashable key equal for attribute values only when they are the same value: unlike
    ``==``, it tells 0.0 from -0.0 and 1 from 1.0 and True, and equates NaN with NaN."""
    t = type(v)
    if t is float:
        return (float, v.hex())
    if t is tuple:
        return (tuple, tuple(_attr_key(x) for x in v))
    return (t, v)


@register_pass
class CommonSubexpressionElimination(Pass):
    """Merge nodes that compute the same thing: same op, same operands, same attributes.

    Operands of ops whose record says ``commutative`` are compared as an unordered pair, so
    ``add(a, b)`` and ``add(b, a)`` merge. Ops with effects are never merged (nor are ops
    that are not registered). A node that recomputes a forward value for the backward
    (``Location.recompute``) is a deliberate copy, made so the original can die early; it is
    never merged with a node of another recomputation policy (the model's own included).
    One forward sweep with a hash table: linear in the number of nodes.
    """

    name = "cse"

    def run(self, graph: Graph) -> Graph:
        seen: dict[tuple, Any] = {}
        classes = effect_classes()
        commutative = {name for name, d in OPS.items() if d.commutative}
        replace, erase = graph.replace_all_uses, graph.erase
        for node in graph.nodes:
            op = node.op
            c = classes.get(op)
            if c != PURE and (c != DEPENDS or has_effects(node)):
                continue
            ops = node.operands
            if len(ops) == 2 and op in commutative and id(ops[0]) > id(ops[1]):
                key_ops: tuple = (ops[1], ops[0])
            else:
                key_ops = tuple(ops)
            attrs = node.attrs
            loc = node.loc
            key: tuple = (op, key_ops, tuple([(k, _attr_key(v)) for k, v in attrs.items()]) if attrs else None,
                          loc.recompute if loc is not None else "")
            first = seen.setdefault(key, node)
            if first is node or not node.results:
                continue
            if any(a.type != b.type for a, b in zip(first.results, node.results)):
                continue  # same inputs should give the same types; keep both if they do not
            for a, b in zip(node.results, first.results):
                replace(a, b)
            erase(node)
        return graph
