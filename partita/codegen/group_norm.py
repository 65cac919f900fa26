"""GroupNorm as one step: the ``group_norm`` op, its matcher and its kernel.

Both importers write ``native_group_norm`` out in ops (frontend/torch_export.py's
``_group_norm``, which the FX path shares), and so does torch.export's decomposition:

    %g = reshape(%x) {shape=[N, G, M]}              M = C / G * H * W
    %m = mean(%g) {axes=[2], keepdim}
    %d = sub(%g, %m)
    %v = mean(mul(%d, %d)) {axes=[2], keepdim}
    %r = rsqrt(add(%v, eps))
    %y = reshape(mul(%d, %r)) {shape=x's}
    %y = add(mul(%y, w[1,C,1,1]), b[1,C,1,1])       (optional)
    %y = relu(%y)                                    (optional: one of epilogue.UNARY)

That is five to six steps on ATen and fused kernels, and on a channels-last input the first
reshape is a copy. ``fuse_group_norm`` (an anchor of fuse-library on ``mean``, beside
``norm.fuse_rms_norm``) rewrites it into

    %y = group_norm(%x, %w, %b) {groups=G, eps=1e-05, unary="relu"}

whose reference is the pattern's ops' references one after another (so the rewrite is bit for
bit on the reference interpreter) and whose torch implementation is ATen's
``F.group_norm`` followed by the activation. Weight and bias are [C], or [1, C, 1, ...] /
[C, 1, ...] as they arrive once freezing has folded their reshapes into params.

The step (``group_norm_kernel``) has two candidates, measured at the node's first call
(codegen/choose.py): the generated kernel (``group_norm_ir``: f32, contiguous NCHW, affine or
not, ReLU or no activation; per (sample, group) block of C / G * H * W elements the sum, the
mean, the squared deviations about it in a second pass while the block is in L1, then per
channel ((x - mean) * rstd) * w + b and the ReLU) and ATen's group norm with the activation in
place. A channels-last input is copied to contiguous first by both.
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
from .epilogue import UNARY

__all__ = ["fuse_group_norm", "fuse_mean", "group_norm_kernel", "GROUP_NORM_UNARY", "Emitter", "statistics_ir",
           "f32_hex"]

# The activations group_norm applies after its affine part (epilogue.UNARY's).
GROUP_NORM_UNARY = tuple(UNARY)


# --- the op ----------------------------------------------------------------------------------

def _infer(ts: list, attrs: dict) -> Any:
    x = ts[0]
    g = attrs["groups"]
    if x.rank < 2:
        raise TypeRuleError(f"group_norm: x must be [N, C, ...], got {x}")
    c = x.shape[1]
    if g < 1 or c % g:
        raise TypeRuleError(f"group_norm: groups={g} must divide the {c} channels of {x}")
    per_c = (1, c) + (1,) * (x.rank - 2)
    for t in ts[1:]:
        if t.shape not in ((c,), per_c, per_c[1:]) or t.dtype != x.dtype:
            raise TypeRuleError(f"group_norm: weight and bias must be [{c}] (or {list(per_c)}, {list(per_c[1:])}) "
                                f"of {x.dtype}, got {t}")
    if not x.dtype.is_float:
        raise TypeRuleError(f"group_norm: x must be a float tensor, got {x}")
    return x


def _step(op: str, args: list, attrs: dict, dtype: Any) -> np.ndarray:
    """One op's reference, rounded to ``dtype`` as the interpreter rounds after each node."""
    with np.errstate(all="ignore"):
        r = np.asarray(OPS[op].reference(args, attrs))
    return r if r.dtype == dtype else r.astype(dtype)


def _reference(args: list, attrs: dict) -> np.ndarray:
    x = np.asarray(args[0])
    dt, shape = x.dtype, x.shape
    n, c, g = shape[0], shape[1], attrs["groups"]
    gx = x.reshape(n, g, -1)
    mean = _step("mean", [gx], {"axes": (2,), "keepdim": True}, dt)
    d = _step("sub", [gx, mean], {}, dt)
    var = _step("mean", [_step("mul", [d, d], {}, dt)], {"axes": (2,), "keepdim": True}, dt)
    r = _step("rsqrt", [_step("add", [var, np.asarray(attrs["eps"], dtype=dt)], {}, dt)], {}, dt)
    y = _step("mul", [d, r], {}, dt).reshape(shape)
    per_c = (1, c) + (1,) * (len(shape) - 2)
    if len(args) > 1:
        y = _step("mul", [y, np.asarray(args[1]).reshape(per_c)], {}, dt)
    if len(args) > 2:
        y = _step("add", [y, np.asarray(args[2]).reshape(per_c)], {}, dt)
    u = UNARY[attrs["unary"]]
    if u is not None:
        y = _step(u.op, [y], dict(u.attrs), dt)
    return y


