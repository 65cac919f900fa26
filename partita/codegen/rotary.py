"""Rotary position embedding taken into attention (inference): ``rotary_attention``.

Llama-style models rotate q and k before attention, ``x * cos + rotate_half(x) * sin`` with
``rotate_half(x) = concat(-x[..., h:], x[..., :h])`` (h half the head size): two slices, a
negation, a concat and a fused multiply-add per tensor, each a pass over memory (about 1.2 ms of
a 4-layer, 256-wide Llama's 60 at 4 x 128 tokens, one thread). The generated attention kernel
applies the rotation where it reads q and k anyway (q's rows into its tile buffer, k's as it
packs them), so the rotated tensors never exist.

``fuse_rotary`` (an anchor of the fuse-library pass) rewrites

    attention(add(mul(xq, cos), mul(rotate_half(xq), sin)),
              add(mul(xk, cos), mul(rotate_half(xk), sin)), v, mask?)

into ``rotary_attention(xq, xk, v, cos, sin, mask?)`` when q and k use the same cos and sin,
T = S (self-attention: query i and key i share position i), every intermediate value is read
only on the way and the log-sum-exp result is unused (inference). The operands of mul and add
may come in either order.
"""

from __future__ import annotations

import numpy as np

from ..ir.diagnostics import TypeRuleError
from ..ir.dtypes import f32
from ..ir.graph import Graph, Node, Value
from ..ops._lazy import torch
from ..ops.registry import Cost, OPS, OpDef, normalize_axis, register
from ..passes.rewrite import erase_if_dead, sole_user

__all__ = ["fuse_rotary", "rope_parts", "repeat_of"]


def _slice_of(v: Value, last: int) -> tuple[Value, int, int] | None:
    """(x, start, end) when v = slice(x) along the last axis with step 1 (bounds resolved)."""
    p = v.producer
    if p is None or p.op != "slice" or p.attrs["step"] != 1:
        return None
    x = p.operands[0]
    if normalize_axis(p.attrs["axis"], x.type.rank, "slice") != last:
        return None
    n = x.type.shape[last]
    start, end, _ = slice(p.attrs["start"], p.attrs["end"]).indices(n)
    return x, start, end


