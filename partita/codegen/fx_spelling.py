"""Index constants that ``fold-constants`` made, spelled back as the ops the library patterns match.

The torch.compile backend runs ``canonicalize,cse,fold-constants,dce`` on its graph before
``fuse-library``; the import path does not fold. Index tensors that depend only on shapes are
therefore dense constants in the backend's graph where the import path still has the ops they
were made from, and two rewrites of ``fuse-library`` look for those ops:

- DeBERTa-v2's relative positions (``fuse_rel_scores``, codegen/disentangled.py) take the
  index of each ``gather`` as ``broadcast_to`` of one [T, C] table shared by every row of
  heads; folded, it is an [N, T, C] constant whose N slices are equal.
- Funnel's in-place ``positional_attn *= cls_mask`` (``tidy_view_writes``,
  codegen/funnel_blocks.py) reads a ``scatter_elements`` back as the values written when its
  index is ``iota(axis) + k``; folded, it is a dense constant.

``respell_folded_indices`` (run by fuse-library before its anchors) gives each such ``gather``
or ``scatter_elements`` a fresh index in the matched spelling: ``broadcast_to(constant[1, T, C])``
or ``add(iota, full(k))``. Each is the same tensor as the constant it replaces (checked element
by element here), so the graph's meaning is unchanged whether or not a pattern then applies.
"""

from __future__ import annotations

import numpy as np

from ..ir.attrs import DenseAttr
from ..ir.builder import Builder
from ..ir.graph import Graph, Node, Value
from ..passes.rewrite import constant_array, erase_if_dead

__all__ = ["respell_folded_indices", "shared_rows", "iota_plus"]


def _dense(v: Value) -> np.ndarray | None:
    """The array of ``v`` when a ``constant`` node makes it, else None."""
    p = v.producer
    if p is None or p.op != "constant" or not v.type.dtype.is_int:
        return None
    a = constant_array(p)
    return None if a is None or tuple(a.shape) != tuple(v.type.shape) else a


def shared_rows(a: np.ndarray) -> bool:
    """True when ``a`` (rank 3 or more) has two or more slices along axis 0, all equal."""
    return a.ndim >= 3 and a.shape[0] > 1 and bool((a == a[:1]).all())


def iota_plus(a: np.ndarray, axis: int) -> int | None:
    """``k`` where ``a`` is ``iota(axis) + k`` of its own shape, else None."""
    if a.ndim == 0 or a.size == 0:
        return None
    n = a.shape[axis]
    ramp = np.arange(n, dtype=np.int64).reshape([n if d == axis else 1 for d in range(a.ndim)])
    k = int(a.reshape(-1)[0])
    return k if bool((a == ramp + k).all()) else None


def _gather_index(b: Builder, node: Node) -> bool:
    """Give a ``gather`` whose index is a constant of equal row slices the index
    ``broadcast_to(constant[1, ...])``; True if rewritten."""
    idx = node.operands[1]
    a = _dense(idx)
    if a is None or not shared_rows(a):
        return False
    b.set_insertion_before(node)
    b.loc = idx.producer.loc if idx.producer is not None else node.loc
    one = b.emit("constant", value=DenseAttr(np.ascontiguousarray(a[:1])))
    wide = b.emit("broadcast_to", one, shape=list(a.shape))
    b.graph.set_operand(node, 1, wide)
    return True


def _scatter_index(b: Builder, node: Node) -> bool:
    """Give a ``scatter_elements`` whose index is a constant equal to ``iota(axis) + k`` the
    index ``add(iota, full(k))`` (``iota`` alone for k = 0); True if rewritten."""
    idx = node.operands[1]
    a = _dense(idx)
    if a is None:
        return False
    rank = idx.type.rank
    axis = node.attrs["axis"] % rank if rank else 0
    k = iota_plus(a, axis)
    if k is None:
        return False
    b.set_insertion_before(node)
    b.loc = idx.producer.loc if idx.producer is not None else node.loc
    new = b.emit("iota", shape=list(a.shape), axis=axis, dtype=idx.type.dtype)
    if k:
        new = b.emit("add", new, b.emit("full", shape=[], value=k, dtype=idx.type.dtype))
    b.graph.set_operand(node, 1, new)
    return True


def respell_folded_indices(graph: Graph) -> int:
    """Respell the folded index constants of ``gather`` and ``scatter_elements`` nodes (the
    module doc); the number of indices rewritten."""
    b = Builder(graph)
    done = 0
    for node in list(graph.nodes):
        if node.graph is not graph:
            continue
        old = node.operands[1].producer if node.op in ("gather", "scatter_elements") and len(node.operands) > 1 \
            else None
        if old is None:
            continue
        changed = _gather_index(b, node) if node.op == "gather" else _scatter_index(b, node)
        if changed:
            done += 1
            erase_if_dead(graph, old)
    return done