def _unary_inplace(kind: str) -> Callable[[Any], Any] | None:
    """The in-place torch form of an epilogue (None for "none")."""
    u = UNARY[kind]
    if u is None:
        return None
    if u.op == "gelu":
        approx = u.attrs.get("approximate", "none")
        return lambda y: y.copy_(torch.nn.functional.gelu(y, approximate=approx))
    return {"relu": torch.relu_, "silu": lambda y: torch.nn.functional.silu(y, inplace=True),
            "sigmoid": torch.sigmoid_, "tanh": torch.tanh_}[u.op]


def _torch(args: list, attrs: dict) -> Any:
    x = args[0]
    w = args[1].reshape(-1) if len(args) > 1 else None
    b = args[2].reshape(-1) if len(args) > 2 else None
    y = torch.nn.functional.group_norm(x, attrs["groups"], w, b, attrs["eps"])
    act = _unary_inplace(attrs["unary"])
    return y if act is None else act(y)


def _cost(ins: list, outs: list, attrs: dict) -> Cost:
    n = ins[0].numel
    return Cost(n * 10, sum(t.nbytes for t in ins), outs[0].nbytes)


register(OpDef(
    name="group_norm", operands=("x", "weight?", "bias?"),
    attrs=(AttrSpec("groups", "int"), AttrSpec("eps", "float", 1e-5),
           AttrSpec("unary", "str", "none", choices=GROUP_NORM_UNARY)),
    infer=_infer, reference=_reference, torch=_torch, cost=_cost,
    doc="GroupNorm of x [N, C, ...]: per sample and group of C / groups channels, (x - mean) / "
        "sqrt(var + eps) (var the mean of the squared deviations), then * weight[C] and + bias[C], "
        "then the activation ``unary``. Made by fuse-library from the ops the importers write "
        "(codegen/group_norm.py); inference.",
))


# --- the rewrite -----------------------------------------------------------------------------

def _live_users(v: Value) -> list[Node]:
    """The nodes reading ``v`` whose results something reads (a dead reshape of the mean, left
    by the importer for native_group_norm's second result, does not count)."""
    return [u for u in v.users if any(r.has_uses for r in u.results)]


def _only(v: Value, op: str) -> Node | None:
    """The one live reader of ``v`` when it is an ``op`` and ``v`` is no graph output."""
    users = _live_users(v)
    if v.is_output or len(users) != 1 or users[0].op != op or v.users.get(users[0], 0) != 1:
        return None
    return users[0]


def _other(node: Node, v: Value) -> Value | None:
    """The operand of the binary ``node`` that is not ``v``."""
    a, b = node.operands
    return b if a is v and b is not v else a if b is v and a is not v else None


def _scalar(v: Value | None) -> float | None:
    from ..passes.rewrite import splat_value

    if v is None or v.type.numel != 1:
        return None
    s = splat_value(v)
    return None if s is None or isinstance(s, bool) else float(s)


def _per_channel(v: Value | None, shape: tuple) -> bool:
    """Whether ``v`` is a [1, C, 1, ...] or [C, 1, ...] value (one number per channel)."""
    if v is None or v.type.dtype is not f32:
        return False
    want = (1, shape[1]) + (1,) * (len(shape) - 2)
    return v.type.shape in (want, want[1:])


