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

Also taken (issue 37):

- **partial rotary** (GPT-NeoX, Phi, StableLM): ``concat(rope(x[..., :rd]), x[..., rd:])``
  becomes ``rotary_dim = rd``: the kernel rotates the first rd of each head and reads the rest
  as it is;
- **grouped-query attention's k/v repeat** (``repeat_of``: unsqueeze, broadcast, reshape) of
  both k and v by the same group: the node reads the unrepeated k and v (heads H / group) and
  the kernel reads key/value head h / group for query head h, so the repeated copies never
  exist;
- **rotation in pairs** (GPT-J, CodeGen: ``rotate_every_two``, pairs (2i, 2i + 1)) becomes
  ``rotary_pairs``, and a rotation in the [B, T, H, E] layout before a transpose that keeps the
  last axis is moved after it, the tables transposed alike (``_match_moved``);
- **x or the tables spelled once per reader** (OLMo's views of the clamped projection, CodeGen's
  tables made per tensor): values made by the same view ops from the same data count as one
  (``same_value``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir.diagnostics import TypeRuleError
from ..ir.dtypes import f32
from ..ir.graph import Graph, Node, Value
from ..ops._lazy import torch
from ..ops.registry import AttrSpec, Cost, OPS, OpDef, normalize_axis, register
from ..passes.rewrite import erase_if_dead, sole_user

__all__ = ["fuse_rotary", "same_value", "rope_parts", "repeat_of", "partial_rope_parts", "any_rope_parts", "match_rotary",
           "apply_rotary", "RotaryPlan"]


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


_VIEW_OPS = frozenset({"reshape", "transpose", "slice", "unsqueeze", "squeeze", "broadcast_to"})


def same_value(a: Value, b: Value, depth: int = 6) -> bool:
    """Whether a and b hold the same data: the same value, or made by the same view op (reshape,
    transpose, slice, unsqueeze, squeeze, broadcast_to) with the same attributes from the same data (an
    importer may spell ``x.view(...).transpose(...)`` once per reader; up to ``depth`` ops)."""
    if a is b:
        return True
    pa, pb = a.producer, b.producer
    if depth == 0 or pa is None or pb is None or pa.op != pb.op or pa.op not in _VIEW_OPS:
        return False
    if pa.attrs != pb.attrs or len(pa.operands) != len(pb.operands) or a.type != b.type:
        return False
    return all(same_value(x, y, depth - 1) for x, y in zip(pa.operands, pb.operands))


def _last_axis_concat(v: Value) -> tuple[Node, Value, Value] | None:
    """(the concat, its two parts) when v is a concat of two values on the last axis."""
    p = v.producer
    if p is None or p.op != "concat" or len(p.operands) != 2:
        return None
    if normalize_axis(p.attrs["axis"], v.type.rank, "concat") != v.type.rank - 1:
        return None
    return p, p.operands[0], p.operands[1]


def _rotate_half_of(v: Value) -> Value | None:
    """x when v = concat(neg(x[..., h:]), x[..., :h]) on the last axis, 2h = E, each part read
    only there."""
    halves = _last_axis_concat(v)
    if halves is None:
        return None
    p, a, b = halves
    last = v.type.rank - 1
    na = a.producer
    if na is None or na.op != "neg" or sole_user(a) is not p:
        return None
    hi, lo = _slice_of(na.operands[0], last), _slice_of(b, last)
    if hi is None or lo is None or not same_value(hi[0], lo[0]) or sole_user(na.operands[0]) is not na or sole_user(b) is not p:
        return None
    x = hi[0]
    e = x.type.shape[last]
    if e % 2 or hi[1:] != (e // 2, e) or lo[1:] != (0, e // 2):
        return None
    return x


def _strided_slice_of(v: Value, last: int) -> tuple[Value, int, int, int] | None:
    """(x, start, end, step) when v = slice(x) along the last axis (bounds resolved)."""
    p = v.producer
    if p is None or p.op != "slice":
        return None
    x = p.operands[0]
    if normalize_axis(p.attrs["axis"], x.type.rank, "slice") != last:
        return None
    start, end, step = slice(p.attrs["start"], p.attrs["end"], p.attrs["step"]).indices(x.type.shape[last])
    return x, start, end, step


def _unsqueezed_last(v: Value, into: Node) -> Value | None:
    """u when v = unsqueeze(u) adds a last axis and is read only by ``into``."""
    p = v.producer
    if p is None or p.op != "unsqueeze" or sole_user(v) is not into:
        return None
    u = p.operands[0]
    return u if tuple(v.type.shape) == tuple(u.type.shape) + (1,) else None


def _rotate_pairs_of(v: Value) -> Value | None:
    """x when v = reshape(concat(unsqueeze(neg(x[..., 1::2])), unsqueeze(x[..., 0::2]), axis=-1))
    (GPT-J's rotate_every_two: pairs (2i, 2i + 1) become (-x[2i + 1], x[2i])), each part read
    only there."""
    r = v.producer
    if r is None or r.op != "reshape" or v.type.rank < 1:
        return None
    c = r.operands[0]
    halves = _last_axis_concat(c)
    if halves is None or sole_user(c) is not r:
        return None
    p, a, b = halves
    n, xb = _unsqueezed_last(a, p), _unsqueezed_last(b, p)
    if n is None or xb is None or n.producer is None or n.producer.op != "neg" or sole_user(n) is not a.producer:
        return None
    last = v.type.rank - 1
    xo = n.producer.operands[0]
    odd, even = _strided_slice_of(xo, last), _strided_slice_of(xb, last)
    if odd is None or even is None or not same_value(odd[0], even[0]):
        return None
    if sole_user(xo) is not n.producer or sole_user(xb) is not b.producer:
        return None
    x = odd[0]
    e = x.type.shape[last]
    if tuple(x.type.shape) != tuple(v.type.shape) or e % 2 or odd[1:] != (1, e, 2) or even[1:] != (0, e, 2):
        return None
    return x


def rope_parts(v: Value, pairs: bool = False) -> tuple[Value, Value, Value] | None:
    """(x, cos, sin) when v = x * cos + rotate_half(x) * sin (``pairs``: rotate_every_two(x),
    ``_rotate_pairs_of``), each intermediate value read only on the way."""
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
            x = (_rotate_pairs_of if pairs else _rotate_half_of)(rh)
            if x is None or sole_user(rh) is not n2:
                continue
            for xx, cos in (n1.operands, n1.operands[::-1]):
                if same_value(xx, x) and not same_value(cos, x):
                    return xx, cos, sin
    return None


def partial_rope_parts(v: Value, pairs: bool = False) -> tuple[Value, Value, Value, int] | None:
    """(x, cos, sin, rd) when v = concat(rope(x[..., :rd]), x[..., rd:]) on the last axis (a
    partial rotary embedding; ``pairs`` as ``rope_parts``), each intermediate value read only on the way."""
    halves = _last_axis_concat(v)
    if halves is None:
        return None
    p, a, b = halves
    last = v.type.rank - 1
    if a is b or sole_user(a) is not p or sole_user(b) is not p:
        return None
    parts = rope_parts(a, pairs)
    if parts is None:
        return None
    rot, rest = _slice_of(parts[0], last), _slice_of(b, last)
    if rot is None or rest is None or not same_value(rot[0], rest[0]):
        return None
    x = rot[0]
    e = x.type.shape[last]
    rd = rot[2]
    if rot[1] != 0 or rest[1:] != (rd, e) or not 0 < rd < e:
        return None
    return x, parts[1], parts[2], rd


def any_rope_parts(v: Value, pairs: bool = False) -> tuple[Value, Value, Value, int] | None:
    """(x, cos, sin, rd) for a whole (rd = E) or partial rotary embedding of x (``rope_parts``,
    ``partial_rope_parts``; ``pairs`` as ``rope_parts``)."""
    whole = rope_parts(v, pairs)
    if whole is not None:
        return (*whole, v.type.shape[-1])
    return partial_rope_parts(v, pairs)


def _table_ok(t, q, rd: int | None = None) -> bool:
    """cos/sin broadcast to q's [..., T, rd] without growing it: a float of q's dtype (rd the
    rotated part of a head, E by default)."""
    rd = q.shape[-1] if rd is None else rd
    if t.dtype != q.dtype or t.rank > q.rank or t.rank == 0:
        return False
    return (all(d == 1 or d == e for d, e in zip(t.shape[-2::-1], q.shape[-2::-1]))
            and t.shape[-1] == rd)


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


def _rope_before_repeat(k: Value, pairs: bool = False) -> tuple[tuple[Value, Value, Value], Value] | None:
    """((xk, cos, sin), the rotated value) when k = repeat(rope(xk)) (``repeat_of``) with cos and
    sin the same for every head: then rope(repeat(xk)) = repeat(rope(xk)), and the kernel may
    rotate the repeated xk (``pairs`` as ``rope_parts``)."""
    rotated = repeat_of(k)
    if rotated is None or len(rotated.users) != 1 or rotated.is_output:
        return None
    parts = rope_parts(rotated, pairs)
    if parts is None:
        return None
    for t in parts[1:]:
        if t.type.rank >= 3 and t.type.shape[-3] != 1:
            return None
    return parts, rotated


def _kv_group(k: Value, v: Value, heads: int) -> tuple[Value, Value, int] | None:
    """(k's source, v's source, group) when k and v are both ``repeat_of`` values of their own
    source, repeated by the same group, and q has ``heads`` heads; None otherwise."""
    xk, xv = repeat_of(k), repeat_of(v)
    if xk is None or xv is None or xk.type.rank < 3:
        return None
    hk, hv = xk.type.shape[-3], xv.type.shape[-3]
    if hk != hv or not hk or heads % hk or heads == hk:
        return None
    return xk, xv, heads // hk


def _heads_shared(t: Value) -> bool:
    """Whether a cos/sin table is one for every head (dim -3 absent or 1)."""
    return t.type.rank < 3 or t.type.shape[-3] == 1


@dataclass
class RotaryPlan:
    """What ``match_rotary`` found: the unrotated q and k (k unrepeated with a group), v (or its
    source), the tables, the rotated size, and, for a k rotated before a repeat that v does not
    share, the rotated value whose readers are to read the unrotated k instead."""

    q: Value
    k: Value
    v: Value
    cos: Value
    sin: Value
    rd: int
    rotated: Value | None
    pairs: bool = False
    perm: tuple[int, ...] | None = None   # q, k and the tables to be transposed first (``_match_moved``)


def match_rotary(q: Value, k: Value, v: Value, q_reader: Node, k_reader: Node) -> RotaryPlan | None:
    """The plan of the rewrite in the module doc for attention's q, k and v (read only by
    ``q_reader`` and ``k_reader``), or None where it does not apply; changes nothing."""
    if q.type.dtype is not f32 or sole_user(q) is not q_reader or sole_user(k) is not k_reader:
        return None
    if q.type.shape[-2] != k.type.shape[-2]:
        return None
    rq = _rope_either(q)
    if rq is None:
        return _match_moved(q, k, v)
    pairs = rq[4]
    group = _kv_group(k, v, q.type.shape[-3]) if q.type.rank >= 3 else None
    rotated, rk = None, None
    if group is not None and len(group[0].users) == 1 and not group[0].is_output:
        rk = any_rope_parts(group[0], pairs)
    if rk is None:
        group = None
        rk = any_rope_parts(k, pairs)
        if rk is None:
            before = _rope_before_repeat(k, pairs)
            if before is not None:
                rk, rotated = (*before[0], q.type.shape[-1]), before[1]
    if rk is None or rq[0] is rk[0] or rq[3] != rk[3]:
        return None
    if not (same_value(rq[1], rk[1]) and same_value(rq[2], rk[2])):
        return None
    cos, sin, rd = rq[1], rq[2], rq[3]
    if not (_table_ok(cos.type, q.type, rd) and _table_ok(sin.type, q.type, rd)):
        return None
    if group is not None and not (_heads_shared(cos) and _heads_shared(sin)):
        return None
    if rotated is not None:   # the repeat of the rotated k stays, reading the unrotated k
        return RotaryPlan(rq[0], k, v, cos, sin, rd, rotated, pairs)
    return RotaryPlan(rq[0], rk[0], group[1] if group is not None else v, cos, sin, rd, None, pairs)


def _under_transpose(v: Value) -> tuple[Value, tuple[int, ...] | None]:
    """(u, perm) when v = transpose(u) keeps the last axis in place and u is read only there;
    (v, None) otherwise."""
    p = v.producer
    if p is None or p.op != "transpose":
        return v, None
    perm = tuple(int(i) for i in p.attrs["perm"])
    u = p.operands[0]
    if perm[-1] != len(perm) - 1 or sole_user(u) is not p:
        return v, None
    return u, perm


def _rope_either(v: Value) -> tuple[Value, Value, Value, int, bool] | None:
    """(x, cos, sin, rd, pairs) for a rotation of x in halves or in pairs (``any_rope_parts``)."""
    for pairs in (False, True):
        found = any_rope_parts(v, pairs)
        if found is not None:
            return (*found, pairs)
    return None


def _permuted(t, perm: tuple[int, ...] | None):
    """t's type transposed by perm (t itself without one)."""
    from ..ir.types import TensorType

    return t if perm is None else TensorType(tuple(t.shape[i] for i in perm), t.dtype)


def _match_moved(q: Value, k: Value, v: Value) -> RotaryPlan | None:
    """The plan for q and k rotated (in halves or pairs) before one transpose that keeps the last axis (q = transpose(rope(x)), GPT-J's and CodeGen's [B, T, H, E] rotation):
    transpose(rope(x)) = rope'(transpose(x)) with the tables transposed alike, so the node reads
    transpose(x) and the transposed tables. Tables of q and k the same data (``same_value``)."""
    xq, pq = _under_transpose(q)
    xk, pk = _under_transpose(k)
    rq, rk = _rope_either(xq), _rope_either(xk)
    if rq is None or rk is None or pq != pk or rq[4] != rk[4] or rq[3] != rk[3] or rq[0] is rk[0]:
        return None
    if pq is None:
        return None   # no transpose: match_rotary's forms, refused already
    if not (same_value(rq[1], rk[1]) and same_value(rq[2], rk[2])):
        return None
    cos, sin, rd = rq[1], rq[2], rq[3]
    if pq is not None and (cos.type.rank != len(pq) or sin.type.rank != len(pq)):
        return None
    if not (_table_ok(_permuted(cos.type, pq), q.type, rd) and _table_ok(_permuted(sin.type, pq), q.type, rd)):
        return None
    return RotaryPlan(rq[0], rk[0], v, cos, sin, rd, None, rq[4], pq)


def _transposed(graph: Graph, x: Value, perm: tuple[int, ...], at: Node) -> Value:
    """A transpose of x by perm inserted before ``at``."""
    attrs = OPS["transpose"].normalize_attrs({"perm": list(perm)})
    node = Node("transpose", [x], attrs, OPS["transpose"].infer_types([x.type], attrs), at.loc)
    graph.insert_before(at, node)
    return node.results[0]


def apply_rotary(graph: Graph, plan: RotaryPlan, at: Node, attrs: dict, rest: list,
                 results: list[Value | None]) -> Node:
    """A ``rotary_attention`` node of ``plan`` (attention's ``attrs``, the operands after v
    ``rest``) inserted before ``at``, its results read where the values ``results`` (out, lse;
    None for one not there) were; the old nodes are left for the caller to erase."""
    if plan.rotated is not None:   # the repeat reads the unrotated k; the kernel rotates what it repeats
        graph.replace_all_uses(plan.rotated, _unrotated(plan.rotated, plan.pairs))
        assert plan.rotated.producer is not None
        erase_if_dead(graph, plan.rotated.producer)
    attrs = dict(attrs)
    if plan.rd != plan.q.type.shape[-1]:
        attrs["rotary_dim"] = plan.rd
    if plan.pairs:
        attrs["rotary_pairs"] = True
    qkt = [plan.q, plan.k, plan.cos, plan.sin]
    if plan.perm is not None:   # rotate after the transpose: q, k and the tables moved alike
        qkt = [_transposed(graph, x, plan.perm, at) for x in qkt]
    operands = [qkt[0], qkt[1], plan.v, qkt[2], qkt[3]] + list(rest)
    attrs = OPS["rotary_attention"].normalize_attrs(attrs)
    types = OPS["rotary_attention"].infer_types([o.type for o in operands], attrs)
    new = Node("rotary_attention", operands, attrs, types, at.loc)
    graph.insert_before(at, new)
    for old, r in zip(results, new.results):
        if old is not None:
            graph.replace_all_uses(old, r)
    return new


def _unrotated(rotated: Value, pairs: bool = False) -> Value:
    """x of a whole-head rotation ``rotated`` = rope(x) (``pairs`` as ``rope_parts``)."""
    parts = rope_parts(rotated, pairs)
    assert parts is not None
    return parts[0]


def fuse_rotary(graph: Graph, node: Node, extra: dict | None = None) -> Node | None:
    """The rewrite described in the module doc, on one attention node; None where it does not
    apply. k and v repeated by one group (grouped-query attention) are read unrepeated, the
    kernel reading head h / group; a k repeated after its rotation with v not repeated alike is
    rotated by the kernel after the repeat instead (the repeat then reads the unrotated k).
    ``extra``: attributes of rotary_attention to add (``softcap``)."""
    q, k, v = node.operands[:3]
    out, lse = node.results
    if lse.users or lse.is_output:
        return None
    plan = match_rotary(q, k, v, node, node)
    if plan is None:
        return None
    new = apply_rotary(graph, plan, node, {**node.attrs, **(extra or {})}, list(node.operands[3:]), [out, lse])
    erase_if_dead(graph, node)   # and the rotations and repeats, now read by nothing
    return new


# --- the op ----------------------------------------------------------------------------------

def _group_of(q, k) -> int:
    """How many query heads read each key/value head (dim -3): 1 without grouping."""
    if q.rank < 3 or k.rank != q.rank or k.shape[-3] == q.shape[-3] or not k.shape[-3]:
        return 1
    return q.shape[-3] // k.shape[-3]


def _rotary_infer(ts, attrs):
    from ..ir.types import TensorType
    from ..ops.nn import attention_infer

    q, k, v, cos, sin = ts[:5]
    rd = attrs.get("rotary_dim") or q.shape[-1]
    if rd % 2 or not 0 < rd <= q.shape[-1]:
        raise TypeRuleError(f"rotary_attention: rotary_dim {rd} must be even and within q {q}'s head size; "
                            "rotate_half splits the rotated part in two")
    for t, what in ((cos, "cos"), (sin, "sin")):
        if not _table_ok(t, q, rd):
            raise TypeRuleError(f"rotary_attention: {what} {t} must be of q's dtype and broadcast to q {q}'s "
                                f"[..., T, {rd}] (the rotated part of a head)")
    if q.shape[-2] != k.shape[-2]:
        raise TypeRuleError(f"rotary_attention: q {q} and k {k} must have as many positions (self-attention)")
    cap = attrs.get("softcap")
    if cap is not None and not cap > 0:
        raise TypeRuleError(f"rotary_attention: softcap {cap} must be positive (scores become cap * tanh(s / cap))")
    g = _group_of(q, k)
    if g != 1:
        if q.shape[-3] % k.shape[-3] or v.rank != k.rank or v.shape[-3] != k.shape[-3]:
            raise TypeRuleError(f"rotary_attention: k {k} and v {v} must have a whole fraction of q {q}'s heads "
                                "(dim -3; grouped-query attention) and as many as each other")
        k = TensorType(k.shape[:-3] + (q.shape[-3],) + k.shape[-2:], k.dtype)
        v = TensorType(v.shape[:-3] + (q.shape[-3],) + v.shape[-2:], v.dtype)
    return attention_infer([q, k, v] + list(ts[5:]), attrs)


def _np_rope(x, cos, sin, pairs: bool = False):
    rd = cos.shape[-1]
    h = rd // 2
    xr = x[..., :rd]
    if pairs:
        rh = np.stack([-xr[..., 1::2], xr[..., 0::2]], axis=-1).reshape(xr.shape)
    else:
        rh = np.concatenate([-xr[..., h:], xr[..., :h]], axis=-1)
    rot = (xr * cos + rh * sin).astype(x.dtype)   # rounded as the unfused ops in x's dtype
    return np.concatenate([rot, x[..., rd:]], axis=-1) if rd < x.shape[-1] else rot


def _np_capped_attention(args, attrs):
    """The reference of attention with soft-capped scores: s = cap * tanh(scale q k^T / cap),
    then the causal condition and the mask, softmax, times v (f64, as np_attention)."""
    from ..ops.nn import attention_scale

    q, k, v = (a.astype(np.float64) for a in args[:3])
    mask = args[3] if len(args) > 3 else None
    cap = float(attrs["softcap"])
    s = np.tanh(np.matmul(q, np.swapaxes(k, -1, -2)) * attention_scale(attrs, q.shape[-1]) / cap) * cap
    tq, tk = s.shape[-2:]
    if attrs["causal"]:
        s = np.where(np.tril(np.ones((tq, tk), dtype=bool)), s, -np.inf)
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == np.bool_ else s + mask.astype(np.float64)
    m = np.max(s, axis=-1, keepdims=True)
    m = np.where(m == -np.inf, 0.0, m)
    e = np.exp(s - m)
    total = np.sum(e, axis=-1, keepdims=True)
    safe = np.where(total == 0.0, 1.0, total)
    return np.matmul(e, v) / safe, (m + np.log(safe))[..., 0]


def _rotary_reference(args, attrs):
    from ..ops.nn import np_attention

    q, k, v, cos, sin = args[:5]
    g = q.shape[-3] // k.shape[-3] if q.ndim >= 3 and k.shape[-3] != q.shape[-3] else 1
    if g != 1:
        k, v = np.repeat(k, g, axis=-3), np.repeat(v, g, axis=-3)
    pairs = bool(attrs.get("rotary_pairs"))
    parts = [_np_rope(q, cos, sin, pairs), _np_rope(k, cos, sin, pairs), v] + list(args[5:])
    return (_np_capped_attention if attrs.get("softcap") else np_attention)(parts, attrs)


def _torch_rope(x, cos, sin, pairs: bool = False):
    rd = cos.shape[-1]
    h = rd // 2
    xr = x[..., :rd]
    if pairs:
        rh = torch.stack((-xr[..., 1::2], xr[..., 0::2]), -1).reshape(xr.shape)
    else:
        rh = torch.cat((-xr[..., h:], xr[..., :h]), -1)
    rot = xr * cos + rh * sin
    return torch.cat((rot, x[..., rd:]), -1) if rd < x.shape[-1] else rot


def _torch_capped_attention(args, attrs):
    """attention with soft-capped scores in torch ops (``_np_capped_attention``'s formula)."""
    from ..ops.nn import attention_compute_dtype, attention_scale

    q, k, v = args[:3]
    mask = args[3] if len(args) > 3 else None
    ct = attention_compute_dtype(q)
    cap = float(attrs["softcap"])
    s = torch.tanh(torch.matmul(q.to(ct), k.to(ct).transpose(-2, -1)) * attention_scale(attrs, q.shape[-1])
                   / cap) * cap
    tq, tk = s.shape[-2:]
    if attrs["causal"]:
        s = s.masked_fill(~torch.ones(tq, tk, dtype=torch.bool, device=s.device).tril(), float("-inf"))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.to(ct)
    m = s.amax(-1, keepdim=True)
    m = m.masked_fill(m == float("-inf"), 0.0)
    e = torch.exp(s - m)
    total = e.sum(-1, keepdim=True)
    safe = total.masked_fill(total == 0, 1.0)
    return (torch.matmul(e, v.to(ct)) / safe).to(q.dtype), (m + torch.log(safe)).squeeze(-1)


def _rotary_torch(args, attrs):
    from ..ops.nn import torch_attention

    q, k, v, cos, sin = args[:5]
    if q.dim() >= 3 and k.shape[-3] != q.shape[-3]:
        g = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(g, dim=-3), v.repeat_interleave(g, dim=-3)
    pairs = bool(attrs.get("rotary_pairs"))
    parts = [_torch_rope(q, cos, sin, pairs), _torch_rope(k, cos, sin, pairs), v] + list(args[5:])
    return (_torch_capped_attention if attrs.get("softcap") else torch_attention)(parts, attrs)


def _rotary_cost(ins, outs, attrs):
    from ..ir.types import TensorType

    q, k, v = ins[:3]
    g = _group_of(q, k)
    if g != 1:   # the op computes the pairs of the repeated heads
        k = TensorType(k.shape[:-3] + (q.shape[-3],) + k.shape[-2:], k.dtype)
        v = TensorType(v.shape[:-3] + (q.shape[-3],) + v.shape[-2:], v.dtype)
    c = OPS["attention"].cost_of([q, k, v] + list(ins[5:]), outs, attrs)
    rot = 3 * (ins[0].numel + ins[1].numel)
    return Cost(c.flops + rot, c.bytes_read + ins[3].nbytes + ins[4].nbytes, c.bytes_written)


register(OpDef(
    name="rotary_attention", operands=("q", "k", "v", "cos", "sin", "mask?"),
    attrs=OPS["attention"].attrs + (AttrSpec("rotary_dim", "int", None), AttrSpec("softcap", "float", None),
                                    AttrSpec("rotary_pairs", "bool", False)),
    infer=_rotary_infer, reference=_rotary_reference, torch=_rotary_torch, cost=_rotary_cost,
    doc="attention(rope(q), rope(k), v, mask) with rope(x) = x * cos + rotate_half(x) * sin, "
        "rotate_half(x) = concat(-x[..., E/2:], x[..., :E/2]) on the last axis; cos and sin broadcast "
        "to q's [..., T, E] and serve k too (self-attention, T = S). Results and attrs as attention's. "
        "rotary_dim (optional, even): only x[..., :rotary_dim] is rotated (cos and sin [..., T, rotary_dim]), "
        "the rest passed through. rotary_pairs (optional): rotate_half is rotate_every_two instead "
        "(pairs (2i, 2i + 1) become (-x[2i + 1], x[2i]), GPT-J's form; cos and sin repeat_interleave'd). softcap (optional, > 0): the scaled scores s become softcap * "
        "tanh(s / softcap) before the causal condition and the mask. k and v may have 1/g of q's heads "
        "(dim -3; grouped-query attention): query head h reads key/value head h // g. "
        "Made by the fuse-library pass for inference (codegen/rotary.py); the generated attention kernel "
        "rotates q and k as it reads them.",
))
