"""ConvNeXt v2's global response normalization (GRN) as one op and one generated kernel: ``grn``.

transformers' ``ConvNextV2GRN`` on a channels-last [N, H, W, C] tensor:

    g = linalg.vector_norm(x, dim=(1, 2), keepdim=True)        # [N, 1, 1, C]
    k = g / (g.mean(dim=-1, keepdim=True) + 1e-6)
    y = gamma * (x * k) + beta + x

reaches partita as ten nodes (``mul(x, x)``, ``sum`` over H and W, ``sqrt``, ``mean`` over C, the
eps add, ``div``, two muls and two adds), run as five steps on ATen and fused kernels. The
fuse-library anchor ``fuse_grn`` (on ``sqrt``) rewrites the chain into

    %y = grn(%x, %gamma, %beta) {eps=1e-06}

and the generated kernel (``grn_ir``) does one image at a time: the sum of squares of each
channel over the pixels (a vector of channels, its accumulator in a register), the square root,
their mean over the channels, ``k`` kept in a scratch row, then ``((x * k) * gamma + beta) + x``
in the reference's order of operations. Only the order of the two sums differs from the
reference (golden tests in ``tests/codegen/test_convnext_grn.py``).
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable

import numpy as np

from ..ir.diagnostics import TypeRuleError
from ..ir.dtypes import f32
from ..ir.graph import Graph, Node, Value
from ..ir.types import TensorType
from ..ops._lazy import torch
from ..ops.registry import AttrSpec, Cost, OPS, OpDef, register
from ..passes.rewrite import sole_user
from .aten_fallback import op_on_aten
from .lowering import vector_width
from .norm import f32_hex

__all__ = ["fuse_grn", "grn_ir", "grn_kernel", "PreparedGRN"]

# Images are split across threads from this many elements on.
PARALLEL_MIN_ELEMENTS = 1 << 17


# --- the op ----------------------------------------------------------------------------------

def _channels(t: TensorType, what: str) -> int:
    """C of a per-channel operand of shape [C], [1, C], [1, 1, C] or [1, 1, 1, C]."""
    if t.rank < 1 or t.rank > 4 or any(d != 1 for d in t.shape[:-1]):
        raise TypeRuleError(f"grn: {what} is {t}; it must be per channel ([C] or [1, 1, 1, C])")
    return int(t.shape[-1])


def _grn_infer(ts: list, attrs: dict) -> list:
    if len(ts) != 3:
        raise TypeRuleError("grn: takes x, gamma and beta")
    x = ts[0]
    if x.rank != 4 or not x.dtype.is_float:
        raise TypeRuleError(f"grn: x is {x}; it must be a float channels-last [N, H, W, C] tensor")
    for t, what in zip(ts[1:], ("gamma", "beta")):
        if _channels(t, what) != x.shape[3] or t.dtype is not x.dtype:
            raise TypeRuleError(f"grn: {what} is {t}; it must have x's dtype and its {x.shape[3]} channels")
    return [x]


def _ref(op: str, args: list, **attrs: Any) -> np.ndarray:
    """One op's reference (the interpreter's rounding)."""
    with np.errstate(all="ignore"):
        return np.asarray(OPS[op].reference(args, OPS[op].normalize_attrs(attrs)))


def _grn_reference(args: list, attrs: dict) -> np.ndarray:
    x, gamma, beta = args
    g = _ref("sqrt", [_ref("sum", [_ref("mul", [x, x])], axes=(1, 2), keepdim=True)])
    den = _ref("add", [_ref("mean", [g], axes=(3,), keepdim=True), np.float32(attrs["eps"])])
    k = _ref("div", [g, den])
    t = _ref("mul", [gamma, _ref("mul", [x, k])])
    return _ref("add", [_ref("add", [t, beta]), x])


def _grn_torch(args: list, attrs: dict) -> Any:
    x, gamma, beta = args
    g = torch.linalg.vector_norm(x, dim=(1, 2), keepdim=True)
    k = g / (g.mean(dim=-1, keepdim=True) + attrs["eps"])
    return gamma * (x * k) + beta + x


def _grn_cost(ins: list, outs: list, attrs: dict) -> Cost:
    n = ins[0].numel
    return Cost(6 * n, sum(t.nbytes for t in ins) + ins[0].nbytes, outs[0].nbytes)


register(OpDef(
    name="grn", operands=("x", "gamma", "beta"), attrs=(AttrSpec("eps", "float", 1e-6),),
    infer=_grn_infer, reference=_grn_reference, torch=_grn_torch, cost=_grn_cost,
    doc="Global response normalization of a channels-last [N, H, W, C] x: g = sqrt(sum over H, W of "
        "x^2), k = g / (mean over C of g + eps), y = gamma * (x * k) + beta + x (ConvNeXt v2). Made "
        "by the fuse-library pass for inference (codegen/grn.py).",
))


# --- the rewrite -----------------------------------------------------------------------------

def _only(v: Value, op: str) -> Node | None:
    """The one node reading ``v``, when it is an ``op`` (and ``v`` no graph output)."""
    u = sole_user(v)
    return u if u is not None and u.op == op else None


def _other(node: Node, v: Value) -> Value | None:
    """The operand of a binary ``node`` that is not ``v`` (None when both are)."""
    a, b = node.operands
    return b if a is v else a if b is v else None


def _is_const(v: Value) -> bool:
    """A graph input (param or constant) or a ``full``'s result."""
    return v.producer is None or v.producer.op == "full"