def _statistics(node: Node) -> tuple[Value, int, float, Node] | None:
    """(x, groups, eps, the mul by rstd) of the pattern's statistics part from its first mean."""
    g = node.operands[0]
    rs = g.producer
    if rs is None or rs.op != "reshape" or g.type.rank != 3 or not node.attrs.get("keepdim"):
        return None
    if [a % 3 for a in node.attrs["axes"]] != [2]:
        return None
    x = rs.operands[0]
    if x.type.dtype is not f32 or x.type.rank < 2 or x.type.shape[0] != g.type.shape[0]:
        return None
    groups = g.type.shape[1]
    if x.type.shape[1] % groups or g.type.numel != x.type.numel:
        return None
    sub = _only(node.results[0], "sub")
    if sub is None or sub.operands[0] is not g or sub.operands[1] is not node.results[0]:
        return None
    d = sub.results[0]
    users = _live_users(d)
    sq = next((u for u in users if u.op == "mul" and u.operands[0] is d and u.operands[1] is d), None)
    scale = next((u for u in users if u.op == "mul" and u is not sq), None)
    if sq is None or scale is None or len(users) != 2 or d.is_output:
        return None
    m2 = _only(sq.results[0], "mean")
    if m2 is None or m2.attrs["axes"] != node.attrs["axes"] or not m2.attrs.get("keepdim"):
        return None
    add = _only(m2.results[0], "add")
    eps = None if add is None else _scalar(_other(add, m2.results[0]))
    if add is None or eps is None:
        return None
    rsq = _only(add.results[0], "rsqrt")
    if rsq is None or _only(rsq.results[0], "mul") is not scale or _other(scale, rsq.results[0]) is not d:
        return None
    return x, groups, eps, scale


def _affine(x: Value, y: Value) -> tuple[Value | None, Value | None, Value, list[Node]]:
    """(weight, bias, the last value, the nodes) of the per-channel mul and add after ``y``."""
    w = b = None
    taken: list[Node] = []
    mul = _only(y, "mul")
    if mul is not None and _per_channel(_other(mul, y), x.type.shape) and mul.results[0].type == x.type:
        w, y = _other(mul, y), mul.results[0]
        taken.append(mul)
        add = _only(y, "add")
        if add is not None and _per_channel(_other(add, y), x.type.shape) and add.results[0].type == x.type:
            b, y = _other(add, y), add.results[0]
            taken.append(add)
    return w, b, y, taken


def _as_channels(v: Value) -> Value:
    """``v`` (per channel): its [C] source where it is a reshape of one, else ``v`` itself (the
    op takes [C], [1, C, 1, ...] and [C, 1, ...]; a folded param is one of the last two)."""
    c = v.type.numel
    p = v.producer
    if p is not None and p.op in ("reshape", "unsqueeze") and p.operands[0].type.shape == (c,):
        return p.operands[0]
    return v


def _unary_kind(node: Node) -> str | None:
    """The ``epilogue.UNARY`` kind a node stands for, or None."""
    for kind, u in UNARY.items():
        if u is not None and u.op == node.op and all(node.attrs.get(k) == v for k, v in u.attrs.items()):
            return kind
    return None


def fuse_group_norm(graph: Graph, node: Node) -> Node | None:
    """The written-out GroupNorm from its first ``mean`` (the module doc) into ``group_norm``,
    with the per-channel affine part and an activation after it; None where it does not apply."""
    found = _statistics(node)
    if found is None:
        return None
    x, groups, eps, scale = found
    back = _only(scale.results[0], "reshape")
    if back is None or back.results[0].type != x.type:
        return None
    w, b, y, taken = _affine(x, back.results[0])
    if b is not None and w is None:
        return None
    unary = "none"
    readers = _live_users(y)
    if len(readers) == 1 and not y.is_output and readers[0].results[0].type == x.type:
        kind = _unary_kind(readers[0])
        if kind is not None and len(readers[0].operands) == 1:
            unary, y = kind, readers[0].results[0]
            taken.append(readers[0])
    last = y.producer
    assert last is not None
    operands = [x] + [_as_channels(v) for v in (w, b) if v is not None]
    if any(v.producer is not None and not v.producer.is_before(last) for v in operands):
        return None
    new = Node("group_norm", operands, OPS["group_norm"].normalize_attrs(
        {"groups": groups, "eps": eps, "unary": unary}), [x.type], last.loc)
    graph.insert_before(last, new)
    graph.replace_all_uses(y, new.results[0])
    from ..passes.rewrite import erase_if_dead

    for v in (node.results[0], scale.operands[0], scale.operands[1]):   # the importer's dead reshapes
        for u in [u for u in v.users if u not in _live_users(v)]:
            erase_if_dead(graph, u)
    erase_if_dead(graph, last)
    return new


