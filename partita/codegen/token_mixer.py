"""PoolFormer's token mixer as one step: the ``pool_mixer`` op, its matcher and its kernel.

A PoolFormer block's first half is ``x + s * (avg_pool(gn(x)) - gn(x))``: a GroupNorm (one group
in the zoo's model), a stride-1 average pool keeping the size (``count_include_pad=False``), the
pool minus its input, times a per-channel layer scale ``s``, plus the block's input. After
``fuse-library`` and ``fuse-kernels`` that is three steps (``group_norm``, ``avg_pool2d`` and a
``fused`` kernel of sub, mul and add), and ``assign-layout`` then turns the pool into a
depthwise convolution and a division: five steps, each reading and writing the whole map.
``fuse_pool_mixers`` (run by ``CompiledProgram`` before ``assign-layout``) rewrites the pattern,
written out in ops or as the ``fused`` node, into

    %o = pool_mixer(%x, %w, %b, %s) {groups=1, eps=1e-05, kernel=[3, 3], count_include_pad=false}

whose reference is the pattern's ops' references in order (GroupNorm, pool, sub, mul, add).

The step (``pool_mixer_kernel``) measures two candidates at its first call (codegen/choose.py):
the generated kernel (f32, any layout copied to contiguous NCHW; per (sample, group) block the
statistics as group_norm.py's kernel computes them, then per channel the normalized plane into a
zero-bordered scratch plane, the k x k window sums over it in one flat loop, and ``x + s *
(sum / count - y)``) and ATen's ops in turn.
"""

from __future__ import annotations

import ctypes
import math
from typing import Any, Callable

import numpy as np

from ..ir.diagnostics import TypeRuleError
from ..ir.dtypes import f32
from ..ir.graph import Graph, Node, Value
from ..ops._lazy import torch
from ..ops.registry import AttrSpec, Cost, OPS, OpDef, register

__all__ = ["fuse_pool_mixers", "fold_residual_scales", "pool_mixer_kernel", "generated_for", "PreparedPoolMixer",
           "takes"]


# --- the op ----------------------------------------------------------------------------------

def _infer(ts: list, attrs: dict) -> Any:
    x = ts[0]
    if x.rank != 4 or not x.dtype.is_float:
        raise TypeRuleError(f"pool_mixer: x must be a float [N, C, H, W], got {x}")
    c, g = x.shape[1], attrs["groups"]
    if g < 1 or c % g:
        raise TypeRuleError(f"pool_mixer: groups={g} must divide the {c} channels of {x}")
    for k in attrs["kernel"]:
        if k < 1 or k % 2 == 0:
            raise TypeRuleError(f"pool_mixer: the pool's kernel {list(attrs['kernel'])} must be odd (a pool "
                                "keeping the size: stride 1, padding kernel // 2)")
    for t in ts[1:]:
        if t.numel != c or t.dtype != x.dtype:
            raise TypeRuleError(f"pool_mixer: weight, bias and scale must hold {c} {x.dtype} values, got {t}")
    return x


