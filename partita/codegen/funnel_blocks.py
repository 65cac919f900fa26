"""In-place writes into a view, read back through the same view, taken as the values written;
run by fuse-library before its anchors.

Funnel Transformer's relative-position attention ends with ``positional_attn *= cls_mask`` on a
view (``_relative_shift_gather``'s slice, reshape, slice of the scores). Functionalized, the
write becomes scatters of the new values back into each base along the view chain, and the
later read takes the same view of the scattered base again:

    v = slice(reshape(slice(s, axis=2, start=1)), axis=3, end=8)
    s2 = scatter_elements(s, iota(axis=2) + 1, reshape(scatter_elements(r, iota(axis=3), v * m)))
    out = slice(reshape(slice(s2, axis=2, start=1)), axis=3, end=8)     # == v * m

Each ``slice(scatter_elements(x, iota + k, u), axis, start=k, end=k + len)``, the index an iota
along the scatter's axis that covers ``u`` whole and the slice taking exactly the rows written,
is ``u`` (so is a scatter by ``iota`` that writes every element of ``x``: ``whole_scatter``,
what is left where the shift is 0); a reshape back to the type the chain had is its operand (``drop_reshape_round_trip``).
The read then needs no scatter, and the scatters, with nothing left reading them, are dead: six
scatters, six slices and six reshapes fewer in the zoo's Funnel (three layers), one copy of the
scores each.

Also here, as the same walk: einsum's lowering writes ``reshape(transpose(unsqueeze(x)))`` (a
unit axis added for the batched product, then moved); where the transpose is read by reshapes
only, the unit axes change no element's order and are dropped (``unit_axes_before_transpose``):
one view step fewer each, ten in the zoo's Funnel. A transpose that moves unit axes only, between
reshapes (``unit_axis_transpose``), and an unsqueeze read by a reshape (``reshape_of_unsqueeze``)
are reshapes too: the reshapes reading them read the value before (einsum's ``bnij`` outputs and
the softmax's ``unsqueeze`` before the product with v), so the spelled attention's matcher sees
``reshape(matmul)`` and ``reshape(softmax)`` (codegen/attention_spelled.py).

The rewrites keep the graph's meaning exactly (the elements read are the ones written);
tests/codegen/test_funnel_blocks.py checks it against the reference interpreter.
"""

from __future__ import annotations

from ..ir.graph import Graph, Node, Value
from ..ir.types import TensorType
from ..ops import OPS
from ..ops.shape import unsqueeze_axes
from ..passes.rewrite import erase_if_dead, sole_user
from .levit_blocks import drop_reshape_round_trip

__all__ = ["iota_offset", "read_back_scatter", "whole_scatter", "unit_axes_before_transpose", "unit_axis_transpose",
           "reshape_of_unsqueeze", "tidy_view_writes"]


def _scalar_int(v: Value) -> int | None:
    """The value of a rank-0 integer ``full``, or None."""
    p = v.producer
    if p is None or p.op != "full" or v.type.rank != 0 or not v.type.dtype.is_int:
        return None
    value = p.attrs["value"]
    return int(value) if float(value) == int(value) else None


def iota_offset(index: Value, axis: int) -> int | None:
    """``k`` where ``index`` is ``iota(axis) + k`` (k a scalar integer ``full``; 0 without the
    add) of ``index``'s own shape, else None."""
    p = index.producer
    if p is None:
        return None
    k = 0
    if p.op == "add" and len(p.operands) == 2:
        a, b = p.operands
        for it, c in ((a, b), (b, a)):
            off = _scalar_int(c)
            if off is not None and it.type == index.type:
                p, k = it.producer, off
                break
        else:
            return None
        if p is None:
            return None
    if p.op != "iota" or tuple(p.attrs["shape"]) != index.type.shape or p.attrs["axis"] != axis:
        return None
    return k


def read_back_scatter(graph: Graph, node: Node) -> bool:
    """``node`` = slice(scatter_elements(x, iota + k, u)) taking exactly the rows written: its
    uses read ``u``; True if rewritten."""
    if node.op != "slice" or node.attrs["step"] != 1:
        return False
    s = node.operands[0]
    sc = s.producer
    if sc is None or sc.op != "scatter_elements" or sc.attrs["reduction"] != "none" or s.is_output:
        return False
    x, index, u = sc.operands
    rank = x.type.rank
    axis = sc.attrs["axis"] % rank if rank else 0
    if node.attrs["axis"] % rank != axis or index.type.shape != u.type.shape:
        return False
    if any(u.type.shape[d] != x.type.shape[d] for d in range(rank) if d != axis):
        return False   # u covers only part of another dim: the read takes more than was written
    k = iota_offset(index, axis)
    if k is None:
        return False
    start, stop, _ = slice(node.attrs["start"], node.attrs["end"], 1).indices(x.type.shape[axis])
    if (start, stop) != (k, k + u.type.shape[axis]) or u.type != node.results[0].type:
        return False
    graph.replace_all_uses(node.results[0], u)
    erase_if_dead(graph, node)
    return True


