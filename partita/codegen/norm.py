"""Generated layer norm and RMS norm, with the residual add before them: ``add_norm``.

A transformer block normalizes the residual stream right after adding to it:

    %h2 = add(%h, %attn_out)
    %y  = layer_norm(%h2, %g, %b)          (rms_norm(%h2, %g) in Llama-style models)

On ATen that is two kernels and two passes over memory (one thread, [148, 256]: add 7 us,
layer_norm 23 us); ONNX Runtime has SkipLayerNormalization for it. ``fuse_add_norm`` (an anchor
of the fuse-library pass) rewrites the pair into

    %y, %h2 = add_norm(%h, %attn_out, %g, %b) {kind="layer", axes=[-1], eps=1e-05}

whose second result is the sum, still there for the next residual add. The generated kernel
(``norm_ir``) does one row at a time while the row is in L1: the sum stored and accumulated,
the variance of the stored row about its mean (two passes, as the reference computes it, not
the one-pass E[x^2] - E[x]^2 that loses digits), then the scaled row. Plain ``layer_norm`` and
``rms_norm`` nodes run on the same kernel without the residual. Rows are split across the
threads only when there are enough of them to pay for it.

The rewrite applies when the add's operands have the add's type (no broadcasting: a bias or a
position table broadcast over the batch stays an add of its own), the norm reads the sum and
nothing between the add and the norm is needed first: the new node takes the add's place, so
the norm's weight and bias must be defined before it (graph inputs are).
"""

from __future__ import annotations

import ctypes
import math
import struct
import threading
from typing import Any, Callable

import numpy as np

from ..ir.diagnostics import TypeRuleError
from ..ir.dtypes import f32
from ..ir.graph import Graph, Node, Value
from ..ops._lazy import torch
from ..ops.registry import AttrSpec, Cost, OPS, OpDef, register
from .aten_fallback import op_on_aten
from ..passes.rewrite import sole_user
from .lowering import vector_width

__all__ = ["fuse_add_norm", "fuse_rms_norm", "norm_ir", "kernel_of", "kernel_source", "PreparedNorm", "norm_kernel", "supported", "f32_hex"]

KINDS = ("layer", "rms")
_NORM_OP = {"layer": "layer_norm", "rms": "rms_norm"}

# Rows are split across threads from this many elements on (a [148, 256] norm takes some
# 5 microseconds on one thread: less than handing half of it to another).
PARALLEL_MIN_ELEMENTS = 1 << 17


# --- the op ----------------------------------------------------------------------------------

def _norm_attrs(attrs: dict) -> dict:
    return {"axes": attrs["axes"], "eps": attrs["eps"]}


def _add_norm_infer(ts, attrs):
    kind = attrs["kind"]
    if len(ts) < 2:
        raise TypeRuleError("add_norm: needs x and residual (then the optional weight and bias)")
    x, r = ts[0], ts[1]
    if r != x:
        raise TypeRuleError(f"add_norm: the residual {r} must have x's type {x} (no broadcasting)")
    if kind == "rms" and len(ts) > 3:
        raise TypeRuleError("add_norm: kind=\"rms\" takes a weight but no bias")
    y = OPS[_NORM_OP[kind]].infer_types([x] + list(ts[2:]), _norm_attrs(attrs))[0]
    return [y, x]


def _add_norm_reference(args, attrs):
    x, r = args[0], args[1]
    with np.errstate(all="ignore"):
        s = np.asarray(OPS["add"].reference([x, r], {}))
    if s.dtype != np.asarray(x).dtype:
        s = s.astype(np.asarray(x).dtype)
    y = np.asarray(OPS[_NORM_OP[attrs["kind"]]].reference([s] + list(args[2:]), _norm_attrs(attrs)))
    if y.dtype != s.dtype:
        y = y.astype(s.dtype)
    return [y, s]


def _add_norm_torch(args, attrs):
    s = args[0] + args[1]
    y = OPS[_NORM_OP[attrs["kind"]]].torch([s] + list(args[2:]), _norm_attrs(attrs))
    return y, s


