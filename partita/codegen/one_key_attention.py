"""Attention over one key, spelled out in ops, taken into one attention node (inference; issue 37).

MobileViT's last two stages unfold their maps into patches of one pixel: every attention row has
one key (S = 1). Written out (``matmul``, the division by sqrt(E), ``softmax``, ``matmul``),
its k^T [B * H, E, 1] is a transpose of a unit axis, which ``canonicalize`` turns into one
reshape of k's producer ([B, 1, H * E], the key projection):

    kt = reshape(k_proj) {shape=[B * H, E, 1]}            # no transpose left to recognize
    s  = reshape(matmul(reshape(q), kt))                  # [B, H, T, 1]

so ``attention_spelled.fuse_spelled_attention`` (which finds k behind a transpose) left five
steps for each block (about 20 us a call on one thread, 7 blocks). ``fuse_attention_one_key``,
the fuse-library anchor on ``softmax``, tries that rewrite first; where it declines and the
scores have one key, it spells k^T as ``reshape(transpose(reshape(k_proj) {[B, H, 1, E]},
[0, 1, 3, 2]))``, which is the same tensor (a reshape is row-major and swapping a unit axis
moves no element), and tries again; the three nodes made are dropped when that declines too.
The attention node then runs on the generated kernel (narrow_attention.py for heads of 12).
"""

from __future__ import annotations

from ..ir.graph import Graph, Node, Value
from ..ops.registry import OPS
from .attention_spelled import fuse_spelled_attention

__all__ = ["fuse_attention_one_key"]

# Nodes between the softmax and the matmul of q k^T: the scale and the 4-d view of the scores.
_ON_THE_WAY = ("div", "mul", "reshape")


def _scores_matmul(x: Value) -> Node | None:
    """The matmul that makes the scores x, through at most three scale or reshape nodes."""
    for _ in range(4):
        p = x.producer
        if p is None:
            return None
        if p.op == "matmul":
            return p
        if p.op not in _ON_THE_WAY:
            return None
        x = p.operands[0]
    return None


def _node(graph: Graph, at: Node, op: str, x: Value, attrs: dict, made: list[Node]) -> Value:
    """One ``op`` node reading x, inserted before ``at`` and listed in ``made``; its result."""
    a = OPS[op].normalize_attrs(attrs)
    n = Node(op, [x], a, OPS[op].infer_types([x.type], a), at.loc)
    graph.insert_before(at, n)
    made.append(n)
    return n.results[0]


def _spell_kt(graph: Graph, mm: Node, b: int, h: int) -> tuple[Value, list[Node]] | None:
    """k^T of the one-key matmul ``mm`` made again as reshape(transpose(k [B, H, 1, E])): the
    old operand and the nodes made, or None where the operand is not a reshape of B * H * E
    values to [B * H, E, 1]."""
    kt = mm.operands[1]
    r = kt.producer
    if r is None or r.op != "reshape" or kt.type.rank != 3 or kt.type.shape[-1] != 1:
        return None
    bh, e, _ = kt.type.shape
    if bh != b * h:
        return None
    made: list[Node] = []
    k4 = _node(graph, mm, "reshape", r.operands[0], {"shape": [b, h, 1, e]}, made)
    kt4 = _node(graph, mm, "transpose", k4, {"perm": [0, 1, 3, 2]}, made)
    new = _node(graph, mm, "reshape", kt4, {"shape": [bh, e, 1]}, made)
    graph.set_operand(mm, 1, new)
    return kt, made


def fuse_attention_one_key(graph: Graph, sm: Node) -> Node | None:
    """``fuse_spelled_attention`` on one softmax node, and where it declines on scores
    [B, H, T, 1] whose k^T is a reshape, again with k^T spelled as a transpose (module doc)."""
    done = fuse_spelled_attention(graph, sm)
    if done is not None:
        return done
    x = sm.operands[0]
    if x.type.rank != 4 or x.type.shape[-1] != 1 or sm.attrs["axis"] not in (-1, 3):
        return None
    mm = _scores_matmul(x)
    if mm is None:
        return None
    b, h = x.type.shape[:2]
    spelled = _spell_kt(graph, mm, b, h)
    if spelled is None:
        return None
    old, made = spelled
    done = fuse_spelled_attention(graph, sm)
    if done is not None:
        return done
    graph.set_operand(mm, 1, old)   # as it was
    for n in reversed(made):
        graph.erase(n)
    return None
