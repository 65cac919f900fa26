"""Small rewrites that let fuse-library see LeViT's blocks (and any model written the same way)
as the linear layers and epilogues they are; run by fuse-library before its anchors.

- **Reshape round trips**: ``reshape(reshape(x))`` back to ``x``'s own shape is ``x``.
  transformers' ``MLPLayerWithBN`` writes ``batch_norm(y.flatten(0, 1)).reshape_as(y)``; with
  the batch norm folded into the linear layer, ``y -> [B*T, N] -> [B, T, N]`` is left between
  the linear layer and its hardswish, which then cannot be taken as the GEMM's epilogue.
- **Reshape chains** (after fuse-library): ``reshape(reshape(x))`` where the inner one has no
  other reader is one reshape of ``x``.
- **Unit dims dropped before a linear layer** (after fuse-library): ``linear(reshape(a))`` where
  the reshape only drops or adds size-1 dims ahead of K (``[B, 1, K] -> [B, K]``, a residual
  sum's) reads ``a`` and reshapes its result instead: the linear layer's result is a planned
  buffer, whose reshape is a view made once, where the sum's reshape was a step on every call.
- **Means over unit axes**: ``mean(x) {axes}`` where every axis reduced has size 1 is a reshape
  (LeViT's final token mean over one token).
- **Subsampled tokens**: ``reshape(x [..., C] -> [B, H, W, C])``, strided slices of H and W,
  ``reshape -> [..., C]`` (LeViT's ``queries_subsample``, ``x.view(B, H, W, C)[:, ::s, ::s]``)
  is one ``embedding`` of x's rows by a constant index: one gathering copy instead of four
  steps (two slices and the copying reshape).

Each rewrite keeps the graph's meaning exactly (a reshape of the same elements in the same
order); tests/codegen/test_levit_blocks.py checks each against the reference interpreter.
"""

from __future__ import annotations

import numpy as np

from ..ir.attrs import DenseAttr
from ..ir.dtypes import i64
from ..ir.graph import Graph, Node
from ..ir.types import TensorType
from ..ops import OPS
from ..passes.rewrite import erase_if_dead

__all__ = ["tidy_for_library", "tidy_after_library", "drop_reshape_round_trip", "merge_reshape_chain",
           "sink_unit_reshape", "unit_mean_as_reshape", "subsample_as_gather"]


def drop_reshape_round_trip(graph: Graph, node: Node) -> bool:
    """``node`` = reshape(reshape(x)) with ``x``'s type: its uses read ``x``; True if rewritten."""
    if node.op != "reshape":
        return False
    first = node.operands[0].producer
    if first is None or first.op != "reshape":
        return False
    x = first.operands[0]
    y = node.results[0]
    if x.type != y.type or y.is_output:
        return False
    graph.replace_all_uses(y, x)
    erase_if_dead(graph, node)
    return True


def merge_reshape_chain(graph: Graph, node: Node) -> bool:
    """``node`` = reshape(reshape(x)), the inner one read by nothing else: one reshape of ``x``
    (none where it is ``x``'s own type); True if rewritten."""
    if drop_reshape_round_trip(graph, node):
        return True
    if node.op != "reshape":
        return False
    inner = node.operands[0].producer
    if inner is None or inner.op != "reshape" or len(inner.results[0].users) != 1 or inner.results[0].is_output:
        return False
    graph.set_operand(node, 0, inner.operands[0])
    erase_if_dead(graph, inner)
    return True