def _add_norm_cost(ins, outs, attrs):
    n = ins[0].numel
    return Cost(n * (9 if attrs["kind"] == "layer" else 5), sum(t.nbytes for t in ins), 2 * outs[0].nbytes)


register(OpDef(
    name="add_norm", operands=("x", "residual", "weight?", "bias?"),
    attrs=(AttrSpec("kind", "str", "layer", choices=KINDS), AttrSpec("axes", "ints", (-1,)),
           AttrSpec("eps", "float", 1e-5)),
    infer=_add_norm_infer, reference=_add_norm_reference, torch=_add_norm_torch, cost=_add_norm_cost,
    doc="(layer_norm(x + residual, weight, bias), x + residual) for kind=\"layer\", (rms_norm(x + residual, "
        "weight), x + residual) for kind=\"rms\" (no bias); axes and eps as the norm's. residual has x's "
        "type. Made by the fuse-library pass for inference (codegen/norm.py); the generated kernel adds, "
        "normalizes and scales each row while it is in L1.",
))


# --- the rewrite -----------------------------------------------------------------------------

def _inverse(p: tuple, q: tuple) -> bool:
    """Whether transposing by ``q`` then by ``p`` is the identity."""
    return len(p) == len(q) and all(q[p[i]] == i for i in range(len(p)))


def fuse_transposed_add_norm(graph: Graph, node: Node) -> Node | None:
    """``norm(transpose(add(transpose(a), transpose(b))))`` with the transposes each other's
    inverse (ConvNeXt's residual add in NCHW between two channels-last layer norms) into
    ``add_norm(a, b, ...)``: the add done where ``a`` and ``b`` already are, no transposes. The
    sum and its transpose must be read by the norm only; None where it does not apply."""
    t = node.operands[0].producer
    add = t.operands[0].producer if t is not None and t.op == "transpose" else None
    if t is None or add is None or add.op != "add" or len(add.operands) != 2 \
            or sole_user(add.results[0]) is not t or sole_user(t.results[0]) is not node:
        return None
    inner = [v.producer for v in add.operands]
    perm = tuple(t.attrs["perm"])
    if any(n is None or n.op != "transpose" or not _inverse(perm, tuple(n.attrs["perm"])) for n in inner):
        return None
    a, b = (n.operands[0] for n in inner if n is not None)
    x = node.operands[0]
    rest = list(node.operands[1:])
    if a.type != x.type or b.type != x.type or not x.type.dtype.is_float \
            or any(v.producer is not None and add.is_before(v.producer) for v in rest):
        return None
    kind = "layer" if node.op == "layer_norm" else "rms"
    attrs = {"kind": kind, "axes": node.attrs["axes"], "eps": node.attrs["eps"]}
    new = Node("add_norm", [a, b] + rest, OPS["add_norm"].normalize_attrs(attrs), [node.results[0].type, x.type],
               node.loc)
    graph.insert_before(add, new)
    graph.replace_all_uses(node.results[0], new.results[0])
    for n in [node, t, add] + [n for n in inner if n is not None]:
        if n.graph is graph and not any(r.users or r.is_output for r in n.results):
            graph.erase(n)
    return new


def fuse_add_norm(graph: Graph, node: Node) -> Node | None:
    """``layer_norm(add(a, b), ...)`` or ``rms_norm(add(a, b), ...)`` into ``add_norm`` (the module
    doc says when), also through a pair of transposes (``fuse_transposed_add_norm``); None where
    it does not apply."""
    kind = "layer" if node.op == "layer_norm" else "rms"
    s = node.operands[0]
    if s.producer is not None and s.producer.op == "transpose":
        return fuse_transposed_add_norm(graph, node)
    add = s.producer
    if add is None or add.op != "add" or len(add.operands) != 2:
        return None
    a, b = add.operands
    if a.type != s.type or b.type != s.type or not s.type.dtype.is_float:
        return None
    rest = list(node.operands[1:])
    # the weight and bias must exist where the add stands
    if any(v.producer is not None and add.is_before(v.producer) for v in rest):
        return None
    attrs = {"kind": kind, "axes": node.attrs["axes"], "eps": node.attrs["eps"]}
    new = Node("add_norm", [a, b] + rest, OPS["add_norm"].normalize_attrs(attrs),
               [node.results[0].type, s.type], node.loc)
    graph.insert_before(add, new)
    graph.replace_all_uses(node.results[0], new.results[0])
    graph.replace_all_uses(s, new.results[1])
    graph.erase(node)
    graph.erase(add)
    return new