def _norm_chain(sqrt: Node) -> tuple[list[Node], Value, float] | None:
    """(the nodes from ``mul(x, x)`` to ``div``, x, eps) of the statistics of a GRN whose
    ``sqrt`` this is: sqrt(sum over H, W of x^2) / (its mean over C + eps); or None."""
    g = sqrt.results[0]
    red = sqrt.operands[0].producer
    if red is None or red.op != "sum" or len(sqrt.operands[0].users) != 1:
        return None
    square = red.operands[0].producer
    if square is None or square.op != "mul" or square.operands[0] is not square.operands[1] \
            or len(square.results[0].users) != 1:
        return None
    x = square.operands[0]
    if x.type.rank != 4 or x.type.dtype is not f32 or tuple(red.attrs["axes"] or ()) != (1, 2) \
            or not red.attrs["keepdim"]:
        return None
    users = {u.op: u for u in g.users}
    mean, div = users.get("mean"), users.get("div")
    if g.is_output or len(g.users) != 2 or mean is None or div is None or div.operands[0] is not g \
            or tuple(mean.attrs["axes"] or ()) not in ((3,), (-1,)) or not mean.attrs["keepdim"]:
        return None
    add_eps = _only(mean.results[0], "add")
    if add_eps is None or div.operands[1] is not add_eps.results[0] or len(add_eps.results[0].users) != 1:
        return None
    eps_v = _other(add_eps, mean.results[0])
    full = eps_v.producer if eps_v is not None else None
    if full is None or full.op != "full" or full.results[0].type.shape != ():
        return None
    return [square, red, sqrt, mean, add_eps, div], x, float(full.attrs["value"])


def _affine_chain(k: Value, x: Value) -> tuple[list[Node], Value, Value] | None:
    """(the nodes, gamma, beta) of ``gamma * (x * k) + beta + x`` after ``k``, either operand
    order of each, gamma and beta per-channel params; or None."""
    mx = _only(k, "mul")
    if mx is None or _other(mx, k) is not x:
        return None
    mg = _only(mx.results[0], "mul")
    ab = _only(mg.results[0], "add") if mg is not None else None
    ax = _only(ab.results[0], "add") if ab is not None else None
    if mg is None or ab is None or ax is None or _other(ax, ab.results[0]) is not x:
        return None
    gamma, beta = _other(mg, mx.results[0]), _other(ab, mg.results[0])
    if gamma is None or beta is None:
        return None
    for v in (gamma, beta):
        if not _is_const(v) or v.type.dtype is not f32 or v.type.rank > 4 \
                or any(d != 1 for d in v.type.shape[:-1]) or v.type.shape[-1:] != (x.type.shape[3],):
            return None
    if any(n.results[0].type != x.type for n in (mx, mg, ab, ax)):
        return None
    return [mx, mg, ab, ax], gamma, beta


