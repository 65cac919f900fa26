"""Chains of row moves as one gather of rows (issue 37).

Swin's shifted windows roll the feature map [B, H, W, C] along H and along W (two
``index_select`` by a constant index) and then cut it into windows (reshape, transpose,
reshape); after attention it puts the windows back and rolls the other way. Each of those
steps moves whole rows of C channels and leaves every row as it is: three copies of the tensor
where one would do. Any chain of such moves (a reshape that keeps the last dim, a transpose
that keeps the last axis last, a slice or a constant ``index_select`` of another axis) is one
gather of ``x``'s rows by a constant index: the index is the chain run over the row numbers.
``fold_row_gathers`` makes that rewrite where a chain holds an ``index_select`` and two or more
copying moves: x reshaped to [rows, C] (a view), one ``embedding`` of its rows.

Swin's patch merging is the same moves joined: ``concat`` on the last axis of strided slices of
one feature map ([B, H, W, C] -> x[:, 0::2, 0::2], x[:, 1::2, 0::2], ... -> [B, H/2, W/2, 4C]),
six slice steps and a concat. Each part is a gather of x's rows, so the concat is one gather
by an index [..., parts] (``fold_row_concat``), its result [..., parts, C] read as [..., parts * C].
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ..ir.attrs import DenseAttr
from ..ir.dtypes import i64
from ..ir.graph import Graph, Node, Value
from ..ir.types import TensorType
from ..ops import OPS
from ..passes.rewrite import erase_if_dead

__all__ = ["row_move", "row_chain", "fold_row_gather", "fold_row_concat", "fold_row_gathers"]

RowMove = Callable[[np.ndarray], np.ndarray]


def _constant_index(node: Node) -> np.ndarray | None:
    """The constant 1-D index of an ``index_select``, None if it is not a constant."""
    p = node.operands[1].producer
    if p is None or p.op != "constant" or not isinstance(p.attrs.get("value"), DenseAttr):
        return None
    idx = np.asarray(p.attrs["value"].array).astype(np.int64)
    return idx if idx.ndim == 1 else None


def row_move(node: Node, c: int) -> RowMove | None:
    """How ``node`` moves the rows of C channels (a function of the array of row numbers over
    every dim but the last); None if ``node`` is not a move that keeps each row whole."""
    if node.op not in ("reshape", "transpose", "index_select", "slice") or len(node.results) != 1:
        return None
    xt, yt = node.operands[0].type, node.results[0].type
    if xt.rank < 2 or yt.rank < 2 or xt.shape[-1] != c or yt.shape[-1] != c:
        return None
    rank = xt.rank
    if node.op == "reshape":
        shape = tuple(yt.shape[:-1])
        return lambda r: r.reshape(shape)
    if node.op == "transpose":
        perm = [p % rank for p in node.attrs["perm"]]
        if perm[-1] != rank - 1:
            return None
        return lambda r: r.transpose(perm[:-1])
    axis = node.attrs["axis"] % rank
    if axis == rank - 1:
        return None
    if node.op == "index_select":
        idx = _constant_index(node)
        if idx is None or (idx.size and (idx.min() < 0 or idx.max() >= xt.shape[axis])):
            return None
        return lambda r: np.take(r, idx, axis=axis)
    cut = slice(node.attrs.get("start", 0), node.attrs.get("end"), node.attrs.get("step", 1))
    return lambda r: r[(slice(None),) * axis + (cut,)]


def _sole_reader(v: Value) -> Node | None:
    """The one node reading ``v`` once, as its first operand; None if there is not one."""
    if v.is_output or len(v.users) != 1:
        return None
    (user, count), = v.users.items()
    return user if count == 1 and user.operands[0] is v else None


def _ends_chain(node: Node, c: int) -> bool:
    """True if ``node``'s result leaves the row moves: read by anything but one more move."""
    user = _sole_reader(node.results[0])
    return user is None or row_move(user, c) is None


def row_chain(end: Node) -> list[Node] | None:
    """The row moves ending at ``end`` (first to last), each but the last read only by the
    next; None if ``end`` does not close a chain worth one gather."""
    if end.results[0].type.rank < 2:
        return None
    c = end.results[0].type.shape[-1]
    if row_move(end, c) is None or not _ends_chain(end, c):
        return None
    chain = [end]
    while True:
        p = chain[0].operands[0].producer
        if p is None or len(p.results) != 1 or _sole_reader(p.results[0]) is not chain[0] \
                or row_move(p, c) is None:
            break
        chain.insert(0, p)
    copies = sum(n.op != "reshape" for n in chain)
    if copies < 2 or not any(n.op == "index_select" for n in chain):
        return None
    return chain