def _other(node: Node, v) -> Any:
    """The operand of the binary ``node`` that is not ``v`` (None when neither or both are)."""
    a, b = node.operands
    if a is v and b is not v:
        return b
    if b is v and a is not v:
        return a
    return None


# Ops a weight computed from params alone may be made with and still be moved up to the norm
# (Gemma's ``1 + w``: an add of a ``full`` to the param, written after the statistics).
_HOISTABLE = frozenset({"full", "constant", "add", "sub", "mul", "cast", "reshape"})


def hoisted_before(graph: Graph, v: Value, anchor: Node, budget: int = 4) -> bool:
    """Whether ``v`` exists before ``anchor``: made there already, or made from graph inputs
    alone by at most ``budget`` pure nodes (``_HOISTABLE``), which are moved up before it."""
    p = v.producer
    if p is None or p.is_before(anchor):
        return True
    if budget <= 0 or p.op not in _HOISTABLE or len(p.results) != 1:
        return False
    if not all(hoisted_before(graph, o, anchor, budget - 1) for o in p.operands):
        return False
    graph.move_before(anchor, p)
    return True


def fuse_rms_norm(graph: Graph, node: Node) -> Node | None:
    """RMSNorm as transformers' Llama, Mistral and Qwen write it, on f32,

        w * (x * rsqrt(mean(pow(x, 2), axes=[-1], keepdim) + eps))     (w optional)

    (operands of each mul in either order, every intermediate read only on the way) into
    ``rms_norm(x, w) {eps}``, then into ``add_norm`` with the residual add before it where
    ``fuse_add_norm`` applies; ``node`` is the mean. The rms_norm's reference divides by the
    square root where the pattern multiplies by its reciprocal: the two differ by an ulp or so."""
    from ..passes.rewrite import sole_user, splat_value

    p = node.operands[0].producer
    if p is None or p.op != "pow" or splat_value(p.operands[1]) != 2 or sole_user(node.operands[0]) is not node:
        return None
    x = p.operands[0]
    if x.type.dtype is not f32 or x.type.rank < 1 or not node.attrs.get("keepdim"):
        return None
    axes = [a % x.type.rank for a in node.attrs["axes"]]
    if axes != [x.type.rank - 1]:
        return None
    add = sole_user(node.results[0])
    if add is None or add.op != "add":
        return None
    eps_v = _other(add, node.results[0])
    eps = None if eps_v is None else splat_value(eps_v)
    if eps is None or isinstance(eps, bool) or eps_v.type.numel != 1:
        return None
    rs = sole_user(add.results[0])
    if rs is None or rs.op != "rsqrt":
        return None
    m1 = sole_user(rs.results[0])
    if m1 is None or m1.op != "mul" or _other(m1, rs.results[0]) is not x or m1.results[0].type != x.type:
        return None
    last, w = m1, None
    m2 = sole_user(m1.results[0])
    if m2 is not None and m2.op == "mul":
        cand = _other(m2, m1.results[0])
        if cand is not None and cand.type.shape == (x.type.shape[-1],) and cand.type.dtype is f32 \
                and m2.results[0].type == x.type:
            last, w = m2, cand
    if w is not None and not hoisted_before(graph, w, node):
        return None  # the weight must exist where the new node goes: made before the mean, it does
    new = Node("rms_norm", [x] + ([w] if w is not None else []),
               OPS["rms_norm"].normalize_attrs({"axes": (-1,), "eps": float(eps)}), [x.type], last.loc)
    graph.insert_before(last, new)
    graph.replace_all_uses(last.results[0], new.results[0])
    for n in (last, m1) if last is not m1 else (m1,):
        if n.graph is graph:
            graph.erase(n)
    for n in (rs, add, node, p):
        graph.erase(n)
    return fuse_add_norm(graph, new) or new