def whole_scatter(graph: Graph, node: Node) -> bool:
    """``node`` = scatter_elements(x, iota, u) with ``u`` of ``x``'s type (every element
    written, each at its own place): its uses read ``u``; True if rewritten."""
    if node.op != "scatter_elements" or node.attrs["reduction"] != "none":
        return False
    x, index, u = node.operands
    if u.type != x.type or index.type.shape != u.type.shape or node.results[0].is_output:
        return False
    axis = node.attrs["axis"] % x.type.rank if x.type.rank else 0
    if iota_offset(index, axis) != 0:
        return False
    graph.replace_all_uses(node.results[0], u)
    erase_if_dead(graph, node)
    return True


def unit_axes_before_transpose(graph: Graph, node: Node) -> bool:
    """``node`` = transpose(unsqueeze(x)) read by reshapes only (einsum's lowering): the
    transpose of ``x`` by the same order without the unit axes, the reshapes reading it (the
    same elements in the same order); True if rewritten."""
    if node.op != "transpose" or node.results[0].is_output or not node.results[0].users:
        return False
    u = node.operands[0].producer
    if u is None or u.op != "unsqueeze" or sole_user(u.results[0]) is not node:
        return False
    if any(r.op != "reshape" for r in node.results[0].users):
        return False
    x = u.operands[0]
    unit = set(unsqueeze_axes(x.type.rank, u.attrs["axes"]))
    perm = [p - sum(1 for a in unit if a < p) for p in node.attrs["perm"] if p not in unit]
    shape = tuple(x.type.shape[p] for p in perm)
    t = Node("transpose", [x], OPS["transpose"].normalize_attrs({"perm": perm}), [TensorType(shape, x.type.dtype)],
             node.loc)
    graph.insert_before(node, t)
    for r in list(node.results[0].users):
        graph.set_operand(r, 0, t.results[0])
    erase_if_dead(graph, node)
    return True


def unit_axis_transpose(graph: Graph, node: Node) -> bool:
    """``node`` = transpose(reshape(x)) moving only unit axes (the other axes in their order),
    read by reshapes only: the reshapes read ``x`` (the same elements in the same order); True
    if rewritten."""
    if node.op != "transpose" or node.results[0].is_output or not node.results[0].users:
        return False
    r = node.operands[0].producer
    if r is None or r.op != "reshape" or any(u.op != "reshape" for u in node.results[0].users):
        return False
    if tuple(node.attrs["perm"]) == (0, 2, 1, 3):
        # [B, T, H, E] <-> [B, H, T, E] stays a transpose even with one token: the attention
        # matchers (LeViT's last stage, T = 1) read the heads' move from it.
        return False
    shape = node.operands[0].type.shape
    kept = [p for p in node.attrs["perm"] if shape[p] != 1]
    if kept != sorted(kept):
        return False
    x = r.operands[0]
    for u in list(node.results[0].users):
        graph.set_operand(u, 0, x)
    erase_if_dead(graph, node)
    erase_if_dead(graph, r)
    return True


def reshape_of_unsqueeze(graph: Graph, node: Node) -> bool:
    """``node`` = reshape(unsqueeze(x)): the reshape reads ``x``; True if rewritten."""
    if node.op != "reshape":
        return False
    u = node.operands[0].producer
    if u is None or u.op != "unsqueeze":
        return False
    graph.set_operand(node, 0, u.operands[0])
    erase_if_dead(graph, u)
    return True


def tidy_view_writes(graph: Graph) -> int:
    """``read_back_scatter``, ``whole_scatter`` (and the reshape round trips they leave) and
    ``unit_axes_before_transpose``, ``unit_axis_transpose``, ``reshape_of_unsqueeze`` over
    ``graph`` in one walk;
    the number of rewrites made."""
    made = 0
    for node in list(graph.nodes):
        if node.graph is graph and (read_back_scatter(graph, node) or whole_scatter(graph, node)
                                    or drop_reshape_round_trip(graph, node)
                                    or unit_axes_before_transpose(graph, node)
                                    or unit_axis_transpose(graph, node) or reshape_of_unsqueeze(graph, node)):
            made += 1
    return made
