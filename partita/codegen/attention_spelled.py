"""Attention spelled out in ops, taken back into one attention node (inference; issue 37).

Models whose attention ``scaled_dot_product_attention`` cannot express write it out; Gemma2
caps its logits (``cap * tanh(s / cap)``) between q k^T and the softmax:

    s = reshape(matmul(reshape(q), reshape(transpose(k, [0, 1, 3, 2]))))   # [B, H, T, S]
    s = s * scale                                       # optional (a splat; or s / c)
    s = tanh(s / cap) * cap                             # optional: the soft cap
    s = s + mask                                        # optional
    o = reshape(matmul(reshape(softmax(s, -1)), reshape(v')))   # v' [B, H, S, Ev] or the
                                                        # [B, Hkv, g, S, Ev] broadcast of a repeat

``fuse_spelled_attention`` (anchored on the softmax) rewrites it into ``attention(q, k, v,
mask?) {scale}`` and then tries ``fuse_rotary`` on that; with a soft cap it needs rotated q and
k (Gemma2's case: ``rotary_attention {softcap}``, whose kernel caps the scores in registers)
and is left as it is otherwise. Every intermediate value is read only on the way, the 4-d
matmuls may also come without the reshapes, and the mask must broadcast to the scores as
attention's type rule asks.
"""

from __future__ import annotations

from ..ir.diagnostics import TypeRuleError
from ..ir.dtypes import f32
from ..ir.graph import Graph, Node, Value
from ..ops.registry import OPS
from ..passes.rewrite import erase_if_dead, sole_user, splat_value
from .rotary import apply_rotary, fuse_rotary, match_rotary

__all__ = ["fuse_spelled_attention"]

_REL = 1e-6


def _through(v: Value, op: str) -> Node | None:
    """v's producer when it is an ``op`` node and v is read only once."""
    p = v.producer
    return p if p is not None and p.op == op and sole_user(v) is not None else None


def _splat_of(node: Node) -> tuple[Value, float] | None:
    """(the other operand, the scalar) of a binary node with one splat float operand."""
    a, b = node.operands
    for x, c in ((a, b), (b, a)):
        s = splat_value(c)
        if isinstance(s, (int, float)) and not isinstance(s, bool) and x.type == node.results[0].type:
            return x, float(s)
    return None


def _four_d(v: Value, like: tuple) -> Value | None:
    """The 4-d value v is a reshape of (merging its two leading dims), or v itself if 4-d."""
    if v.type.rank == 4:
        return v
    r = _through(v, "reshape")
    if r is None or r.operands[0].type.rank != 4:
        return None
    x = r.operands[0]
    return x if x.type.shape[-2:] == v.type.shape[-2:] and tuple(x.type.shape[:2]) == tuple(like) else None


def _cap_of(v: Value) -> tuple[Value, float | None]:
    """(the scores before the cap, cap) when v = tanh(s / cap) * cap; (v, None) otherwise."""
    mul = _through(v, "mul")
    if mul is None:
        return v, None
    m = _splat_of(mul)
    if m is None:
        return v, None
    t = _through(m[0], "tanh")
    div = _through(t.operands[0], "div") if t is not None else None
    if t is None or div is None or splat_value(div.operands[1]) is None:
        return v, None
    cap = float(splat_value(div.operands[1]))
    if cap <= 0 or abs(cap - m[1]) > _REL * cap:
        return v, None
    return div.operands[0], cap


def _scale_of(v: Value) -> tuple[Value, float]:
    """(the raw scores, scale) when v = s * c or s / c for a splat c; (v, 1.0) otherwise."""
    for op in ("mul", "div"):
        n = _through(v, op)
        m = _splat_of(n) if n is not None else None
        if m is not None and (op == "mul" or n.operands[0] is m[0]) and m[1] != 0:  # type: ignore[union-attr]
            return m[0], (m[1] if op == "mul" else 1.0 / m[1])
    return v, 1.0


def _qk(s: Value) -> tuple[Value, Value, Node, Node] | None:
    """(q, k, q's reader, k's reader) when s [B, H, T, S] = q k^T, batched 3-d or 4-d."""
    b, h = s.type.shape[:2]
    mm = s.producer
    if mm is not None and mm.op == "reshape" and sole_user(mm.operands[0]) is mm:
        mm = mm.operands[0].producer
    if mm is None or mm.op != "matmul":
        return None
    a, kt = mm.operands
    q = _four_d(a, (b, h))
    kt4 = _four_d(kt, (b, h))
    if q is None or kt4 is None:
        return None
    tr = _through(kt4, "transpose")
    if tr is None or list(tr.attrs["perm"]) != [0, 1, 3, 2]:
        return None
    q_reader = a.producer if a is not q else mm
    assert q_reader is not None
    return q, tr.operands[0], q_reader, tr