# --- the kernel ------------------------------------------------------------------------------

_P = ["x", "r", "w", "b", "s", "y"]
_PACK_P = struct.Struct(f"={len(_P)}q").pack_into   # the parameter block's addresses in one write


def f32_hex(x: float) -> str:
    """An f32 constant as LLVM writes it (the double with the same value, in hex)."""
    f = struct.unpack("<f", struct.pack("<f", x))[0]
    return "0x%016X" % struct.unpack("<Q", struct.pack("<d", f))[0]


class _NormEmitter:
    """The IR of one normalization kernel, written line by line into ``out``: the row's passes
    as loops over its full vectors and straight-line tails."""

    def __init__(self, kind: str, c: int, residual: bool, weight: bool, bias: bool, lanes: int) -> None:
        self.kind, self.c, self.residual, self.weight, self.bias = kind, c, residual, weight, bias
        self.L = lanes
        self.nv, self.tail = divmod(c, lanes)
        self.vt = f"<{lanes} x float>"
        self.out: list[str] = []
        self.src = "%sr" if residual else "%xr"     # the row that is normalized
        # U vectors an iteration, each with its own accumulators: the adds of one accumulator
        # depend on each other, so several in flight hide their latency
        self.U = next(u for u in (4, 2, 1) if self.nv % u == 0) if self.nv else 1

    def a(self, line: str) -> None:
        """Append one line."""
        self.out.append(line)

    def head(self, name: str) -> None:
        """The declarations, the signature, the parameters and the row loop's head."""
        a, L, vt = self.a, self.L, self.vt
        a(f"declare float @llvm.vector.reduce.fadd.v{L}f32(float, {vt})")
        a("declare float @llvm.sqrt.f32(float)")
        a(f"define void @{name}(ptr noalias %pp, i64 %lo, i64 %hi, i64 %tid) nounwind {{")
        a("entry:")
        for i, p in enumerate(_P):
            a(f"  %{p}.p = getelementptr inbounds i64, ptr %pp, i64 {i}")
            a(f"  %{p}.i = load i64, ptr %{p}.p, align 8")
            a(f"  %{p} = inttoptr i64 %{p}.i to ptr")
        a("  %empty = icmp sge i64 %lo, %hi")
        a("  br i1 %empty, label %exit, label %row")
        a("row:")
        a("  %i = phi i64 [ %lo, %entry ], [ %i.next, %rowend ]")
        a(f"  %base = mul i64 %i, {self.c}")
        for p in ("x", "r", "s", "y"):
            if p == "r" and not self.residual or p == "s" and not self.residual:
                continue
            a(f"  %{p}r = getelementptr inbounds float, ptr %{p}, i64 %base")

    def loop(self, tag: str, body: Callable, accs: list[str]) -> list[str]:
        """A loop over the row's full vectors, U at a time, with U vector accumulators for each
        of ``accs`` (start 0); the body gets the element offset and the accumulators' current
        values and returns their next values. Returns each accumulator's total over its U
        copies (zero vectors without a vector part)."""
        a, out, L, vt, U, nv = self.a, self.out, self.L, self.vt, self.U, self.nv
        zero = "zeroinitializer"
        if nv == 0:
            return [zero] * len(accs)
        pre = f"{tag}.pre"
        a(f"  br label %{pre}")
        a(f"{pre}:")
        a(f"  br label %{tag}")
        a(f"{tag}:")
        a(f"  %{tag}.j = phi i64 [ 0, %{pre} ], [ %{tag}.jn, %{tag} ]")
        at = len(out)
        for _ in range(len(accs) * U):
            a("")                       # the accumulators' phis, written once the body is
        cur = [[f"%{tag}.a{k}u{u}" for k in range(len(accs))] for u in range(U)]
        nxt = []
        for u in range(U):
            a(f"  %{tag}.off{u} = add i64 %{tag}.j, {u * L}")
            nxt.append(body(f"%{tag}.off{u}", cur[u], vt, f"{tag}u{u}"))
        for u in range(U):
            for k in range(len(accs)):
                out[at + u * len(accs) + k] = (f"  {cur[u][k]} = phi {vt} [ {zero}, %{pre} ], "
                                               f"[ {nxt[u][k]}, %{tag} ]")
        a(f"  %{tag}.jn = add i64 %{tag}.j, {U * L}")
        a(f"  %{tag}.c = icmp ult i64 %{tag}.jn, {nv * L}")
        a(f"  br i1 %{tag}.c, label %{tag}, label %{tag}.x")
        a(f"{tag}.x:")
        totals = []
        for k in range(len(accs)):
            t = nxt[0][k]
            for u in range(1, U):
                a(f"  %{tag}.t{k}u{u} = fadd {vt} {t}, {nxt[u][k]}")
                t = f"%{tag}.t{k}u{u}"
            totals.append(t)
        return totals

    def scalars(self, tag: str, body: Callable, accs: list[str]) -> list[str]:
        """The tail's elements, one at a time, straight-line, with scalar accumulators."""
        vals = ["0.0"] * len(accs)
        for t in range(self.tail):
            off = str(self.nv * self.L + t)
            vals = body(off, vals, "float", f"{tag}t{t}")
        return vals

    def ptr(self, base: str, off: str, tag: str, what: str) -> str:
        """The address of element ``off`` of the row at ``base``."""
        self.a(f"  %{tag}.{what}p = getelementptr inbounds float, ptr {base}, i64 {off}")
        return f"%{tag}.{what}p"

    def sum_step(self, off: str, accs: list[str], ty: str, tag: str) -> list[str]:
        """Pass 1's step: s = x (+ r), stored; the sum of s (layer) or of s^2 (rms)."""
        a, ptr = self.a, self.ptr
        a(f"  %{tag}.xv = load {ty}, ptr {ptr('%xr', off, tag, 'x')}, align 4")
        v = f"%{tag}.xv"
        if self.residual:
            a(f"  %{tag}.rv = load {ty}, ptr {ptr('%rr', off, tag, 'r')}, align 4")
            a(f"  %{tag}.sv = fadd {ty} {v}, %{tag}.rv")
            v = f"%{tag}.sv"
            a(f"  store {ty} {v}, ptr {ptr('%sr', off, tag, 's')}, align 4")
        if self.kind == "rms":
            a(f"  %{tag}.sq = fmul {ty} {v}, {v}")
            v = f"%{tag}.sq"
        a(f"  %{tag}.acc = fadd {ty} {accs[0]}, {v}")
        return [f"%{tag}.acc"]

    def deviation_step(self, off: str, accs: list[str], ty: str, tag: str) -> list[str]:
        """Pass 2's step (layer): the sum of (s - mean)^2."""
        a = self.a
        m = "%meanv" if ty == self.vt else "%m1"
        a(f"  %{tag}.v = load {ty}, ptr {self.ptr(self.src, off, tag, 'v')}, align 4")
        a(f"  %{tag}.d = fsub {ty} %{tag}.v, {m}")
        a(f"  %{tag}.dd = fmul {ty} %{tag}.d, %{tag}.d")
        a(f"  %{tag}.acc = fadd {ty} {accs[0]}, %{tag}.dd")
        return [f"%{tag}.acc"]

    def scale_step(self, off: str, accs: list[str], ty: str, tag: str) -> list[str]:
        """Pass 3's step: y = (s - mean) * rstd * w + b, stored."""
        a, ptr = self.a, self.ptr
        vec = ty == self.vt
        a(f"  %{tag}.v = load {ty}, ptr {ptr(self.src, off, tag, 'v')}, align 4")
        v = f"%{tag}.v"
        if self.kind == "layer":
            a(f"  %{tag}.d = fsub {ty} {v}, {'%meanv' if vec else '%m1'}")
            v = f"%{tag}.d"
        a(f"  %{tag}.n = fmul {ty} {v}, {'%rstdv' if vec else '%rstd'}")
        v = f"%{tag}.n"
        if self.weight:
            a(f"  %{tag}.wv = load {ty}, ptr {ptr('%w', off, tag, 'w')}, align 4")
            a(f"  %{tag}.nw = fmul {ty} {v}, %{tag}.wv")
            v = f"%{tag}.nw"
        if self.bias:
            a(f"  %{tag}.bv = load {ty}, ptr {ptr('%b', off, tag, 'b')}, align 4")
            a(f"  %{tag}.nb = fadd {ty} {v}, %{tag}.bv")
            v = f"%{tag}.nb"
        a(f"  store {ty} {v}, ptr {ptr('%yr', off, tag, 'y')}, align 4")
        return []

    def total(self, tag: str, body: Callable) -> str:
        """The row's sum of what ``body`` accumulates: its vector part, its tail, reduced."""
        vec = self.loop(tag, body, ["acc"])[0]
        sc = self.scalars(tag, body, ["acc"])[0]
        self.a(f"  %{tag}.sum = call reassoc float @llvm.vector.reduce.fadd.v{self.L}f32(float {sc}, {self.vt} {vec})")
        return f"%{tag}.sum"

    def splat(self, dst: str, scalar: str) -> None:
        """``dst``: the vector of ``scalar`` in every lane."""
        self.a(f"  {dst}.0 = insertelement <1 x float> poison, float {scalar}, i64 0")
        self.a(f"  {dst} = shufflevector <1 x float> {dst}.0, <1 x float> poison, <{self.L} x i32> zeroinitializer")

    def statistics(self, eps: float) -> None:
        """Passes 1 and 2: the mean (``%m1``, ``%meanv``) and the reciprocal of the standard
        deviation (``%rstd``, ``%rstdv``)."""
        a = self.a
        inv_c = f32_hex(1.0 / self.c)
        a(f"  %m1 = fmul float {self.total('p1', self.sum_step)}, {inv_c}")
        if self.kind == "layer":
            self.splat("%meanv", "%m1")
            a(f"  %var = fmul float {self.total('p2', self.deviation_step)}, {inv_c}")
        else:
            a("  %var = fadd float %m1, 0.0")
        a(f"  %ve = fadd float %var, {f32_hex(eps)}")
        a("  %sd = call float @llvm.sqrt.f32(float %ve)")
        a("  %rstd = fdiv float 1.0, %sd")
        self.splat("%rstdv", "%rstd")

    def scale_and_end(self) -> None:
        """Pass 3 over the row, then the row loop's latch and the kernel's end."""
        a = self.a
        self.loop("p3", self.scale_step, [])
        self.scalars("p3", self.scale_step, [])
        a("  br label %rowend")
        a("rowend:")
        a("  %i.next = add i64 %i, 1")
        a("  %more = icmp slt i64 %i.next, %hi")
        a("  br i1 %more, label %row, label %exit")
        a("exit:")
        a("  ret void")
        a("}")