def fold_row_gather(graph: Graph, end: Node) -> bool:
    """``end`` closing a chain of row moves: the chain replaced by one gather of rows; True if
    rewritten."""
    if end.graph is not graph or end.results[0].is_output:
        return False
    chain = row_chain(end)
    if chain is None:
        return False
    x, y = chain[0].operands[0], end.results[0]
    if not x.type.dtype.is_float:
        return False
    c = y.type.shape[-1]
    n_rows = math.prod(x.type.shape[:-1])
    rows = np.arange(n_rows, dtype=np.int64).reshape(x.type.shape[:-1])
    for n in chain:
        move = row_move(n, c)
        assert move is not None
        rows = move(rows)
    idx = np.ascontiguousarray(rows)
    if idx.shape != tuple(y.type.shape[:-1]):
        return False
    flat = Node("reshape", [x], OPS["reshape"].normalize_attrs({"shape": [n_rows, c]}),
                [TensorType((n_rows, c), x.type.dtype)], chain[0].loc)
    const = Node("constant", [], {"value": DenseAttr(idx)}, [TensorType(idx.shape, i64)], end.loc)
    gather = Node("embedding", [flat.results[0], const.results[0]], {}, [y.type], end.loc)
    for n in (flat, const, gather):
        graph.insert_before(end, n)
    graph.replace_all_uses(y, gather.results[0])
    erase_if_dead(graph, end)
    return True


def _row_source(v: Value, c: int) -> tuple[Value, list[Node]]:
    """The value whose rows ``v`` is made of by row moves, and those moves (first to last)."""
    chain: list[Node] = []
    while v.producer is not None and len(v.producer.results) == 1 and row_move(v.producer, c) is not None:
        chain.insert(0, v.producer)
        v = v.producer.operands[0]
    return v, chain


def fold_row_concat(graph: Graph, node: Node) -> bool:
    """``node`` = concat on the last axis of parts that are each row moves of one tensor x:
    one gather of x's rows (index [..., parts]) read as the concat's shape; True if rewritten."""
    if node.graph is not graph or node.op != "concat" or len(node.operands) < 2 or node.results[0].is_output:
        return False
    y = node.results[0]
    rank = y.type.rank
    if rank < 2 or node.attrs["axis"] % rank != rank - 1:
        return False
    c = node.operands[0].type.shape[-1]
    found = [_row_source(v, c) for v in node.operands]
    x = found[0][0]
    if any(src is not x for src, _ in found) or not any(ch for _, ch in found) or x.type.rank < 2 \
            or x.type.shape[-1] != c or not x.type.dtype.is_float:
        return False
    n_rows = math.prod(x.type.shape[:-1])
    parts = []
    for _, chain in found:
        rows = np.arange(n_rows, dtype=np.int64).reshape(x.type.shape[:-1])
        for n in chain:
            move = row_move(n, c)
            assert move is not None
            rows = move(rows)
        parts.append(rows)
    if any(p.shape != tuple(y.type.shape[:-1]) for p in parts):
        return False
    idx = np.ascontiguousarray(np.stack(parts, axis=-1))
    flat = Node("reshape", [x], OPS["reshape"].normalize_attrs({"shape": [n_rows, c]}),
                [TensorType((n_rows, c), x.type.dtype)], node.loc)
    const = Node("constant", [], {"value": DenseAttr(idx)}, [TensorType(idx.shape, i64)], node.loc)
    gather = Node("embedding", [flat.results[0], const.results[0]], {},
                  [TensorType(idx.shape + (c,), x.type.dtype)], node.loc)
    back = Node("reshape", [gather.results[0]], OPS["reshape"].normalize_attrs({"shape": list(y.type.shape)}),
                [y.type], node.loc)
    for n in (flat, const, gather, back):
        graph.insert_before(node, n)
    graph.replace_all_uses(y, back.results[0])
    erase_if_dead(graph, node)
    return True


def fold_row_gathers(graph: Graph) -> int:
    """Every chain of row moves with an ``index_select`` and two copies or more in ``graph`` as
    one gather of rows, and every concat of row moves of one tensor as one; the number rewritten."""
    made = 0
    for node in list(graph.nodes):
        if node.graph is graph and (fold_row_gather(graph, node) or fold_row_concat(graph, node)):
            made += 1
    return made