def fuse_grn(graph: Graph, node: Node) -> Node | None:
    """The chain around ``sqrt`` that is ConvNeXt v2's GRN into one ``grn`` node (the module
    doc); None where it does not apply."""
    stats = _norm_chain(node)
    if stats is None:
        return None
    first, x, eps = stats
    affine = _affine_chain(first[-1].results[0], x)
    if affine is None:
        return None
    rest, gamma, beta = affine
    chain, last = first + rest, rest[-1]
    full = _other(first[4], first[3].results[0])
    full_node = full.producer if full is not None else None
    new = Node("grn", [x, gamma, beta], OPS["grn"].normalize_attrs({"eps": eps}), [x.type], last.loc)
    graph.insert_before(last, new)
    graph.replace_all_uses(last.results[0], new.results[0])
    for n in reversed(chain):
        graph.erase(n)
    if full_node is not None and not full_node.results[0].users and not full_node.results[0].is_output:
        graph.erase(full_node)
    return new


# --- the kernel ------------------------------------------------------------------------------

_P = ["x", "w", "b", "k", "y"]


def _lanes(c: int, width: int) -> int:
    """The widest vector of at most ``width`` lanes that divides ``c`` (1 for odd counts)."""
    lanes = width
    while c % lanes:
        lanes //= 2
    return lanes


def _head(a: Callable[[str], None], name: str, L: int, hwc: int, c: int) -> None:
    """Declarations, signature, parameters and the image loop's head (x, y and k rows)."""
    vt = f"<{L} x float>"
    a(f"declare float @llvm.vector.reduce.fadd.v{L}f32(float, {vt})")
    a(f"declare {vt} @llvm.sqrt.v{L}f32({vt})")
    a(f"define void @{name}(ptr noalias %pp, i64 %lo, i64 %hi, i64 %tid) nounwind {{")
    a("entry:")
    for i, p in enumerate(_P):
        a(f"  %{p}.p = getelementptr inbounds i64, ptr %pp, i64 {i}")
        a(f"  %{p}.i = load i64, ptr %{p}.p, align 8")
        a(f"  %{p} = inttoptr i64 %{p}.i to ptr")
    a("  %empty = icmp sge i64 %lo, %hi")
    a("  br i1 %empty, label %exit, label %img")
    a("img:")
    a("  %n = phi i64 [ %lo, %entry ], [ %n.next, %apx.end ]")
    a(f"  %xo = mul i64 %n, {hwc}")
    a("  %xb = getelementptr inbounds float, ptr %x, i64 %xo")
    a("  %yb = getelementptr inbounds float, ptr %y, i64 %xo")
    a(f"  %ko = mul i64 %n, {c}")
    a("  %kb = getelementptr inbounds float, ptr %k, i64 %ko")
    a("  br label %cv")