def fuse_mean(graph: Graph, node: Node) -> Node | None:
    """fuse-library's anchor on ``mean``: RMSNorm (norm.fuse_rms_norm), else GroupNorm."""
    from .norm import fuse_rms_norm

    return fuse_rms_norm(graph, node) or fuse_group_norm(graph, node)


# --- the step --------------------------------------------------------------------------------

def group_norm_kernel(node: Node, inplace: bool = False) -> Callable | None:
    """The step running a ``group_norm`` node: the generated kernel (``generated_for``) or ATen's
    group norm on the tensor as it comes, with the activation in place, whichever measured
    faster at the node's first call (codegen/choose.py; the generated kernel where measuring is
    off or it is the only one)."""
    del inplace
    groups, eps = int(node.attrs["groups"]), float(node.attrs["eps"])
    act = _unary_inplace(node.attrs["unary"])
    gn = torch.nn.functional.group_norm
    gen = generated_for(node)
    picked: list[str] = []

    def run_aten(args: list) -> Any:
        x = args[0].contiguous()
        w = args[1].reshape(-1) if len(args) > 1 else None
        b = args[2].reshape(-1) if len(args) > 2 else None
        y = gn(x, groups, w, b, eps)
        return y if act is None else act(y)

    def run_gen(args: list) -> Any:
        assert gen is not None
        return gen(*args)

    def step(args: list, attrs: dict) -> Any:
        if gen is None or not args[0].is_cpu:
            return run_aten(args)
        if not picked:
            from .choose import choose

            x = args[0]
            layout = "nchw" if x.is_contiguous() else "other"
            key = f"group_norm x {tuple(x.shape)} {layout} groups {groups} {node.attrs['unary']} affine {len(args) > 1}"
            picked.append(choose(key, {"generated": lambda: run_gen(args), "aten": lambda: run_aten(args)},
                                 where=f"group_norm at {node.loc}", default="generated", node=node))
        return run_gen(args) if picked[0] == "generated" else run_aten(args)
    return step


# --- the generated kernel --------------------------------------------------------------------

def f32_hex(x: float) -> str:
    """An f32 constant as LLVM writes it (the double with the same value, in hex)."""
    import struct

    f = struct.unpack("<f", struct.pack("<f", x))[0]
    return "0x%016X" % struct.unpack("<Q", struct.pack("<d", f))[0]


class Emitter:
    """LLVM IR of counted loops, written line by line."""

    def __init__(self, lanes: int) -> None:
        self.out: list[str] = []
        self.L, self.vt = lanes, f"<{lanes} x float>"

    def a(self, line: str) -> None:
        """Append one line."""
        self.out.append(line)

    def load(self, ptr: str, off: str, ty: str, tag: str) -> str:
        """``%tag``: the ``ty`` at element ``off`` of ``ptr``."""
        self.a(f"  %{tag}.p = getelementptr inbounds float, ptr {ptr}, i64 {off}")
        self.a(f"  %{tag} = load {ty}, ptr %{tag}.p, align 4")
        return f"%{tag}"

    def loop(self, tag: str, start: str, count: str, step: int, acc: str | None,
             body: Callable[[str, str | None], str | None]) -> str | None:
        """for j = 0; j < count; j += step (``count`` a multiple of ``step``), from the block
        ``start``; ``acc`` the type of an accumulator starting at zero (or None), which
        ``body(j, acc)`` returns updated. The value after the loop (None without one)."""
        a = self.a
        zero = "zeroinitializer" if acc and acc.startswith("<") else "0.0"
        a(f"  %{tag}.go = icmp sgt i64 {count}, 0")
        a(f"  br i1 %{tag}.go, label %{tag}, label %{tag}.x")
        a(f"{tag}:")
        a(f"  %{tag}.j = phi i64 [ 0, %{start} ], [ %{tag}.jn, %{tag}.end ]")
        at = len(self.out)
        if acc:
            a("")                                 # the accumulator's phi, once the body is written
        nxt = body(f"%{tag}.j", f"%{tag}.a" if acc else None)
        if acc:
            self.out[at] = f"  %{tag}.a = phi {acc} [ {zero}, %{start} ], [ {nxt}, %{tag}.end ]"
        a(f"  br label %{tag}.end")
        a(f"{tag}.end:")
        a(f"  %{tag}.jn = add i64 %{tag}.j, {step}")
        a(f"  %{tag}.c = icmp slt i64 %{tag}.jn, {count}")
        a(f"  br i1 %{tag}.c, label %{tag}, label %{tag}.x")
        a(f"{tag}.x:")
        if acc:
            a(f"  %{tag}.r = phi {acc} [ {zero}, %{start} ], [ {nxt}, %{tag}.end ]")
            return f"%{tag}.r"
        return None


