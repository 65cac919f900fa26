"""A product by a weight broadcast over the batch read as the product by the weight itself.

torch decomposes ``linear`` of a 3-d input that cannot be viewed as 2-d (LeViT's tokens, a
transpose of the convolution stem's [B, C, H * W]) into ``matmul(x, broadcast_to(w^T, [B, K,
N]))``: a copy of the weight per batch row every call, and a batched product that
``fuse-library``'s linear layers do not take (they want a 2-d weight). ``x [B, T, K] @ w [K,
N]`` is the same product (matmul broadcasts a 2-d right operand), so the matmul reads the
2-d weight and the broadcast goes.
"""

from __future__ import annotations

from ..ir.graph import Graph, Node
from ..passes.rewrite import sole_user

__all__ = ["unbroadcast_weight"]


def unbroadcast_weight(graph: Graph, node: Node) -> bool:
    """Make the matmul ``node`` read the 2-d value its right operand broadcasts over x's
    leading dims (``broadcast_to(w, [*lead, K, N])`` read only here), the broadcast erased;
    whether it did."""
    if node.op != "matmul" or len(node.operands) != 2:
        return False
    x, wv = node.operands
    b = wv.producer
    if b is None or b.op != "broadcast_to" or sole_user(wv) is not node:
        return False
    w = b.operands[0]
    if w.type.rank != 2 or x.type.rank < 3 or wv.type.rank != x.type.rank:
        return False
    if tuple(wv.type.shape[:-2]) != tuple(x.type.shape[:-2]) or tuple(wv.type.shape[-2:]) != tuple(w.type.shape):
        return False
    if w.type.dtype is not wv.type.dtype:
        return False
    graph.set_operand(node, 1, w)
    graph.erase(b)
    return True