def _rows(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The dims ahead of the last, size-1 ones left out."""
    return tuple(d for d in shape[:-1] if d != 1)


def sink_unit_reshape(graph: Graph, node: Node) -> bool:
    """``node`` = linear_pointwise(reshape(a), ...) whose reshape only drops or adds size-1 dims
    ahead of K: the linear layer reads ``a``, its result reshaped back; True if rewritten."""
    if node.op != "linear_pointwise":
        return False
    x = node.operands[0]
    r = x.producer
    if r is None or r.op != "reshape":
        return False
    a = r.operands[0]
    y = node.results[0]
    if a.type.rank < 2 or a.type.shape[-1] != x.type.shape[-1] or _rows(a.type.shape) != _rows(x.type.shape) \
            or y.is_output:
        return False   # (a graph output's reshape would be a step of its own)
    t = TensorType(a.type.shape[:-1] + y.type.shape[-1:], y.type.dtype)
    new = Node("linear_pointwise", [a, *node.operands[1:]], dict(node.attrs), [t], node.loc)
    back = Node("reshape", [new.results[0]], OPS["reshape"].normalize_attrs({"shape": list(y.type.shape)}),
                [y.type], node.loc)
    graph.insert_before(node, new)
    graph.insert_before(node, back)
    graph.replace_all_uses(y, back.results[0])
    graph.erase(node)
    erase_if_dead(graph, r)
    return True


def unit_mean_as_reshape(graph: Graph, node: Node) -> bool:
    """``node`` = mean(x) over axes that all have size 1: a reshape to its result's shape."""
    if node.op != "mean" or len(node.operands) != 1:
        return False
    x = node.operands[0]
    y = node.results[0]
    rank = x.type.rank
    axes = node.attrs.get("axes")
    if not rank or not x.type.dtype.is_float or x.type.dtype != y.type.dtype or (axes is not None and not axes):
        return False
    if any(x.type.shape[a % rank] != 1 for a in (range(rank) if axes is None else axes)):
        return False
    new = Node("reshape", [x], OPS["reshape"].normalize_attrs({"shape": list(y.type.shape)}), [y.type], node.loc)
    graph.insert_before(node, new)
    graph.replace_all_uses(y, new.results[0])
    graph.erase(node)
    return True


def _grid_slices(node: Node) -> tuple[Node, list[Node]] | None:
    """(the reshape to [B, H, W, C], the slices of H and W in order) under ``node`` = the
    closing reshape, or None when it is not that pattern; each value read only by the next."""
    slices: list[Node] = []
    v = node.operands[0]
    while v.producer is not None and v.producer.op == "slice" and len(slices) < 2:
        slices.insert(0, v.producer)
        v = v.producer.operands[0]
    grid = v.producer
    if not slices or grid is None or grid.op != "reshape" or grid.results[0].type.rank != 4:
        return None
    axes = [s.attrs["axis"] % 4 for s in slices]
    if len(set(axes)) != len(axes) or not set(axes) <= {1, 2}:
        return None
    if any(len(s.results[0].users) != 1 or s.results[0].is_output for s in slices) or \
            len(grid.results[0].users) != 1 or grid.results[0].is_output:
        return None
    return grid, slices


def subsample_as_gather(graph: Graph, node: Node) -> bool:
    """``node`` = the reshape closing LeViT's token subsample: the rows of x gathered by a
    constant index (one ``embedding``); True if rewritten."""
    if node.op != "reshape":
        return False
    found = _grid_slices(node)
    if found is None:
        return False
    grid, slices = found
    x = grid.operands[0]
    b, h, w, c = grid.results[0].type.shape
    y = node.results[0]
    if x.type.rank < 2 or x.type.shape[-1] != c or y.type.rank < 2 or y.type.shape[-1] != c \
            or not x.type.dtype.is_float:
        return False
    rows = np.arange(b * h * w, dtype=np.int64).reshape(b, h, w)
    for s in slices:
        a = s.attrs
        cut = [slice(None)] * 3
        cut[a["axis"] % 4] = slice(a["start"], a["end"], a["step"])
        rows = rows[tuple(cut)]
    idx = np.ascontiguousarray(rows).reshape(y.type.shape[:-1])
    flat = Node("reshape", [x], OPS["reshape"].normalize_attrs({"shape": [b * h * w, c]}),
                [TensorType((b * h * w, c), x.type.dtype)], grid.loc)
    const = Node("constant", [], {"value": DenseAttr(idx)}, [TensorType(idx.shape, i64)], node.loc)
    gather = Node("embedding", [flat.results[0], const.results[0]], {}, [y.type], node.loc)
    for n in (flat, const, gather):
        graph.insert_before(node, n)
    graph.replace_all_uses(y, gather.results[0])
    erase_if_dead(graph, node)
    return True


def tidy_for_library(graph: Graph) -> int:
    """Every rewrite of this module over ``graph`` in one walk; the number made."""
    made = 0
    for node in list(graph.nodes):
        if node.graph is not graph:
            continue  # erased by an earlier rewrite
        if drop_reshape_round_trip(graph, node) or unit_mean_as_reshape(graph, node) or \
                subsample_as_gather(graph, node):
            made += 1
    return made


def tidy_after_library(graph: Graph) -> int:
    """After fuse-library's anchors: unit dims sunk below linear layers, then reshape chains
    merged; the number of rewrites made."""
    made = 0
    for node in list(graph.nodes):
        if node.graph is graph and sink_unit_reshape(graph, node):
            made += 1
    for node in list(graph.nodes):
        if node.graph is graph and merge_reshape_chain(graph, node):
            made += 1
    return made