def norm_ir(name: str, kind: str, c: int, eps: float, residual: bool, weight: bool, bias: bool,
            lanes: int | None = None) -> str:
    """The LLVM IR of one normalization kernel over rows of ``c`` f32 elements:

        void NAME(ptr params, i64 lo, i64 hi, i64 tid)

    for rows [lo, hi); ``params`` holds the i64 addresses of x, residual, weight, bias, the sum
    and y (0 for those the variant has not). ``residual``: s = x + residual is stored and is the
    row normalized; else x itself. ``kind`` "layer": (s - mean) / sqrt(var + eps) with var the
    mean of (s - mean)^2; "rms": s / sqrt(mean(s^2) + eps). Then * weight and + bias."""
    assert kind in KINDS and c > 0 and not (kind == "rms" and bias)
    e = _NormEmitter(kind, c, residual, weight, bias, lanes or vector_width())
    e.head(name)
    e.statistics(eps)
    e.scale_and_end()
    return "\n".join(e.out) + "\n"


_COMPILED: dict = {}
_LOCK = threading.Lock()


def _eps(eps: float | None) -> float:
    """A norm's eps; None is rms_norm's default, f32's machine epsilon."""
    return float(np.finfo(np.float32).eps) if eps is None else float(eps)


def kernel_of(node: Any) -> tuple[str, int, float, bool, bool, bool]:
    """(kind, row size, eps, residual, weight, bias) of the kernel a ``layer_norm``, ``rms_norm``
    or ``add_norm`` node runs."""
    if node.op == "add_norm":
        kind, residual, extra = node.attrs["kind"], True, len(node.operands) - 2
    else:
        kind, residual, extra = ("layer" if node.op == "layer_norm" else "rms"), False, len(node.operands) - 1
    x = node.operands[0].type
    c = math.prod(x.shape[x.rank - len(node.attrs["axes"]):])
    return kind, c, _eps(node.attrs["eps"]), residual, extra > 0, extra > 1