def statistics_ir(e: "Emitter", m: int, eps: float) -> None:
    """Passes 1 and 2 over a block of ``m`` elements at ``%xb`` (from the block ``s1``): the mean
    (``%mean``, ``%meanv``) and 1 / sqrt(var + eps) (``%rstd``, ``%rstdv``); ends in block ``s3``."""
    a, L, vt, load = e.a, e.L, e.vt, e.load
    mv = m - m % L

    def add_to(tag: str, ty: str) -> Callable[[str, str | None], str]:
        def body(j: str, acc: str | None) -> str:
            v = load("%xb", j, ty, f"{tag}.v")
            a(f"  %{tag}.s = fadd reassoc {ty} {acc}, {v}")
            return f"%{tag}.s"
        return body

    sv = e.loop("p1v", "s1", str(mv), L, vt, add_to("p1v", vt))
    a("  br label %s1t")
    a("s1t:")
    a(f"  %xt1 = getelementptr inbounds float, ptr %xb, i64 {mv}")

    def tail_add(j: str, acc: str | None) -> str:
        v = load("%xt1", j, "float", "p1t.v")
        a(f"  %p1t.s = fadd reassoc float {acc}, {v}")
        return "%p1t.s"

    st = e.loop("p1t", "s1t", str(m - mv), 1, "float", tail_add)
    a(f"  %sum = call reassoc float @llvm.vector.reduce.fadd.v{L}f32(float {st}, {vt} {sv})")
    a(f"  %mean = fmul float %sum, {f32_hex(1.0 / m)}")
    a(f"  %mean.0 = insertelement <1 x float> poison, float %mean, i64 0")
    a(f"  %meanv = shufflevector <1 x float> %mean.0, <1 x float> poison, <{L} x i32> zeroinitializer")
    a("  br label %s2")
    a("s2:")

    def dev(tag: str, ty: str, base: str, meanx: str) -> Callable[[str, str | None], str]:
        def body(j: str, acc: str | None) -> str:
            v = load(base, j, ty, f"{tag}.v")
            a(f"  %{tag}.d = fsub {ty} {v}, {meanx}")
            a(f"  %{tag}.dd = fmul {ty} %{tag}.d, %{tag}.d")
            a(f"  %{tag}.s = fadd reassoc {ty} {acc}, %{tag}.dd")
            return f"%{tag}.s"
        return body

    dv = e.loop("p2v", "s2", str(mv), L, vt, dev("p2v", vt, "%xb", "%meanv"))
    a("  br label %s2t")
    a("s2t:")
    dt = e.loop("p2t", "s2t", str(m - mv), 1, "float", dev("p2t", "float", "%xt1", "%mean"))
    a(f"  %ssd = call reassoc float @llvm.vector.reduce.fadd.v{L}f32(float {dt}, {vt} {dv})")
    a(f"  %var = fmul float %ssd, {f32_hex(1.0 / m)}")
    a(f"  %ve = fadd float %var, {f32_hex(eps)}")
    a("  %sd = call float @llvm.sqrt.f32(float %ve)")
    a("  %rstd = fdiv float 1.0, %sd")
    a("  %rstd.0 = insertelement <1 x float> poison, float %rstd, i64 0")
    a(f"  %rstdv = shufflevector <1 x float> %rstd.0, <1 x float> poison, <{L} x i32> zeroinitializer")
    a("  br label %s3")
    a("s3:")