def _statistics(a: Callable[[str], None], L: int, hw: int, c: int, eps: float) -> None:
    """Per channel vector: the sum of squares over the pixels, its square root into k and the
    sum of the roots; then k / (mean + eps) in place."""
    vt = f"<{L} x float>"
    a("cv:")
    a("  %j = phi i64 [ 0, %img ], [ %j.next, %cv.end ]")
    a(f"  %gacc = phi {vt} [ zeroinitializer, %img ], [ %gacc.next, %cv.end ]")
    a("  br label %px")
    a("px:")
    a("  %p = phi i64 [ 0, %cv ], [ %p.next, %px ]")
    a(f"  %acc = phi {vt} [ zeroinitializer, %cv ], [ %acc.next, %px ]")
    a(f"  %po = mul i64 %p, {c}")
    a("  %off = add i64 %po, %j")
    a("  %xp = getelementptr inbounds float, ptr %xb, i64 %off")
    a(f"  %xv = load {vt}, ptr %xp, align 4")
    a(f"  %sq = fmul {vt} %xv, %xv")
    a(f"  %acc.next = fadd {vt} %acc, %sq")
    a("  %p.next = add i64 %p, 1")
    a(f"  %p.more = icmp ult i64 %p.next, {hw}")
    a("  br i1 %p.more, label %px, label %cv.end")
    a("cv.end:")
    a(f"  %g = call {vt} @llvm.sqrt.v{L}f32({vt} %acc.next)")
    a("  %gp = getelementptr inbounds float, ptr %kb, i64 %j")
    a(f"  store {vt} %g, ptr %gp, align 4")
    a(f"  %gacc.next = fadd {vt} %gacc, %g")
    a(f"  %j.next = add i64 %j, {L}")
    a(f"  %j.more = icmp ult i64 %j.next, {c}")
    a("  br i1 %j.more, label %cv, label %mean")
    a("mean:")
    a(f"  %gsum = call reassoc float @llvm.vector.reduce.fadd.v{L}f32(float 0.0, {vt} %gacc.next)")
    a(f"  %gmean = fdiv float %gsum, {f32_hex(float(c))}")
    a(f"  %den = fadd float %gmean, {f32_hex(eps)}")
    a("  %den1 = insertelement <1 x float> poison, float %den, i64 0")
    a(f"  %denv = shufflevector <1 x float> %den1, <1 x float> poison, <{L} x i32> zeroinitializer")
    a("  br label %kv")
    a("kv:")
    a("  %q = phi i64 [ 0, %mean ], [ %q.next, %kv ]")
    a("  %kp = getelementptr inbounds float, ptr %kb, i64 %q")
    a(f"  %kg = load {vt}, ptr %kp, align 4")
    a(f"  %kk = fdiv {vt} %kg, %denv")
    a(f"  store {vt} %kk, ptr %kp, align 4")
    a(f"  %q.next = add i64 %q, {L}")
    a(f"  %q.more = icmp ult i64 %q.next, {c}")
    a("  br i1 %q.more, label %kv, label %apx")


def _apply(a: Callable[[str], None], L: int, hw: int, c: int) -> None:
    """Per pixel and channel vector: y = ((x * k) * gamma + beta) + x; then the loops' ends."""
    vt = f"<{L} x float>"
    a("apx:")
    a("  %ap = phi i64 [ 0, %kv ], [ %ap.next, %apc.end ]")
    a(f"  %apo = mul i64 %ap, {c}")
    a("  br label %apc")
    a("apc:")
    a("  %aj = phi i64 [ 0, %apx ], [ %aj.next, %apc ]")
    a("  %ao = add i64 %apo, %aj")
    loads = (("x", "%xb", "%ao"), ("k", "%kb", "%aj"), ("w", "%w", "%aj"), ("b", "%b", "%aj"))
    for v, base, off in loads:
        a(f"  %a{v}p = getelementptr inbounds float, ptr {base}, i64 {off}")
        a(f"  %a{v} = load {vt}, ptr %a{v}p, align 4")
    a(f"  %t1 = fmul {vt} %ax, %ak")
    a(f"  %t2 = fmul {vt} %aw, %t1")
    a(f"  %t3 = fadd {vt} %t2, %ab")
    a(f"  %t4 = fadd {vt} %t3, %ax")
    a("  %ayp = getelementptr inbounds float, ptr %yb, i64 %ao")
    a(f"  store {vt} %t4, ptr %ayp, align 4")
    a(f"  %aj.next = add i64 %aj, {L}")
    a(f"  %aj.more = icmp ult i64 %aj.next, {c}")
    a("  br i1 %aj.more, label %apc, label %apc.end")
    a("apc.end:")
    a("  %ap.next = add i64 %ap, 1")
    a(f"  %ap.more = icmp ult i64 %ap.next, {hw}")
    a("  br i1 %ap.more, label %apx, label %apx.end")
    a("apx.end:")
    a("  %n.next = add i64 %n, 1")
    a("  %n.more = icmp slt i64 %n.next, %hi")
    a("  br i1 %n.more, label %img, label %exit")
    a("exit:")
    a("  ret void")
    a("}")