def kernel_source(kind: str, c: int, eps: float | None, residual: bool, weight: bool, bias: bool) -> tuple[str, str]:
    """(name, LLVM IR) of the kernel a norm with these properties runs."""
    eps = _eps(eps)
    name = f"pt_{kind}_norm_c{c}{'_add' if residual else ''}{'_w' if weight else ''}{'_b' if bias else ''}"
    return name, norm_ir(name, kind, c, float(eps), residual, weight, bias)


def _kernel(kind: str, c: int, eps: float, residual: bool, weight: bool, bias: bool) -> Any:
    from .jit import jit

    key = (kind, c, f32_hex(eps), residual, weight, bias, vector_width())
    with _LOCK:
        fn = _COMPILED.get(key)
        if fn is None:
            name, ir = kernel_source(kind, c, eps, residual, weight, bias)
            fn = _COMPILED[key] = jit().kernel(name, ir, 0,
                                               argtypes=[ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                                         ctypes.c_int64]).fn
        return fn


def supported(shape: tuple, axes: tuple, dtypes: list) -> str | None:
    """Why the generated kernel does not take a norm of an input of ``shape`` over ``axes``
    (trailing) with operands of ``dtypes``, or None when it does."""
    if any(dt is not f32 for dt in dtypes):
        return "an operand is not f32"
    if any(not isinstance(d, int) for d in shape):
        return "a dynamic dim"
    if math.prod(shape) == 0:
        return "an empty tensor"
    return None