def _scale_ir(e: "Emitter", cg: int, hw: int, affine: bool, relu: bool) -> None:
    """Pass 3 (from the block ``s3``): per channel of the group, ((x - mean) * rstd) * w + b and
    the ReLU, stored at ``%yb``."""
    a, L, vt, load = e.a, e.L, e.vt, e.load
    hv = hw - hw % L

    def channel(c: str, _acc: str | None) -> None:
        a("  %ch = add i64 %c0, " + c)
        a(f"  %co = mul i64 {c}, {hw}")
        a("  %xc = getelementptr inbounds float, ptr %xb, i64 %co")
        a("  %yc = getelementptr inbounds float, ptr %yb, i64 %co")
        if affine:
            a("  %wcp = getelementptr inbounds float, ptr %w, i64 %ch")
            a("  %bcp = getelementptr inbounds float, ptr %b, i64 %ch")
            a("  %wc = load float, ptr %wcp, align 4")
            a("  %bc = load float, ptr %bcp, align 4")
            a("  %wc.0 = insertelement <1 x float> poison, float %wc, i64 0")
            a(f"  %wcv = shufflevector <1 x float> %wc.0, <1 x float> poison, <{L} x i32> zeroinitializer")
            a("  %bc.0 = insertelement <1 x float> poison, float %bc, i64 0")
            a(f"  %bcv = shufflevector <1 x float> %bc.0, <1 x float> poison, <{L} x i32> zeroinitializer")
        a("  br label %s3v")
        a("s3v:")

        def store(tag: str, ty: str, xs: str, ys: str, sfx: str) -> Callable[[str, str | None], None]:
            def body(j: str, _a: str | None) -> None:
                v = load(xs, j, ty, f"{tag}.v")
                a(f"  %{tag}.d = fsub {ty} {v}, %mean{sfx}")
                a(f"  %{tag}.n = fmul {ty} %{tag}.d, %rstd{sfx}")
                r = f"%{tag}.n"
                if affine:
                    a(f"  %{tag}.w = fmul {ty} {r}, %wc{sfx}")
                    a(f"  %{tag}.b = fadd {ty} %{tag}.w, %bc{sfx}")
                    r = f"%{tag}.b"
                if relu:   # x < 0 ? 0 : x, so that NaN stays NaN as in torch.relu
                    zero = "zeroinitializer" if ty == vt else "0.0"
                    a(f"  %{tag}.lt = fcmp olt {ty} {r}, {zero}")
                    a(f"  %{tag}.r = select {'<%d x i1>' % L if ty == vt else 'i1'} %{tag}.lt, {ty} {zero}, {ty} {r}")
                    r = f"%{tag}.r"
                a(f"  %{tag}.yp = getelementptr inbounds float, ptr {ys}, i64 {j}")
                a(f"  store {ty} {r}, ptr %{tag}.yp, align 4")
            return body

        e.loop("p3v", "s3v", str(hv), L, None, store("p3v", vt, "%xc", "%yc", "v"))
        a("  br label %s3t")
        a("s3t:")
        a(f"  %xct = getelementptr inbounds float, ptr %xc, i64 {hv}")
        a(f"  %yct = getelementptr inbounds float, ptr %yc, i64 {hv}")
        e.loop("p3t", "s3t", str(hw - hv), 1, None, store("p3t", "float", "%xct", "%yct", ""))
        a("  br label %chend")
        a("chend:")
        return None

    e.loop("p3c", "s3", str(cg), 1, None, channel)


def group_norm_ir(name: str, m: int, cg: int, hw: int, groups: int, eps: float, affine: bool, relu: bool,
                  lanes: int) -> str:
    """The LLVM IR of a GroupNorm over contiguous NCHW f32 memory: ``void NAME(ptr params, i64
    lo, i64 hi, i64 tid)`` for the (sample, group) blocks [lo, hi) of ``m = cg * hw`` elements;
    ``params`` holds the addresses of x, weight, bias and y. Per block: the sum, the mean, the
    sum of squared deviations about it (two passes, as the reference), 1 / sqrt(var + eps);
    then per channel ((x - mean) * rstd) * w + b, and ReLU where ``relu``."""
    e = Emitter(lanes)
    a, L, vt = e.a, lanes, e.vt
    a(f"declare float @llvm.vector.reduce.fadd.v{L}f32(float, {vt})")
    a("declare float @llvm.sqrt.f32(float)")
    a(f"define void @{name}(ptr noalias %pp, i64 %lo, i64 %hi, i64 %tid) nounwind {{")
    a("entry:")
    for i, p in enumerate(("x", "w", "b", "y")):
        a(f"  %{p}.p = getelementptr inbounds i64, ptr %pp, i64 {i}")
        a(f"  %{p}.i = load i64, ptr %{p}.p, align 8")
        a(f"  %{p} = inttoptr i64 %{p}.i to ptr")
    a("  %empty = icmp sge i64 %lo, %hi")
    a("  br i1 %empty, label %exit, label %blk")
    a("blk:")
    a("  %i = phi i64 [ %lo, %entry ], [ %i.next, %blkend ]")
    a(f"  %base = mul i64 %i, {m}")
    a("  %xb = getelementptr inbounds float, ptr %x, i64 %base")
    a("  %yb = getelementptr inbounds float, ptr %y, i64 %base")
    a(f"  %grp = urem i64 %i, {groups}")
    a(f"  %c0 = mul i64 %grp, {cg}")
    a("  br label %s1")
    a("s1:")
    statistics_ir(e, m, eps)
    _scale_ir(e, cg, hw, affine, relu)
    a("  br label %blkend")
    a("blkend:")
    a("  %i.next = add i64 %i, 1")
    a("  %more = icmp slt i64 %i.next, %hi")
    a("  br i1 %more, label %blk, label %exit")
    a("exit:")
    a("  ret void")
    a("}")
    return "\n".join(e.out) + "\n"