def _pool_attrs(attrs: dict) -> dict:
    """The attrs of the ``avg_pool2d`` the op stands for."""
    k = tuple(attrs["kernel"])
    return OPS["avg_pool2d"].normalize_attrs({"kernel": k, "stride": (1, 1), "padding": tuple(i // 2 for i in k),
                                              "count_include_pad": bool(attrs["count_include_pad"])})


def _reference(args: list, attrs: dict) -> np.ndarray:
    from .group_norm import GROUP_NORM_UNARY  # noqa: F401: registers group_norm

    x = np.asarray(args[0])
    dt, c = x.dtype, x.shape[1]

    def step(op: str, a: list, at: dict) -> np.ndarray:
        with np.errstate(all="ignore"):
            r = np.asarray(OPS[op].reference(a, at))
        return r if r.dtype == dt else r.astype(dt)

    gn = step("group_norm", [x, np.asarray(args[1]).reshape(c), np.asarray(args[2]).reshape(c)],
              OPS["group_norm"].normalize_attrs({"groups": attrs["groups"], "eps": attrs["eps"]}))
    pool = step("avg_pool2d", [gn], _pool_attrs(attrs))
    d = step("sub", [pool, gn], {})
    m = step("mul", [np.asarray(args[3]).reshape(c, 1, 1), d], {})
    return step("add", [x, m], {})


def _torch(args: list, attrs: dict) -> Any:
    x = args[0]
    c = x.shape[1]
    y = torch.nn.functional.group_norm(x, attrs["groups"], args[1].reshape(-1), args[2].reshape(-1), attrs["eps"])
    k = tuple(attrs["kernel"])
    p = torch.nn.functional.avg_pool2d(y, k, 1, tuple(i // 2 for i in k),
                                       count_include_pad=bool(attrs["count_include_pad"]))
    return x + args[3].reshape(c, 1, 1) * (p - y)


def _cost(ins: list, outs: list, attrs: dict) -> Cost:
    n = ins[0].numel
    return Cost(n * (12 + math.prod(attrs["kernel"])), sum(t.nbytes for t in ins), outs[0].nbytes)


register(OpDef(
    name="pool_mixer", operands=("x", "weight", "bias", "scale"),
    attrs=(AttrSpec("groups", "int"), AttrSpec("eps", "float", 1e-5), AttrSpec("kernel", "ints"),
           AttrSpec("count_include_pad", "bool", True)),
    infer=_infer, reference=_reference, torch=_torch, cost=_cost,
    doc="PoolFormer's token mixer x + scale * (avg_pool(y) - y), y = group_norm(x, weight, bias): the "
        "pool of stride 1 keeping the size (padding kernel // 2), scale per channel. Made from the "
        "ops by CompiledProgram (codegen/token_mixer.py); inference.",
))


# --- the rewrite -----------------------------------------------------------------------------

def _through_reshapes(v: Value, c: int) -> Value | None:
    """The value a per-channel operand (reshaped to [C, 1, 1] or [1, C, 1, 1]) comes from."""
    while v.producer is not None and v.producer.op in ("reshape", "unsqueeze"):
        v = v.producer.operands[0]
    return v if v.type.numel == c else None


def _per_channel_shape(v: Value, c: int) -> bool:
    """Whether ``v`` broadcast against [N, C, H, W] is one number per channel."""
    s = tuple(v.type.shape)
    return v.type.numel == c and s in ((c, 1, 1), (1, c, 1, 1))


def _mix_tail(sub: Node, pool: Value, y: Value, resolve: Callable[[Value], Value | None]) -> tuple[Value, Value] | None:
    """(scale, x) of ``add(x, mul(s, sub(pool, y)))`` from the ``sub``, operands mapped to the
    outer graph by ``resolve``; None where the ops are not that, or a value is read elsewhere."""
    if sub.op != "sub" or resolve(sub.operands[0]) is not pool or resolve(sub.operands[1]) is not y:
        return None
    d = sub.results[0]
    c = y.type.shape[1]
    if d.is_output or len(d.users) != 1:
        return None
    mul = next(iter(d.users))
    if mul.op != "mul" or len(mul.operands) != 2 or sum(o is d for o in mul.operands) != 1:
        return None
    s_in = mul.operands[1] if mul.operands[0] is d else mul.operands[0]
    if not _per_channel_shape(s_in, c) or mul.results[0].type != y.type:
        return None
    src = _through_reshapes(s_in, c)
    scale = None if src is None else resolve(src)
    m = mul.results[0]
    if scale is None or scale.type.dtype is not f32 or m.is_output or len(m.users) != 1:
        return None
    add = next(iter(m.users))
    if add.op != "add" or len(add.operands) != 2 or sum(o is m for o in add.operands) != 1:
        return None
    x = resolve(add.operands[1] if add.operands[0] is m else add.operands[0])
    if x is None or add.results[0].type != y.type:
        return None
    return scale, x


def _fused_tail(node: Node, pool: Value, y: Value) -> tuple[Value, Value] | None:
    """(scale, x) where ``node`` is a ``fused`` kernel computing exactly the mixer's tail."""
    from .fused_body import body_graph

    body = body_graph(node.attrs["body"])
    if len(body.outputs) != 1 or len(node.results) != 1:
        return None
    outer = dict(zip(body.inputs, node.operands))
    subs = [n for n in body.nodes if n.op == "sub"]
    kinds = sorted(n.op for n in body.nodes)
    if len(subs) != 1 or [k for k in kinds if k not in ("reshape", "unsqueeze")] != ["add", "mul", "sub"]:
        return None
    found = _mix_tail(subs[0], pool, y, outer.get)
    if found is None or body.outputs[0].producer is None or body.outputs[0].producer.op != "add":
        return None
    return found


def _pool_ok(p: Node) -> bool:
    """Whether ``p`` is a stride-1 2-d average pool keeping the size (odd kernel, padding k // 2)."""
    a = p.attrs
    k = tuple(a["kernel"])
    return (p.op == "avg_pool2d" and not a["ceil_mode"] and all(d == 1 for d in a["dilation"])
            and tuple(a["stride"] or k) == (1, 1) and all(i % 2 == 1 for i in k)
            and tuple(a["padding"]) == tuple(i // 2 for i in k))


def _match(gn: Node) -> tuple[Node, Node, Value, Value, list[Node]] | None:
    """(the pool, the last node, scale, x, the tail's nodes) of the mixer after ``gn``, or None."""
    y = gn.results[0]
    if len(gn.operands) != 3 or gn.attrs["unary"] != "none" or y.type.dtype is not f32 or y.type.rank != 4:
        return None
    if any(not isinstance(d, int) for d in y.type.shape) or y.is_output:
        return None
    users = list(y.users)
    pools = [u for u in users if u.op == "avg_pool2d"]
    if len(users) != 2 or len(pools) != 1 or not _pool_ok(pools[0]):
        return None
    pool = pools[0]
    other = users[1] if users[0] is pool else users[0]
    pv = pool.results[0]
    if pv.is_output or len(pv.users) != 1 or next(iter(pv.users)) is not other:
        return None
    if other.op == "fused":
        found = _fused_tail(other, pv, y)
        return None if found is None else (pool, other, found[0], found[1], [other])
    found = _mix_tail(other, pv, y, lambda v: v)
    if found is None:
        return None
    mul = next(iter(other.results[0].users))
    add = next(iter(mul.results[0].users))
    return pool, add, found[0], found[1], [add, mul, other]


def fuse_pool_mixers(graph: Graph) -> int:
    """Rewrite each PoolFormer token mixer of ``graph`` (module doc) into ``pool_mixer``; how many.
    The residual must be the norm's own input and the scale one number per channel."""
    from ..passes.rewrite import erase_if_dead

    done = 0
    for gn in list(graph.nodes):
        if gn.graph is not graph or gn.op != "group_norm":
            continue
        found = _match(gn)
        if found is None or found[3] is not gn.operands[0]:
            continue
        pool, last, scale, x, _tail = found
        if scale.producer is not None and not scale.producer.is_before(last):
            continue
        attrs = OPS["pool_mixer"].normalize_attrs({
            "groups": gn.attrs["groups"], "eps": gn.attrs["eps"], "kernel": tuple(pool.attrs["kernel"]),
            "count_include_pad": bool(pool.attrs["count_include_pad"])})
        new = Node("pool_mixer", [x, gn.operands[1], gn.operands[2], scale], attrs, [x.type], last.loc)
        graph.insert_before(last, new)
        graph.replace_all_uses(last.results[0], new.results[0])
        erase_if_dead(graph, last)
        done += 1
    return done



# --- the MLP's scaled residual ---------------------------------------------------------------

def _scaled_sum(mul: Node, resolve: Callable[[Value], Value | None], c: int) -> tuple[Value, Value, Node] | None:
    """(the per-channel scale, the scaled value, the ``add``) of ``add(r, mul(s, v))`` from the
    ``mul``, operands mapped to the outer graph by ``resolve``; None where it is not that."""
    if mul.op != "mul" or len(mul.operands) != 2 or mul.operands[0] is mul.operands[1]:
        return None
    m = mul.results[0]
    if m.is_output or len(m.users) != 1:
        return None
    add = next(iter(m.users))
    if add.op != "add" or len(add.operands) != 2 or sum(o is m for o in add.operands) != 1:
        return None
    for i in (0, 1):
        s_in, v_in = mul.operands[i], mul.operands[1 - i]
        src = _through_reshapes(s_in, c) if _per_channel_shape(s_in, c) else None
        scale, v = (None, None) if src is None else (resolve(src), resolve(v_in))
        if scale is not None and v is not None and v_in.type == m.type:
            return scale, v, add
    return None


def _residual_of(node: Node, conv: Node) -> tuple[Value, Value, Node] | None:
    """(scale, residual, the last node) where ``node`` computes ``r + s * conv`` (a ``fused``
    kernel of just that, or the ``mul`` of the ops written out)."""
    out = conv.results[0]
    c = out.type.shape[1]
    if node.op == "fused":
        from .fused_body import body_graph

        body = body_graph(node.attrs["body"])
        ops = sorted(n.op for n in body.nodes if n.op not in ("reshape", "unsqueeze"))
        muls = [n for n in body.nodes if n.op == "mul"]
        if ops != ["add", "mul"] or len(body.outputs) != 1 or len(node.results) != 1:
            return None
        outer = dict(zip(body.inputs, node.operands))
        found = _scaled_sum(muls[0], outer.get, c)
        if found is None or found[1] is not out or body.outputs[0] is not found[2].results[0]:
            return None
        other = next(o for o in found[2].operands if o is not muls[0].results[0])
        r = outer.get(other)
        return None if r is None else (found[0], r, node)
    found = _scaled_sum(node, lambda v: v, c)
    if found is None or found[1] is not out:
        return None
    r = next(o for o in found[2].operands if o is not node.results[0])
    return found[0], r, found[2]


def fold_residual_scales(graph: Graph) -> int:
    """Frozen weights only: each ``r + s * conv(x)`` with ``s`` a known per-channel scale (the
    layer scale after PoolFormer's MLP) becomes ``conv(x; W * s, b * s)`` with the residual
    added as the convolution's epilogue (``binary="add"``); how many. The convolution must have
    a known weight and bias read by it alone, no epilogue, and nothing else reading its result."""
    from .inference import known_value
    from .scale_fold import drop_if_unused, new_known

    done = 0
    for conv in list(graph.nodes):
        if conv.graph is not graph or conv.op != "conv2d_pointwise" or len(conv.operands) != 3:
            continue
        out = conv.results[0]
        if (conv.attrs["binary"] != "none" or conv.attrs["unary"] != "none" or out.is_output
                or out.type.dtype is not f32 or len(out.users) != 1):
            continue
        found = _residual_of(next(iter(out.users)), conv)
        if found is None:
            continue
        scale, r, last = found
        w, b, s = (known_value(graph, v) for v in (conv.operands[1], conv.operands[2], scale))
        if w is None or b is None or s is None or r is out or r.type != out.type:
            continue
        if any(len(v.users) != 1 or v.is_output for v in conv.operands[1:]):
            continue
        vec = s.astype(np.float64).reshape(-1)
        if vec.size != w.shape[0] or not np.all(np.isfinite(vec)):
            continue
        if r.producer is not None and not r.producer.is_before(conv):
            continue
        nw = new_known(graph, conv.operands[1], (w * vec.reshape(-1, 1, 1, 1)).astype(w.dtype), conv)
        nb = new_known(graph, conv.operands[2], (b * vec.reshape(b.shape)).astype(b.dtype), conv)
        attrs = dict(conv.attrs, binary="add")
        new = Node("conv2d_pointwise", [conv.operands[0], nw, nb, r], OPS["conv2d_pointwise"].normalize_attrs(attrs),
                   [out.type], conv.loc)
        graph.insert_before(last, new)
        graph.replace_all_uses(last.results[0], new.results[0])
        from ..passes.rewrite import erase_if_dead

        old = list(conv.operands[1:]) + [scale]
        erase_if_dead(graph, last)
        for v in dict.fromkeys(old):
            drop_if_unused(graph, v)
        done += 1
    return done

# --- the generated kernel --------------------------------------------------------------------

# The parameter block's slots (addresses), in order.
_SLOTS = ("x", "w", "b", "s", "cnt", "t", "y")


def _normalize_ir(e: Any, h: int, w: int, wp: int, ph: int, pw: int, ps: int) -> None:
    """The channel's plane ((x - mean) * rstd) * w + b into its scratch plane ``%tpc`` at row
    ``r + ph``, column ``c + pw`` (from block ``nz``); x's positions ``ps`` elements apart."""
    a, load = e.a, e.load

    def row(r: str, _acc: str | None) -> None:
        a(f"  %nr.xo = mul i64 {r}, {w * ps}")
        a(f"  %nr.rr = add i64 {r}, {ph}")
        a(f"  %nr.to0 = mul i64 %nr.rr, {wp}")
        a(f"  %nr.to = add i64 %nr.to0, {pw}")
        a("  %nr.xp = getelementptr inbounds float, ptr %xc, i64 %nr.xo")
        a("  %nr.tq = getelementptr inbounds float, ptr %tpc, i64 %nr.to")
        a("  br label %nc0")
        a("nc0:")

        def col(j: str, _a: str | None) -> None:
            a(f"  %nc.xj = mul i64 {j}, {ps}")
            v = load("%nr.xp", "%nc.xj", "float", "nc.v")
            a(f"  %nc.d = fsub float {v}, %mean")
            a("  %nc.n = fmul float %nc.d, %rstd")
            a("  %nc.w = fmul float %nc.n, %wc")
            a("  %nc.b = fadd float %nc.w, %bc")
            a(f"  %nc.p = getelementptr inbounds float, ptr %nr.tq, i64 {j}")
            a("  store float %nc.b, ptr %nc.p, align 4")
        e.loop("nc", "nc0", str(w), 1, None, col)
    e.loop("nr", "nz", str(h), 1, None, row)


def _window_sums_ir(e: Any, n: int, wp: int, kh: int, kw: int) -> None:
    """``%sp[q] = sum of %tpd[q + dy * wp + dx]`` over the window, for q in [0, n) (block ``ws0``)."""
    a, load = e.a, e.load

    def body(q: str, _acc: str | None) -> None:
        acc = "0.0"
        for dy in range(kh):
            for dx in range(kw):
                t = f"ws.{dy}.{dx}"
                a(f"  %{t}.o = add i64 {q}, {dy * wp + dx}")
                v = load("%tpd", f"%{t}.o", "float", f"{t}.v")
                a(f"  %{t}.s = fadd float {acc}, {v}")
                acc = f"%{t}.s"
        a(f"  %ws.p = getelementptr inbounds float, ptr %sp, i64 {q}")
        a(f"  store float {acc}, ptr %ws.p, align 4")
    e.loop("ws", "ws0", str(n), 1, None, body)


def _mix_ir(e: Any, h: int, w: int, wp: int, ph: int, pw: int, ps: int, os: int = 1) -> None:
    """``out = x + s * (sums / count - y)`` over the channel's plane (from block ``mx0``); x's
    positions ``ps`` elements apart, the result's ``os`` apart."""
    a, load = e.a, e.load

    def row(r: str, _acc: str | None) -> None:
        a(f"  %mr.xo = mul i64 {r}, {w}")
        a(f"  %mr.so = mul i64 {r}, {wp}")
        a(f"  %mr.rr = add i64 {r}, {ph}")
        a(f"  %mr.to0 = mul i64 %mr.rr, {wp}")
        a(f"  %mr.to = add i64 %mr.to0, {pw}")
        a(f"  %mr.xq = mul i64 %mr.xo, {ps}")
        a("  %mr.xp = getelementptr inbounds float, ptr %xd, i64 %mr.xq")
        a(f"  %mr.oq = mul i64 %mr.xo, {os}")
        a("  %mr.op = getelementptr inbounds float, ptr %oc, i64 %mr.oq")
        a("  %mr.cp = getelementptr inbounds float, ptr %cnt, i64 %mr.xo")
        a("  %mr.sq = getelementptr inbounds float, ptr %sp, i64 %mr.so")
        a("  %mr.tq = getelementptr inbounds float, ptr %tpd, i64 %mr.to")
        a("  br label %mc0")
        a("mc0:")

        def col(j: str, _a: str | None) -> None:
            sm = load("%mr.sq", j, "float", "mc.sm")
            ct = load("%mr.cp", j, "float", "mc.ct")
            yv = load("%mr.tq", j, "float", "mc.yv")
            a(f"  %mc.xj = mul i64 {j}, {ps}")
            xv = load("%mr.xp", "%mc.xj", "float", "mc.xv")
            a(f"  %mc.pool = fdiv float {sm}, {ct}")
            a(f"  %mc.d = fsub float %mc.pool, {yv}")
            a("  %mc.m = fmul float %sc, %mc.d")
            a(f"  %mc.o = fadd float {xv}, %mc.m")
            a(f"  %mc.oj = mul i64 {j}, {os}")
            a("  %mc.p = getelementptr inbounds float, ptr %mr.op, i64 %mc.oj")
            a("  store float %mc.o, ptr %mc.p, align 4")
        e.loop("mc", "mc0", str(w), 1, None, col)
    e.loop("mr", "mx0", str(h), 1, None, row)


def pool_mixer_ir(name: str, cg: int, h: int, w: int, groups: int, eps: float, kh: int, kw: int,
                  scratch: int, lanes: int, channels_last: bool = False, out_channels_last: bool = False) -> str:
    """The LLVM IR of the mixer over contiguous NCHW f32 memory (x channels-last where
    ``channels_last``, the result where ``out_channels_last``; one group for either: a sample's
    statistics are over its block either way): ``void NAME(ptr params, i64 lo,
    i64 hi, i64 tid)`` for the (sample, group) blocks [lo, hi); ``params`` holds the addresses
    of ``_SLOTS``; thread ``tid`` uses ``scratch`` floats at ``t + tid * scratch`` (a
    zero-bordered plane per channel of a group, then one plane of window sums), whose borders
    nothing writes."""
    from .group_norm import Emitter, statistics_ir

    ph, pw = kh // 2, kw // 2
    wp = w + 2 * pw
    hw = h * w
    plane = (h + 2 * ph) * wp + kw - 1     # a zero-bordered plane and the sums' overreach
    if (channels_last or out_channels_last) and groups != 1:
        raise ValueError("pool_mixer_ir: a channels-last x or result needs one group")
    cs, ps = (1, cg) if channels_last else (hw, 1)   # x's strides: channel, position
    ocs, ops = (1, cg) if out_channels_last else (hw, 1)   # the result's
    e = Emitter(lanes)
    a, L, vt = e.a, lanes, e.vt
    a(f"declare float @llvm.vector.reduce.fadd.v{L}f32(float, {vt})")
    a("declare float @llvm.sqrt.f32(float)")
    a(f"define void @{name}(ptr noalias %pp, i64 %lo, i64 %hi, i64 %tid) nounwind {{")
    a("entry:")
    for i, p in enumerate(_SLOTS):
        a(f"  %{p}.p = getelementptr inbounds i64, ptr %pp, i64 {i}")
        a(f"  %{p}.i = load i64, ptr %{p}.p, align 8")
        a(f"  %{p} = inttoptr i64 %{p}.i to ptr")
    a(f"  %to = mul i64 %tid, {scratch}")
    a("  %tp = getelementptr inbounds float, ptr %t, i64 %to")
    a(f"  %sp = getelementptr inbounds float, ptr %tp, i64 {cg * plane}")
    a("  %empty = icmp sge i64 %lo, %hi")
    a("  br i1 %empty, label %exit, label %blk")
    a("blk:")
    a("  %i = phi i64 [ %lo, %entry ], [ %i.next, %blkend ]")
    a(f"  %base = mul i64 %i, {cg * hw}")
    a("  %xb = getelementptr inbounds float, ptr %x, i64 %base")
    a("  %yb = getelementptr inbounds float, ptr %y, i64 %base")
    a(f"  %grp = urem i64 %i, {groups}")
    a(f"  %c0 = mul i64 %grp, {cg}")
    a("  br label %s1")
    a("s1:")
    statistics_ir(e, cg * hw, eps)

    def normalize(c: str, _acc: str | None) -> None:
        a(f"  %chn = add i64 %c0, {c}")
        a(f"  %co = mul i64 {c}, {hw}")
        a(f"  %tco = mul i64 {c}, {plane}")
        a(f"  %xco = mul i64 {c}, {cs}")
        a("  %xc = getelementptr inbounds float, ptr %xb, i64 %xco")
        a("  %tpc = getelementptr inbounds float, ptr %tp, i64 %tco")
        for p in ("w", "b"):
            a(f"  %{p}cp = getelementptr inbounds float, ptr %{p}, i64 %chn")
            a(f"  %{p}c = load float, ptr %{p}cp, align 4")
        a("  br label %nz")
        a("nz:")
        _normalize_ir(e, h, w, wp, ph, pw, ps)
        a("  br label %nzend")
        a("nzend:")

    def mix(c: str, _acc: str | None) -> None:
        a(f"  %chd = add i64 %c0, {c}")
        a(f"  %do = mul i64 {c}, {ocs}")
        a(f"  %tdo = mul i64 {c}, {plane}")
        a(f"  %xdo = mul i64 {c}, {cs}")
        a("  %xd = getelementptr inbounds float, ptr %xb, i64 %xdo")
        a("  %oc = getelementptr inbounds float, ptr %yb, i64 %do")
        a("  %tpd = getelementptr inbounds float, ptr %tp, i64 %tdo")
        a("  %scp = getelementptr inbounds float, ptr %s, i64 %chd")
        a("  %sc = load float, ptr %scp, align 4")
        a("  br label %ws0")
        a("ws0:")
        _window_sums_ir(e, h * wp, wp, kh, kw)
        a("  br label %mx0")
        a("mx0:")
        _mix_ir(e, h, w, wp, ph, pw, ps, ops)
        a("  br label %chend")
        a("chend:")

    # Every channel's plane first, then the sums and the result: a plane is read back long after
    # its scalar stores, not while they wait to retire (a wide load cannot take them forwarded).
    e.loop("nch", "s3", str(cg), 1, None, normalize)
    a("  br label %s4")
    a("s4:")
    e.loop("ch", "s4", str(cg), 1, None, mix)
    a("  br label %blkend")
    a("blkend:")
    a("  %i.next = add i64 %i, 1")
    a("  %more = icmp slt i64 %i.next, %hi")
    a("  br i1 %more, label %blk, label %exit")
    a("exit:")
    a("  ret void")
    a("}")
    return "\n".join(e.out) + "\n"


# Blocks are split across threads from this many elements on (as group_norm.py's).
PARALLEL_MIN_ELEMENTS = 1 << 17


class PreparedPoolMixer:
    """One pool_mixer node's generated kernel: ``__call__(x, w, b, s)`` returns the mixer's
    result. A channels-last x is read as it is with one group (a kernel of its own, made at its
    first such call) and gives a channels-last result (what the block's norm and convolutions
    after it read without a copy); any other layout is copied to contiguous first and gives a
    contiguous NCHW result."""

    def __init__(self, shape: tuple, groups: int, eps: float, kernel: tuple, include_pad: bool) -> None:
        from .cnn_blocks import window_counts

        self.shape, self.groups, self.eps, self.kernel = tuple(shape), groups, eps, tuple(kernel)
        n, c, h, w = self.shape
        kh, kw = kernel
        wp = w + kw - 1
        need = c // groups * ((h + kh - 1) * wp + kw - 1) + h * wp
        self.scratch_floats = need + (-need) % 16
        self.fns: dict[bool, Any] = {False: self._compiled(False)}
        self.view: tuple[Any, Any] | None = None   # (a given buffer, its channels-last view)
        counts = window_counts((h, w), (h, w), (kh, kw), (1, 1), (kh // 2, kw // 2), include_pad)
        self.counts = torch.from_numpy(np.ascontiguousarray(counts, dtype=np.float32))
        self.blocks = n * groups
        self.parallel = self.blocks > 1 and math.prod(self.shape) >= PARALLEL_MIN_ELEMENTS
        self.threads = max(1, torch.get_num_threads()) if self.parallel else 1
        self.scratch = torch.zeros(self.threads * self.scratch_floats, dtype=torch.float32)
        self.params = (ctypes.c_int64 * len(_SLOTS))()

    def _compiled(self, channels_last: bool) -> Any:
        """The kernel reading x and writing the result in NCHW or channels-last memory (cached
        per process and on disk)."""
        from .group_norm import f32_hex
        from .jit import range_kernel
        from .lowering import vector_width

        _, c, h, w = self.shape
        kh, kw = self.kernel
        cg, g, eps, lanes = c // self.groups, self.groups, self.eps, vector_width()
        cl = "_clo" if channels_last else ""

        def source() -> tuple[str, str]:
            name = f"pt_pool_mixer_c{cg}_h{h}_w{w}_g{g}_k{kh}x{kw}{cl}"
            return name, pool_mixer_ir(name, cg, h, w, g, eps, kh, kw, self.scratch_floats, lanes, channels_last,
                                       channels_last)

        return range_kernel(("pool_mixer", cg, h, w, g, f32_hex(eps), kh, kw, self.scratch_floats, lanes, cl),
                            source)

    def __call__(self, x: Any, w: Any, b: Any, s: Any, out: Any = None) -> Any:
        """The result, written into ``out`` where given (contiguous, of the result's shape; a
        channels-last result is written over its bytes)."""
        cl = (self.groups == 1 and not x.is_contiguous()
              and x.is_contiguous(memory_format=torch.channels_last))
        if not cl and not x.is_contiguous():
            x = x.contiguous()
        fn = self.fns.get(cl)
        if fn is None:
            fn = self.fns[cl] = self._compiled(cl)
        if out is None:
            y = torch.empty(self.shape, dtype=torch.float32,
                            memory_format=torch.channels_last if cl else torch.contiguous_format)
        elif cl:
            if self.view is None or self.view[0] is not out:
                from .arena import channels_last_over

                self.view = (out, channels_last_over(out))
            y = self.view[1]
        else:
            y = out
        vecs = [v if v.dim() == 1 and v.is_contiguous() else v.reshape(-1).contiguous() for v in (w, b, s)]
        p = self.params
        p[0], p[6] = x.data_ptr(), y.data_ptr()
        p[1], p[2], p[3] = (v.data_ptr() for v in vecs)
        p[4], p[5] = self.counts.data_ptr(), self.scratch.data_ptr()
        nt = min(torch.get_num_threads(), self.blocks, self.threads)
        if nt <= 1:
            fn(p, 0, self.blocks, 0)
        else:
            from .cpu import split_on_team

            split_on_team(fn, p, self.blocks, nt)
        return y


def takes(node: Node) -> bool:
    """Whether the generated kernel takes ``node`` (f32, a static shape, not empty)."""
    x = node.operands[0].type
    return x.dtype is f32 and all(isinstance(d, int) for d in x.shape) and x.numel > 0


def generated_for(node: Node) -> PreparedPoolMixer | None:
    """The generated kernel for a ``pool_mixer`` node, or None where it takes no such node
    (``takes``) or no code can be generated here."""
    x = node.operands[0].type
    if not takes(node):
        return None
    try:
        return PreparedPoolMixer(tuple(x.shape), int(node.attrs["groups"]), float(node.attrs["eps"]),
                                 tuple(node.attrs["kernel"]), bool(node.attrs["count_include_pad"]))
    except Exception as e:  # no code generator here, or it failed: ATen runs the node
        import warnings

        warnings.warn(f"partita: the generated pool_mixer at {node.loc} did not compile ({e}); ATen runs it",
                      RuntimeWarning, stacklevel=2)
        return None


def pool_mixer_kernel(node: Node, inplace: bool = False, outs: list | None = None) -> Any:
    """The step running a ``pool_mixer`` node: the generated kernel or ATen's ops in turn,
    whichever measured faster at the node's first call (codegen/choose.py; the generated kernel
    where measuring is off). ``outs``: the memory plan's buffer for the result (or None), which
    the step writes at every call."""
    del inplace
    gen = generated_for(node)
    attrs = dict(node.attrs)
    out = None if outs is None else outs[0]
    picked: list[str] = []

    def run_aten(args: list) -> Any:
        r = _torch(args, attrs)
        return r if out is None else out.copy_(r)

    to_caller = node.results[0].is_output   # a result the caller gets back is contiguous

    def run_gen(args: list) -> Any:
        assert gen is not None
        y = gen(args[0], args[1], args[2], args[3], out=out)
        return y.contiguous() if to_caller else y

    def step(args: list, _attrs: dict) -> Any:
        if gen is None or not args[0].is_cpu:
            return run_aten(args)
        if not picked:
            from .choose import choose

            x = args[0]
            layout = "nchw" if x.is_contiguous() else "other"
            key = (f"pool_mixer x {tuple(x.shape)} {layout} groups {attrs['groups']} kernel "
                   f"{tuple(attrs['kernel'])} pad {attrs['count_include_pad']}")
            picked.append(choose(key, {"generated": lambda: run_gen(args), "aten": lambda: run_aten(args)},
                                 where=f"pool_mixer at {node.loc}", default="generated", node=node))
        return run_gen(args) if picked[0] == "generated" else run_aten(args)
    return step