def _pv(p: Value) -> tuple[Value, Value, Node | None] | None:
    """(v [B, H, S, Ev] or its [B, Hkv, g, S, Ev] broadcast, the result [B, H, T, Ev], the
    reshape of v to 3-d or None) when the softmax's result p is multiplied by v, batched 3-d
    or 4-d."""
    b, h = p.type.shape[:2]
    r = sole_user(p)
    p3 = p
    if r is not None and r.op == "reshape":
        p3 = r.results[0]
        r = sole_user(p3)
    if r is None or r.op != "matmul" or r.operands[0] is not p3:
        return None
    v3, o = r.operands[1], r.results[0]
    if o.type.rank == 3:
        ro = sole_user(o)
        if ro is None or ro.op != "reshape" or ro.results[0].type.rank != 4:
            return None
        o = ro.results[0]
        if tuple(o.type.shape[:2]) != (b, h):
            return None
    if v3.type.rank == 4:
        return v3, o, None
    rv = v3.producer
    if rv is None or rv.op != "reshape" or rv.operands[0].type.rank not in (4, 5):
        return None
    x = rv.operands[0]
    if x.type.rank == 4:
        return (x, o, rv) if tuple(x.type.shape[:2]) == (b, h) else None
    if x.type.shape[0] != b or x.type.shape[1] * x.type.shape[2] != h:
        return None
    return x, o, rv


def fuse_spelled_attention(graph: Graph, sm: Node) -> Node | None:
    """The rewrite of the module doc on one softmax node; None where it does not apply."""
    x = sm.operands[0]
    if x.type.rank != 4 or sm.attrs["axis"] not in (-1, 3) or sole_user(x) is not sm or x.type.dtype is not f32:
        return None
    found = None
    add = _through(x, "add")
    for s, mask in ([tuple(add.operands), tuple(add.operands[::-1])] if add is not None else []) + [(x, None)]:
        if mask is not None and s is mask:
            continue
        if add is not None and add.results[0].type != s.type:   # the mask must not grow the scores
            continue
        pre, cap = _cap_of(s)
        raw, scale = _scale_of(pre)
        qk = _qk(raw)
        if qk is not None:
            found = (qk, cap, scale, mask)
            break
    if found is None:
        return None
    (q, k, q_reader, k_reader), cap, scale, mask = found
    pv = _pv(sm.results[0])
    if pv is None:
        return None
    v, out, rv = pv
    at = out.producer
    assert at is not None
    v5 = None
    if v.type.rank == 5 and rv is not None:   # a repeat's broadcast: reshaped to [B, H, S, Ev] (as
        v5 = v                                # repeat_of reads it), the 3-d reshape reading that
        b, hk, g, sk, ev = v.type.shape
        ra = OPS["reshape"].normalize_attrs({"shape": [b, hk * g, sk, ev]})
        rs = Node("reshape", [v], ra, OPS["reshape"].infer_types([v.type], ra), sm.loc)
        graph.insert_before(rv, rs)
        graph.set_operand(rv, 0, rs.results[0])
        v = rs.results[0]
    operands = [q, k, v] + ([mask] if mask is not None else [])
    attrs = OPS["attention"].normalize_attrs({"scale": scale, "causal": False})
    try:
        types = OPS["attention"].infer_types([o.type for o in operands], attrs)
    except TypeRuleError:
        types = None
    plan = match_rotary(q, k, v, q_reader, k_reader) if cap is not None and types is not None else None
    if types is None or types[0] != out.type or (cap is not None and plan is None):
        if v5 is not None and rv is not None and v.producer is not None:   # as it was
            graph.set_operand(rv, 0, v5)
            graph.erase(v.producer)
        return None
    if plan is not None:
        new = apply_rotary(graph, plan, at, {**attrs, "softcap": cap}, operands[3:], [out, None])
    else:
        new = Node("attention", operands, attrs, types, sm.loc)
        graph.insert_before(at, new)
        graph.replace_all_uses(out, new.results[0])
    erase_if_dead(graph, at)
    if new.op == "attention":
        return fuse_rotary(graph, new) or new
    return new
