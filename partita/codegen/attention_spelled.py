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

DeBERTa-v2's disentangled attention is taken too: k^T divided by a scalar computed from
constants (``sqrt(E * 3)``, ``scalar_of``) becomes part of the scale, the relative-position
terms added to the 3-d scores (``q k^T + c2p + p2c``) become the additive mask, and a masked
fill ``where(cond, lowest, s)`` before the softmax becomes ``where(cond, lowest, term)``: the
masked scores round to the same lowest value, so a row with every key masked still gets equal
weights as before.

BLOOM's ALiBi attention (``baddbmm(alibi, q, k^T, alpha=scale)`` in the batched 3-d form, viewed
as [B, H, T, S], plus the mask) carries two terms: up to two are taken, each added to the 4-d
scores or to their [B * H, T, S] form, and the mask is their sum, a [B * H, ...] term reshaped
to [B, H, ...] (``_term_4d``).

Funnel's relative attention adds three: ``content + positional + token_type - INF * (1 - mask)``
(a term subtracted is taken with its sign), q k^T from einsum's ``bnij`` (its unit-axis moves made
reshapes by codegen/funnel_blocks.py), the product with v written to [B, H, T, 1, Ev] (the
attention's result is reshaped to it).
"""

from __future__ import annotations

import math

from ..ir.diagnostics import TypeRuleError
from ..ir.dtypes import f32
from ..ir.graph import Graph, Node, Value
from ..ir.types import TensorType
from ..ops.registry import OPS
from ..passes.rewrite import erase_if_dead, sole_user, splat_value
from .rotary import apply_rotary, fuse_rotary, match_rotary

__all__ = ["fuse_spelled_attention"]

_REL = 1e-6


def _through(v: Value, op: str) -> Node | None:
    """v's producer when it is an ``op`` node and v is read only once."""
    p = v.producer
    return p if p is not None and p.op == op and sole_user(v) is not None else None


def scalar_of(v: Value, depth: int = 4) -> float | None:
    """The float a scalar v always holds: a splat constant, or mul, div, add, sub or sqrt of
    such (DeBERTa's ``sqrt(E * 3)``, its head size a constant); None otherwise."""
    s = splat_value(v)
    if isinstance(s, (int, float)) and not isinstance(s, bool):
        return float(s)
    p = v.producer
    if p is None or v.type.rank != 0 or depth == 0 or p.op not in ("mul", "div", "add", "sub", "sqrt"):
        return None
    args = [scalar_of(o, depth - 1) for o in p.operands]
    if any(a is None for a in args):
        return None
    a = [float(x) for x in args if x is not None]
    if p.op == "sqrt":
        return math.sqrt(a[0]) if a[0] >= 0 else None
    if p.op == "div":
        return a[0] / a[1] if a[1] else None
    return {"mul": a[0] * a[1], "add": a[0] + a[1], "sub": a[0] - a[1]}[p.op]


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
    r = v.producer   # read elsewhere too (DeBERTa's c2p reads q's 3-d form): it stays for them
    if r is None or r.op != "reshape" or r.operands[0].type.rank != 4:
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


def _k_of(kt: Value, b: int, h: int) -> tuple[Value, Node, float] | None:
    """(k [B, H, S, E], k's reader, a factor of the scale) when kt is k^T: a 4-d transpose
    (under a reshape to 3-d) or a 3-d transpose of k's 3-d reshape, maybe divided by a scalar."""
    factor = 1.0
    d = _through(kt, "div")
    if d is not None and d.operands[0].type == kt.type:
        c = scalar_of(d.operands[1])
        if not c:
            return None
        factor, kt = 1.0 / c, d.operands[0]
    kt4 = _four_d(kt, (b, h))
    if kt4 is not None:
        tr = _through(kt4, "transpose")
        if tr is not None and list(tr.attrs["perm"]) == [0, 1, 3, 2]:
            return tr.operands[0], tr, factor
        if tr is not None and list(tr.attrs["perm"]) == [0, 2, 3, 1]:   # k^T straight from [B, S, H, E]
            return tr.operands[0], tr, factor                          # (LeViT): taken as k by _k_from_bshe
    tr = _through(kt, "transpose")
    if tr is not None and kt.type.rank == 3 and list(tr.attrs["perm"]) == [0, 2, 1]:
        k = _four_d(tr.operands[0], (b, h))
        if k is not None and k is not tr.operands[0]:
            reader = tr.operands[0].producer
            assert reader is not None
            return k, reader, factor
    return None


def _qk(s: Value, b: int, h: int) -> tuple[Value, Value, Node, Node, float] | None:
    """(q, k, q's reader, k's reader, a factor of the scale) when s = q k^T: [B, H, T, S],
    or its [B * H, T, S] batched form."""
    mm = s.producer
    if mm is not None and mm.op == "reshape" and sole_user(mm.operands[0]) is mm:
        mm = mm.operands[0].producer
    if mm is None or mm.op != "matmul":
        return None
    a, kt = mm.operands
    q = _four_d(a, (b, h))
    kk = _k_of(kt, b, h)
    if q is None or kk is None:
        return None
    q_reader = a.producer if a is not q else mm
    assert q_reader is not None
    return q, kk[0], q_reader, kk[1], kk[2]


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
        if ro is None or ro.op != "reshape" or ro.results[0].type.rank < 4:
            return None
        o = ro.results[0]
        if tuple(o.type.shape[:2]) != (b, h) or (o.type.rank > 4 and _unit_free(o.type.shape) != _unit_free(
                (b, h, p.type.shape[2], o.type.shape[-1]))):   # Funnel's [B, H, T, 1, Ev]
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


def _unit_free(shape: tuple) -> tuple:
    """``shape`` without its size-1 dims."""
    return tuple(d for d in shape if d != 1)


def _same_but_unit_axes(t: TensorType, out: TensorType) -> bool:
    """Whether ``t`` is ``out`` (or ``out`` with unit axes added: a reshape of it)."""
    return t == out or (out.rank > 4 and t.dtype == out.dtype and _unit_free(t.shape) == _unit_free(out.shape))


def _masked_fill(x: Value) -> tuple[Value, Value | None, Value | None]:
    """(the scores, cond, fill) when x = where(cond, fill, s), fill a splat at most -1e30
    (a masked fill with the dtype's lowest value); (x, None, None) otherwise."""
    w = _through(x, "where")
    if w is None:
        return x, None, None
    cond, fill, s = w.operands
    f = splat_value(fill)
    if not cond.type.dtype.is_bool or not isinstance(f, float) or f > -1e30 or s.type != x.type:
        return x, None, None
    return s, cond, fill


Term = tuple[Value, bool, bool]   # (term, added to the [B * H, T, S] form, subtracted)


def _sum_parts(v: Value, flat: bool, budget: int) -> list[tuple[Value, list[Term]]]:
    """The ways to read v as ``s + term - term ...`` (at most ``budget`` terms, each add's or
    sub's result read only once and of s's type): (s, [(term, flat, subtracted)])."""
    out: list[tuple[Value, list[Term]]] = []
    add = _through(v, "add") or _through(v, "sub") if budget > 0 else None
    if add is not None:
        a, b = add.operands
        neg = add.op == "sub"
        for s, term in ((a, b),) if neg else ((a, b), (b, a)):
            if s is term or add.results[0].type != s.type:   # the term must not grow s
                continue
            out += [(x, ts + [(term, flat, neg)]) for x, ts in _sum_parts(s, flat, budget - 1)]
    return out + [(v, [])]


def _scores(x: Value) -> tuple[tuple, float | None, float, list[Term]] | None:
    """(_qk's match, cap, scale, the terms added to the scores) for the softmax's input
    x [B, H, T, S]: ``(cap(scale * q k^T)) + term + ...`` (up to three terms: BLOOM's ALiBi bias
    and its mask, Funnel's position, token-type and mask terms), each sum in [B, H, T, S] or in [B * H, T, S] under a reshape (a term's flag
    says which)."""
    b, h, t, sk = x.type.shape
    cands: list[tuple[Value, list[Term]]] = []
    for y, outer in _sum_parts(x, False, 3):
        cands.append((y, outer))
        r = _through(y, "reshape")
        if r is not None and r.operands[0].type.shape == (b * h, t, sk):
            cands += [(s, outer + inner) for s, inner in _sum_parts(r.operands[0], True, 3 - len(outer))
                      if inner]
    for s, terms in cands:
        pre, cap = _cap_of(s)
        raw, scale = _scale_of(pre)
        qk = _qk(raw, b, h)
        if qk is not None:
            return qk, cap, scale * qk[4], terms
    return None


def _broadcasts(shape: tuple, to: tuple) -> bool:
    """Whether ``shape`` broadcasts to ``to`` (a term [H, T, S] added to [B, H, T, S] scores:
    LeViT's attention biases), not only after a reshape (DeBERTa's [B * H, T, S])."""
    return len(shape) <= len(to) and all(a in (1, b) for a, b in zip(reversed(shape), reversed(to)))


def _k_from_bshe(graph: Graph, reader: Node, at: Node) -> Node | None:
    """k [B, H, S, E] made, before ``at``, as a transpose of the [B, S, H, E] value that
    ``reader`` (k^T as ``transpose(x, [0, 2, 3, 1])``, LeViT's) reads; None for another reader."""
    if reader.op != "transpose" or list(reader.attrs["perm"]) != [0, 2, 3, 1]:
        return None
    x = reader.operands[0]
    ta = OPS["transpose"].normalize_attrs({"perm": [0, 2, 1, 3]})
    tr = Node("transpose", [x], ta, OPS["transpose"].infer_types([x.type], ta), reader.loc)
    graph.insert_before(at, tr)
    return tr


def _made(graph: Graph, at: Node, op: str, operands: list[Value], attrs: dict, made: list[Node]) -> Value:
    """One node ``op`` inserted before ``at`` (listed in ``made``); its result."""
    a = OPS[op].normalize_attrs(attrs)
    n = Node(op, operands, a, OPS[op].infer_types([o.type for o in operands], a), at.loc)
    graph.insert_before(at, n)
    made.append(n)
    return n.results[0]


def _term_4d(graph: Graph, at: Node, x: Value, term: Value, flat: bool, made: list[Node]) -> Value | None:
    """A term added to the scores, as one that broadcasts to x's [B, H, T, S]: one added to the
    [B * H, T, S] form with B * H leading (DeBERTa's [B * H, T, S], BLOOM's ALiBi bias
    [B * H, 1, S]) reshaped to [B, H, ...]; None where it cannot be."""
    b, h = x.type.shape[:2]
    shape = term.type.shape
    if flat and len(shape) == 3 and shape[0] != 1 and not _broadcasts(shape, x.type.shape):
        if shape[0] != b * h:
            return None
        src = term.producer   # a reshape of a reshape is one reshape: the fuser then sees the
        if src is not None and src.op == "reshape":   # bias's own producer (BLOOM's [B, H, S])
            term = src.operands[0]
        return _made(graph, at, "reshape", [term], {"shape": [b, h, *shape[1:]]}, made)
    return term if _broadcasts(shape, x.type.shape) else None


def _mask_operand(graph: Graph, at: Node, x: Value, terms: list[Term], cond: Value | None,
                  fill: Value | None, made: list[Node]) -> Value | None:
    """The attention's mask: the sum of the terms added to the scores (each as one that
    broadcasts to x's [B, H, T, S]) and a masked fill (``where(cond, fill, term)``: the fill's
    score, not -inf, as before); the nodes made inserted before ``at`` and listed in ``made``.
    None where there is nothing to mask, a term does not broadcast, or a fill has no f32 term
    to go on."""
    mask: Value | None = None
    try:
        for term, flat, neg in terms:
            t4 = _term_4d(graph, at, x, term, flat, made)
            if t4 is None:
                return None
            if mask is None:
                mask = _made(graph, at, "neg", [t4], {}, made) if neg else t4
            else:
                mask = _made(graph, at, "sub" if neg else "add", [mask, t4], {}, made)
        if cond is None:
            return mask
        if mask is None or mask.type.dtype is not f32 or fill is None:
            return None
        return _made(graph, at, "where", [cond, fill, mask], {}, made)
    except TypeRuleError:
        return None


def fuse_spelled_attention(graph: Graph, sm: Node) -> Node | None:
    """The rewrite of the module doc on one softmax node; None where it does not apply."""
    x = sm.operands[0]
    if x.type.rank != 4 or sm.attrs["axis"] not in (-1, 3) or sole_user(x) is not sm or x.type.dtype is not f32:
        return None
    filled, cond, fill = _masked_fill(x)
    found = _scores(filled)
    if found is None or (cond is not None and found[1] is not None):
        return None
    (q, k, q_reader, k_reader, _), cap, scale, terms = found
    pv = _pv(sm.results[0])
    if pv is None:
        return None
    v, out, rv = pv
    at = out.producer
    assert at is not None
    made_k = _k_from_bshe(graph, k_reader, at)
    if made_k is not None:
        k = made_k.results[0]
    v5 = None
    if v.type.rank == 5 and rv is not None:   # a repeat's broadcast: reshaped to [B, H, S, Ev] (as
        v5 = v                                # repeat_of reads it), the 3-d reshape reading that
        b, hk, g, sk, ev = v.type.shape
        ra = OPS["reshape"].normalize_attrs({"shape": [b, hk * g, sk, ev]})
        rs = Node("reshape", [v], ra, OPS["reshape"].infer_types([v.type], ra), sm.loc)
        graph.insert_before(rv, rs)
        graph.set_operand(rv, 0, rs.results[0])
        v = rs.results[0]
    made: list[Node] = []
    mask = _mask_operand(graph, at, x, terms, cond, fill, made)
    operands = [q, k, v] + ([mask] if mask is not None else [])
    attrs = OPS["attention"].normalize_attrs({"scale": scale, "causal": False})
    try:
        types = OPS["attention"].infer_types([o.type for o in operands], attrs)
    except TypeRuleError:
        types = None
    plan = (match_rotary(q, k, v, q_reader, k_reader) if cap is not None and types is not None and made_k is None
            else None)
    if (types is None or not _same_but_unit_axes(types[0], out.type) or (cap is not None and plan is None)
            or (cap is not None and out.type.rank != 4)
            or (mask is None and (terms or cond is not None))):
        for n in reversed(made):   # the nodes made, dropped
            graph.erase(n)
        if v5 is not None and rv is not None and v.producer is not None:   # as it was
            graph.set_operand(rv, 0, v5)
            graph.erase(v.producer)
        if made_k is not None:
            graph.erase(made_k)
        return None
    if plan is not None:
        new = apply_rotary(graph, plan, at, {**attrs, "softcap": cap}, operands[3:], [out, None])
    else:
        new = Node("attention", operands, attrs, types, sm.loc)
        graph.insert_before(at, new)
        res = new.results[0]
        if out.type.rank != 4:   # the result's unit axes (Funnel's [B, H, T, 1, Ev])
            res = _made(graph, at, "reshape", [res], {"shape": list(out.type.shape)}, [])
        graph.replace_all_uses(out, res)
    erase_if_dead(graph, at)
    if new.op == "attention":
        return fuse_rotary(graph, new) or new
    return new