def _rotate_half_of(v: Value) -> Value | None:
    """x when v = concat(neg(x[..., h:]), x[..., :h]) on the last axis, 2h = E, each part read
    only there."""
    p = v.producer
    if p is None or p.op != "concat" or len(p.operands) != 2:
        return None
    last = v.type.rank - 1
    if normalize_axis(p.attrs["axis"], v.type.rank, "concat") != last:
        return None
    a, b = p.operands
    na = a.producer
    if na is None or na.op != "neg" or sole_user(a) is not p:
        return None
    hi, lo = _slice_of(na.operands[0], last), _slice_of(b, last)
    if hi is None or lo is None or hi[0] is not lo[0] or sole_user(na.operands[0]) is not na or sole_user(b) is not p:
        return None
    x = hi[0]
    e = x.type.shape[last]
    if e % 2 or hi[1:] != (e // 2, e) or lo[1:] != (0, e // 2):
        return None
    return x


def rope_parts(v: Value) -> tuple[Value, Value, Value] | None:
    """(x, cos, sin) when v = x * cos + rotate_half(x) * sin, each intermediate value read only
    on the way."""
    add = v.producer
    if add is None or add.op != "add" or len(add.operands) != 2:
        return None
    for m1, m2 in (add.operands, add.operands[::-1]):
        n1, n2 = m1.producer, m2.producer
        if n1 is None or n2 is None or n1.op != "mul" or n2.op != "mul" or m1 is m2:
            continue
        if sole_user(m1) is not add or sole_user(m2) is not add:
            continue
        for rh, sin in (n2.operands, n2.operands[::-1]):
            x = _rotate_half_of(rh)
            if x is None or sole_user(rh) is not n2:
                continue
            for xx, cos in (n1.operands, n1.operands[::-1]):
                if xx is x and cos is not x:
                    return x, cos, sin
    return None


def _table_ok(t, q) -> bool:
    """cos/sin broadcast to q's [..., T, E] without growing it: a float of q's dtype."""
    if t.dtype != q.dtype or t.rank > q.rank:
        return False
    return all(d == 1 or d == e for d, e in zip(t.shape[::-1], q.shape[::-1])) and t.shape[-1] == q.shape[-1]


def repeat_of(v: Value) -> Value | None:
    """x when v = reshape(broadcast_to(unsqueeze(x))) repeats the heads of x [..., H, T, E] into
    [..., H * r, T, E] (grouped-query attention's k/v repeat, each head r times in a row), each
    intermediate value read only on the way."""
    r = v.producer
    if r is None or r.op != "reshape":
        return None
    b = r.operands[0].producer
    if b is None or b.op != "broadcast_to" or sole_user(r.operands[0]) is not r:
        return None
    u = b.operands[0].producer
    if u is None or u.op != "unsqueeze" or sole_user(b.operands[0]) is not b:
        return None
    x = u.operands[0]
    xs, us, bs, vs = (tuple(t.type.shape) for t in (x, u.results[0], b.results[0], v))
    if len(xs) < 3 or us != xs[:-2] + (1,) + xs[-2:] or bs[:-3] != xs[:-2] or bs[-2:] != xs[-2:]:
        return None
    return x if vs == xs[:-3] + (xs[-3] * bs[-3],) + xs[-2:] else None


def _rope_before_repeat(k: Value) -> tuple[tuple[Value, Value, Value], Value] | None:
    """((xk, cos, sin), the rotated value) when k = repeat(rope(xk)) (``repeat_of``) with cos and
    sin the same for every head: then rope(repeat(xk)) = repeat(rope(xk)), and the kernel may
    rotate the repeated xk."""
    rotated = repeat_of(k)
    if rotated is None or len(rotated.users) != 1 or rotated.is_output:
        return None
    parts = rope_parts(rotated)
    if parts is None:
        return None
    for t in parts[1:]:
        if t.type.rank >= 3 and t.type.shape[-3] != 1:
            return None
    return parts, rotated


def fuse_rotary(graph: Graph, node: Node) -> Node | None:
    """The rewrite described in the module doc, on one attention node; None where it does not
    apply. A k whose heads are repeated after its rotation (grouped-query attention) is
    rotated by the kernel after the repeat instead: the repeat then reads the unrotated k."""
    q, k, v = node.operands[:3]
    out, lse = node.results
    if lse.users or lse.is_output or q.type.dtype is not f32:
        return None
    if sole_user(q) is not node or sole_user(k) is not node or q.type.shape[-2] != k.type.shape[-2]:
        return None
    rq, rk = rope_parts(q), rope_parts(k)
    before = _rope_before_repeat(k) if rk is None else None
    if before is not None:
        rk = before[0]
    if rq is None or rk is None or rq[1] is not rk[1] or rq[2] is not rk[2] or rq[0] is rk[0]:
        return None
    cos, sin = rq[1], rq[2]
    if not (_table_ok(cos.type, q.type) and _table_ok(sin.type, q.type)):
        return None
    if before is not None:   # the repeat reads the unrotated k; the kernel rotates what it repeats
        rotated = before[1]
        graph.replace_all_uses(rotated, rk[0])
        assert rotated.producer is not None
        erase_if_dead(graph, rotated.producer)
        rk = (k, cos, sin)
    operands = [rq[0], rk[0], v, cos, sin] + list(node.operands[3:])
    new = Node("rotary_attention", operands, OPS["rotary_attention"].normalize_attrs(dict(node.attrs)),
               [out.type, lse.type], node.loc)
    graph.insert_before(node, new)
    graph.replace_all_uses(out, new.results[0])
    graph.replace_all_uses(lse, new.results[1])
    erase_if_dead(graph, node)   # and the rotations, now read by nothing
    return new


# --- the op ----------------------------------------------------------------------------------

def _rotary_infer(ts, attrs):
    from ..ops.nn import attention_infer

    q, k, v, cos, sin = ts[:5]
    for t, what in ((cos, "cos"), (sin, "sin")):
        if not _table_ok(t, q):
            raise TypeRuleError(f"rotary_attention: {what} {t} must be of q's dtype and broadcast to q {q} "
                                "([..., T, E], its last dim E)")
    if q.shape[-1] % 2:
        raise TypeRuleError(f"rotary_attention: q {q} has an odd head size; rotate_half splits it in two")
    if q.shape[-2] != k.shape[-2]:
        raise TypeRuleError(f"rotary_attention: q {q} and k {k} must have as many positions (self-attention)")
    return attention_infer([q, k, v] + list(ts[5:]), attrs)


def _np_rope(x, cos, sin):
    h = x.shape[-1] // 2
    rh = np.concatenate([-x[..., h:], x[..., :h]], axis=-1)
    return (x * cos + rh * sin).astype(x.dtype)   # rounded as the unfused ops in x's dtype


def _rotary_reference(args, attrs):
    from ..ops.nn import np_attention

    q, k, v, cos, sin = args[:5]
    return np_attention([_np_rope(q, cos, sin), _np_rope(k, cos, sin), v] + list(args[5:]), attrs)


def _torch_rope(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), -1) * sin


def _rotary_torch(args, attrs):
    from ..ops.nn import torch_attention

    q, k, v, cos, sin = args[:5]
    return torch_attention([_torch_rope(q, cos, sin), _torch_rope(k, cos, sin), v] + list(args[5:]), attrs)


def _rotary_cost(ins, outs, attrs):
    c = OPS["attention"].cost_of([ins[0], ins[1], ins[2]] + list(ins[5:]), outs, attrs)
    rot = 3 * (ins[0].numel + ins[1].numel)
    return Cost(c.flops + rot, c.bytes_read + ins[3].nbytes + ins[4].nbytes, c.bytes_written)


register(OpDef(
    name="rotary_attention", operands=("q", "k", "v", "cos", "sin", "mask?"),
    attrs=OPS["attention"].attrs,   # scale and causal, as attention's
    infer=_rotary_infer, reference=_rotary_reference, torch=_rotary_torch, cost=_rotary_cost,
    doc="attention(rope(q), rope(k), v, mask) with rope(x) = x * cos + rotate_half(x) * sin, "
        "rotate_half(x) = concat(-x[..., E/2:], x[..., :E/2]) on the last axis; cos and sin broadcast "
        "to q's [..., T, E] and serve k too (self-attention, T = S). Results and attrs as attention's. "
        "Made by the fuse-library pass for inference (codegen/rotary.py); the generated attention kernel "
        "rotates q and k as it reads them.",
))