# Blocks are split across threads from this many elements on (as norm.py's rows).
PARALLEL_MIN_ELEMENTS = 1 << 17
# The activations the generated kernel applies itself (the others run on ATen).
KERNEL_UNARY = ("none", "relu")


def _compiled(shape: tuple, groups: int, eps: float, affine: bool, relu: bool) -> Any:
    """The compiled kernel of a GroupNorm of ``shape`` (cached per process and on disk)."""
    from .jit import range_kernel
    from .lowering import vector_width

    c, hw = shape[1], math.prod(shape[2:])
    cg = c // groups
    lanes = vector_width()

    def source() -> tuple[str, str]:
        name = f"pt_group_norm_c{cg}_hw{hw}_g{groups}{'_a' if affine else ''}{'_relu' if relu else ''}"
        return name, group_norm_ir(name, cg * hw, cg, hw, groups, eps, affine, relu, lanes)

    return range_kernel(("group_norm", cg, hw, groups, f32_hex(eps), affine, relu, lanes), source)


class PreparedGroupNorm:
    """One group_norm node's generated kernel: ``__call__(x, w, b)`` returns y (contiguous
    NCHW); an input in another layout is copied to contiguous first."""

    def __init__(self, shape: tuple, groups: int, eps: float, affine: bool, relu: bool) -> None:
        self.shape, self.affine = tuple(shape), affine
        self.blocks = shape[0] * groups
        self.fn = _compiled(self.shape, groups, eps, affine, relu)
        self.parallel = self.blocks > 1 and math.prod(self.shape) >= PARALLEL_MIN_ELEMENTS
        self.params = (ctypes.c_int64 * 4)()

    def __call__(self, x: Any, w: Any = None, b: Any = None) -> Any:
        x = x if x.is_contiguous() else x.contiguous()
        y = torch.empty(self.shape, dtype=torch.float32)
        p = self.params
        p[0], p[3] = x.data_ptr(), y.data_ptr()
        if self.affine:
            w = w if w.dim() == 1 and w.is_contiguous() else w.reshape(-1).contiguous()
            b = b if b.dim() == 1 and b.is_contiguous() else b.reshape(-1).contiguous()
            p[1], p[2] = w.data_ptr(), b.data_ptr()
        nt = min(torch.get_num_threads(), self.blocks) if self.parallel else 1
        if nt <= 1:
            self.fn(p, 0, self.blocks, 0)
        else:
            from .cpu import split_on_team

            split_on_team(self.fn, p, self.blocks, nt)
        return y


def generated_for(node: Node) -> PreparedGroupNorm | None:
    """The generated kernel for a ``group_norm`` node, or None where it takes no such node (not
    f32, a dynamic or empty shape, weight without bias, an activation other than ReLU) or no code
    can be generated here."""
    x = node.operands[0].type
    if x.dtype is not f32 or any(not isinstance(d, int) for d in x.shape) or x.numel == 0:
        return None
    if node.attrs["unary"] not in KERNEL_UNARY or len(node.operands) == 2:
        return None
    try:
        return PreparedGroupNorm(tuple(x.shape), int(node.attrs["groups"]), float(node.attrs["eps"]),
                                 len(node.operands) == 3, node.attrs["unary"] == "relu")
    except Exception as e:  # no code generator here, or it failed: ATen runs the node
        import warnings

        warnings.warn(f"partita: the generated group_norm did not compile ({e}); ATen runs it",
                      RuntimeWarning, stacklevel=2)
        return None
