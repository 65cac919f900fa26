"""Dead code elimination."""

from __future__ import annotations

from ..ir.graph import Graph
from .manager import Pass, register_pass
from .rewrite import DEPENDS, PURE, effect_classes, has_effects


@register_pass
class DeadCodeElimination(Pass):
    """Remove nodes whose results are unused, transitively, in one reverse sweep.

    A node whose op declares effects for its attributes (``OPS[op].effects_of(attrs)``:
    random numbers, collectives, I/O) is never removed, even when nothing uses its results;
    neither is a node of an op that is not registered. Graph inputs are part of the
    signature and are kept.
    """

    name = "dce"

    def run(self, graph: Graph) -> Graph:
        classes = effect_classes()
        erase = graph.erase
        # Walking backwards, every user of a node is visited before the node, so one sweep
        # sees final use counts and removes whole dead chains.
        for node in graph.reversed_nodes():
            for r in node.results:
                if r.users or r._out_uses:
                    break
            else:
                c = classes.get(node.op)
                if c == PURE or (c == DEPENDS and not has_effects(node)):
                    erase(node)
        return graph
