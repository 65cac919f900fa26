"""A convolution's last output columns dropped by a slice, folded into its padding (issue 37).

HuBERT's and wav2vec2's positional convolution pads 4 zeros on both sides of an 8-tap window,
so it makes one column too many, and the model drops it (``HubertSamePadLayer``):

    %y = conv2d_pointwise(%x, %w, %b) {padding=[0, 4], groups=4} : f32[4,64,1,32]
    %s = squeeze(%y) {axes=[2]}                                    : f32[4,64,32]
    %t = slice(%s) {axis=2, start=0, end=-1}                       : f32[4,64,31]
    %g = gelu(%t)                                                  : f32[4,64,31]

The dropped columns are those the padding after the input (``padding_end``) makes, so the
convolution with that much less padding on the right gives the kept ones alone; and the GELU
after the slice, which fuse-library could not reach across it, is then the convolution's own
epilogue:

    %y = conv2d_pointwise(%x, %w, %b) {padding=[0, 4], padding_end=[0, 3], unary="gelu"} : f32[4,64,1,31]
    %g = squeeze(%y) {axes=[2]}                                                          : f32[4,64,31]

``fold_trailing_slices`` does this over a graph, after fuse-library's anchors: for a
``conv2d_pointwise`` with no activation yet whose one user is a slice of the width axis (step
1, from 0, dropping at most the right padding's columns), directly or through a ``squeeze`` of
a unit height. One step (the activation) and one copy (the slice) fewer each call.
"""

from __future__ import annotations

from ..ir.graph import Graph, Node, Value
from ..ir.types import TensorType
from ..ops.registry import OPS
from ..passes.rewrite import sole_user
from .epilogue import UNARY

__all__ = ["fold_trailing_slices", "dropped_columns"]


def _axis(axis: int, rank: int) -> int:
    """``axis`` counted from the front."""
    return axis + rank if axis < 0 else axis


def _unary_kind(node: Node) -> str | None:
    """The epilogue kind (``epilogue.UNARY``) of a one-operand node, or None."""
    for kind, u in UNARY.items():
        if u is not None and u.op == node.op and all(node.attrs.get(k) == v for k, v in u.attrs.items()):
            return kind
    return None


def dropped_columns(slice_node: Node, width_axis: int) -> int | None:
    """How many trailing elements a slice drops along ``width_axis`` (>= 1), where it keeps a
    prefix of that axis with step 1; else None."""
    a = slice_node.attrs
    x = slice_node.operands[0]
    rank = x.type.rank
    if _axis(int(a["axis"]), rank) != width_axis or int(a.get("step", 1)) != 1:
        return None
    size = x.type.shape[width_axis]
    if not isinstance(size, int) or int(a["start"]) != 0:
        return None
    end = int(a["end"])
    end = end + size if end < 0 else min(end, size)
    drop = size - end
    return drop if 0 < drop < size else None


def _fold_one(graph: Graph, conv: Node) -> bool:
    """Fold the trailing slice (and the activation after it) of one convolution; whether it did."""
    a = conv.attrs
    y = conv.results[0]
    if a["binary"] != "none" or a["unary"] != "none" or len(conv.results) != 1:
        return False
    n, c, h, w = y.type.shape
    u = sole_user(y)
    squeeze: Node | None = None
    v, width_axis = y, 3
    if u is not None and u.op == "squeeze" and h == 1 and [_axis(int(i), 4) for i in u.attrs["axes"]] == [2]:
        squeeze, v, width_axis = u, u.results[0], 2
        u = sole_user(v)
    if u is None or u.op != "slice":
        return False
    drop = dropped_columns(u, width_axis)
    end = list(a["padding_end"]) if a.get("padding_end") is not None else [int(p) for p in a["padding"]]
    if drop is None or int(a["stride"][1]) != 1 or drop > end[1]:
        return False
    out = u.results[0]
    act = sole_user(out)
    kind = _unary_kind(act) if act is not None and len(act.operands) == 1 and len(act.results) == 1 \
        and act.results[0].type == out.type else None
    last: Node = act if act is not None and kind is not None and kind != "none" else u
    attrs = dict(a, padding_end=[end[0], end[1] - drop], unary=kind if last is act else "none")
    if attrs["padding_end"] == [int(p) for p in a["padding"]]:
        attrs["padding_end"] = None
    new_type = TensorType((n, c, h, w - drop), y.type.dtype)
    new = Node("conv2d_pointwise", list(conv.operands), OPS["conv2d_pointwise"].normalize_attrs(attrs), [new_type],
               conv.loc)
    graph.insert_before(last, new)
    result: Value = new.results[0]
    if squeeze is not None:
        sq = Node("squeeze", [result], squeeze.attrs, [last.results[0].type], squeeze.loc)
        graph.insert_before(last, sq)
        result = sq.results[0]
    graph.replace_all_uses(last.results[0], result)
    for dead in dict.fromkeys(d for d in (last, u, squeeze, conv) if d is not None):
        graph.erase(dead)
    return True


def fold_trailing_slices(graph: Graph) -> int:
    """Fold every convolution's trailing-column slice into its padding (``_fold_one``); the
    number folded."""
    return sum(_fold_one(graph, node) for node in list(graph.nodes)
               if node.op == "conv2d_pointwise" and node.graph is graph)