class PreparedNorm:
    """One norm node's kernel: rows of ``c`` elements, ``rows`` of them. ``__call__(x, r, w, b)``
    returns y, or (y, s) with a residual. Inputs that are not contiguous are copied first."""

    def __init__(self, kind: str, shape: tuple, n_axes: int, eps: float | None, residual: bool,
                 weight: bool, bias: bool) -> None:
        self.shape = tuple(shape)
        self.c = math.prod(self.shape[len(self.shape) - n_axes:])
        self.rows = math.prod(self.shape) // self.c
        self.residual, self.weight, self.bias = residual, weight, bias
        self.fn = _kernel(kind, self.c, _eps(eps), residual, weight, bias)
        self.parallel = self.rows > 1 and self.rows * self.c >= PARALLEL_MIN_ELEMENTS
        self.params = (ctypes.c_int64 * len(_P))()
        self.params_addr = ctypes.addressof(self.params)

    def __call__(self, x: Any, r: Any = None, w: Any = None, b: Any = None, y: Any = None, s: Any = None) -> Any:
        """The norm of ``x`` (+ ``r``); written into ``y`` (and the sum into ``s``), contiguous
        tensors of the input's shape, where given (the memory plan's buffers). The six
        addresses go into the parameter block in one write and the kernel gets its address."""
        x = x if x.is_contiguous() else x.contiguous()
        if y is None:
            y = torch.empty(self.shape, dtype=torch.float32)
        rp = sp = wp = bp = 0
        if self.residual:
            r = r if r.is_contiguous() else r.contiguous()
            if s is None:
                s = torch.empty(self.shape, dtype=torch.float32)
            rp, sp = r.data_ptr(), s.data_ptr()
        if self.weight:
            w = w if w.is_contiguous() else w.contiguous()
            wp = w.data_ptr()
        if self.bias:
            b = b if b.is_contiguous() else b.contiguous()
            bp = b.data_ptr()
        _PACK_P(self.params, 0, x.data_ptr(), rp, wp, bp, sp, y.data_ptr())
        nt = min(torch.get_num_threads(), self.rows) if self.parallel else 1
        if nt <= 1:
            self.fn(self.params_addr, 0, self.rows, 0)
        else:
            from .cpu import split_on_team

            split_on_team(self.fn, self.params, self.rows, nt)
        return (y, s) if self.residual else y

    def bind(self, x: Any, r: Any, w: Any, b: Any, y: Any, s: Any) -> bool:
        """Point the parameter block at these tensors without running the kernel (a step chain
        runs it from the block later, codegen/step_chain.py); False, the block untouched, where
        one of them would need a contiguous copy first or is not in CPU memory."""
        ts = [x, y] + [t for t, on in ((r, self.residual), (s, self.residual), (w, self.weight), (b, self.bias)) if on]
        if not all(t is not None and t.is_cpu and t.is_contiguous() for t in ts):
            return False
        _PACK_P(self.params, 0, x.data_ptr(), r.data_ptr() if self.residual else 0, w.data_ptr() if self.weight else 0,
                b.data_ptr() if self.bias else 0, s.data_ptr() if self.residual else 0, y.data_ptr())
        return True