def grn_ir(name: str, hw: int, c: int, eps: float, lanes: int | None = None) -> str:
    """The LLVM IR of one GRN kernel over images of ``hw`` pixels of ``c`` f32 channels:

        void NAME(ptr params, i64 lo, i64 hi, i64 tid)

    for images [lo, hi); ``params`` holds the i64 addresses of x, gamma, beta, a scratch of
    [N, C] floats (k) and y."""
    assert hw > 0 and c > 0
    L = _lanes(c, lanes or vector_width())
    out: list[str] = []
    _head(out.append, name, L, hw * c, c)
    _statistics(out.append, L, hw, c, eps)
    _apply(out.append, L, hw, c)
    return "\n".join(out) + "\n"




def kernel_source(hw: int, c: int, eps: float) -> tuple[str, str]:
    """(name, LLVM IR) of the kernel a GRN over ``hw`` pixels of ``c`` channels runs."""
    name = f"pt_grn_p{hw}_c{c}_e{f32_hex(eps)[2:]}"
    return name, grn_ir(name, hw, c, eps)


def _kernel(hw: int, c: int, eps: float) -> Any:
    from .jit import range_kernel

    return range_kernel(("grn", hw, c, f32_hex(eps), vector_width()), lambda: kernel_source(hw, c, eps))


class PreparedGRN:
    """One ``grn`` node's kernel for x of ``shape`` [N, H, W, C]: ``__call__(x, gamma, beta)``
    returns y. Inputs that are not contiguous are copied first."""

    def __init__(self, shape: tuple, eps: float) -> None:
        self.shape = tuple(int(d) for d in shape)
        n, h, w, c = self.shape
        self.n, self.c = n, c
        self.fn = _kernel(h * w, c, float(eps))
        self.parallel = n > 1 and n * h * w * c >= PARALLEL_MIN_ELEMENTS
        self.params = (ctypes.c_int64 * len(_P))()
        self.k = torch.empty((n, c), dtype=torch.float32)

    def __call__(self, x: Any, gamma: Any, beta: Any) -> Any:
        """y for ``x``; gamma and beta per channel."""
        x = x if x.is_contiguous() else x.contiguous()
        gamma = gamma if gamma.is_contiguous() else gamma.contiguous()
        beta = beta if beta.is_contiguous() else beta.contiguous()
        y = torch.empty(self.shape, dtype=torch.float32)
        p = self.params
        p[0], p[1], p[2], p[3], p[4] = x.data_ptr(), gamma.data_ptr(), beta.data_ptr(), self.k.data_ptr(), y.data_ptr()
        nt = min(torch.get_num_threads(), self.n) if self.parallel else 1
        if nt <= 1:
            self.fn(p, 0, self.n, 0)
        else:
            from .cpu import split_on_team

            split_on_team(self.fn, p, self.n, nt)
        return y


def grn_kernel(node: Any, inplace: bool = False) -> Any:
    """The step running a ``grn`` node on the generated kernel, or None (the op's own ATen
    step) where no code can be generated here."""
    del inplace
    x = node.operands[0].type
    if node.op != "grn" or x.rank != 4 or x.dtype is not f32 or any(not isinstance(d, int) for d in x.shape) \
            or x.numel == 0:
        return None
    try:
        pg = PreparedGRN(tuple(x.shape), node.attrs["eps"])
    except Exception as e:  # no code generator here, or CodegenError: ATen runs it
        import warnings

        warnings.warn(f"partita: the generated grn did not compile ({e}); ATen runs it", RuntimeWarning,
                      stacklevel=2)
        return None
    fallback = op_on_aten("grn")

    def step(args: list, attrs: dict) -> Any:
        if not args[0].is_cpu:
            return fallback(args, attrs)
        return pg(*args)
    return step
