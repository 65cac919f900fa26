"""Linear layers that share an input of rank 3 or more read it as 2-d rows (inference; issue 37).

``merge-linears`` (merge_linear.py) joins linear layers reading one 2-d input into one GEMM and a
split. MobileViT's last two stages unfold their maps into patches of one pixel, and their q, k
and v layers read the layer norm's [B * P, 1, C] result as it is, so 7 blocks ran three linear
steps where the first stages (2-d input) run one. ``flatten_sibling_linears`` (run by fuse-library
after ``tidy_after_library``, whose ``sink_unit_reshape`` would undo it) rewrites every group of two or more ``linear_pointwise`` nodes reading the same
value x [..., K] of rank 3 or more into

    r = reshape(x) {[rows, K]};  y_i = reshape(linear_pointwise(r, W_i, b_i) {attrs}) {[..., N_i]}

the same values (a linear layer treats every leading index as a row; reshapes are row-major), for
merge-linears to join later, each y_i's reshapes after it merged into one (``merge_reshape_chain``);
a lone layer is left as it is.
"""

from __future__ import annotations

import math
from collections import defaultdict

from ..ir.graph import Graph, Node, Value
from ..ir.types import TensorType
from ..ops.registry import OPS
from .levit_blocks import merge_reshape_chain

__all__ = ["flatten_sibling_linears"]


def _reshape(x: Value, shape: list, at: Node) -> Node:
    """A reshape of x to ``shape`` (not inserted)."""
    a = OPS["reshape"].normalize_attrs({"shape": shape})
    return Node("reshape", [x], a, [TensorType(tuple(shape), x.type.dtype)], at.loc)


def _flattenable(node: Node) -> bool:
    """A linear layer whose input has rank 3 or more, static sizes, and a 2-d weight."""
    if node.op != "linear_pointwise" or len(node.operands) not in (2, 3):
        return False
    x, w = node.operands[:2]
    y = node.results[0]
    return (x.type.rank >= 3 and w.type.rank == 2 and not y.is_output
            and all(isinstance(d, int) for d in (*x.type.shape, *y.type.shape)))


def flatten_sibling_linears(graph: Graph) -> int:
    """The rewrite of the module doc on every group of sibling layers; the layers rewritten."""
    groups: dict[Value, list[Node]] = defaultdict(list)
    for node in graph.nodes:
        if _flattenable(node):
            groups[node.operands[0]].append(node)
    done = 0
    for x, layers in groups.items():
        if len(layers) < 2:
            continue
        first = layers[0]
        rows = math.prod(x.type.shape[:-1])
        r = _reshape(x, [rows, x.type.shape[-1]], first)
        graph.insert_before(first, r)
        for n in layers:
            y = n.results[0]
            t = TensorType((rows, y.type.shape[-1]), y.type.dtype)
            new = Node("linear_pointwise", [r.results[0], *n.operands[1:]], dict(n.attrs), [t], n.loc)
            graph.insert_before(n, new)
            back = _reshape(new.results[0], list(y.type.shape), n)
            graph.insert_before(n, back)
            graph.replace_all_uses(y, back.results[0])
            graph.erase(n)
            for u in [u for u in back.results[0].users if u.op == "reshape"]:
                merge_reshape_chain(graph, u)   # the layer's own reshape after it: one reshape
            done += 1
    return done