NORM_OPS = ("layer_norm", "rms_norm", "add_norm")


def takes(node: Any) -> bool:
    """Whether the generated kernel runs the ``layer_norm``, ``rms_norm`` or ``add_norm`` node
    (so its results can go into the memory plan's buffers)."""
    if node.op not in NORM_OPS:
        return False
    x = node.operands[0]
    dtypes = [v.type.dtype for v in node.operands] + [r.type.dtype for r in node.results]
    if supported(tuple(x.type.shape), tuple(node.attrs["axes"]), dtypes) is not None:
        return False
    try:
        from .jit import jit

        jit()
    except Exception:  # no code generator here
        return False
    return True


def norm_kernel(node: Any, inplace: bool = False, outs: list | None = None) -> Any:
    """The step running a ``layer_norm``, ``rms_norm`` or ``add_norm`` node on the generated
    kernel, or None (the op's own step) where ``supported`` refuses it or no code can be
    generated on this machine. ``outs``: the memory plan's buffers for the node's results
    (None for one it does not plan)."""
    del inplace
    if not takes(node):
        return None
    kind, _, eps, residual, weight, bias = kernel_of(node)
    try:
        pn = PreparedNorm(kind, tuple(node.operands[0].type.shape), len(node.attrs["axes"]), eps, residual,
                          weight, bias)
    except Exception as e:  # CodegenError: the op's own step runs it
        import warnings

        warnings.warn(f"partita: the generated {node.op} did not compile ({e}); ATen runs it",
                      RuntimeWarning, stacklevel=2)
        return None
    fallback = op_on_aten(node.op)
    y_out, s_out = (list(outs) + [None, None])[:2] if outs else (None, None)
    w_at = 2 if residual else 1

    def step(args: list, attrs: dict) -> Any:
        x = args[0]
        if not x.is_cpu:
            return fallback(args, attrs)
        w = args[w_at] if weight else None
        b = args[w_at + 1] if bias else None
        return pn(x, args[1] if residual else None, w, b, y_out, s_out)
    step.exact_result = not residual  # type: ignore[attr-defined]  # one f32 tensor, the node's dtype
    if y_out is not None and (s_out is not None or not residual):
        from .jit import offer_native, range_entry

        def bind(args: list) -> bool:
            return pn.bind(args[0], args[1] if residual else None, args[w_at] if weight else None,
                           args[w_at + 1] if bias else None, y_out, s_out)

        offer_native(step, range_entry(pn.fn, pn.params_addr, pn.rows, bind),
                     (y_out, s_out) if residual else (y_out,))
    return step
