"""DeBERTa-v2's disentangled attention terms as one op and one generated kernel: ``rel_scores``.

transformers' ``DisentangledSelfAttention.disentangled_attention_bias`` builds each of its two
relative-position terms as

    c2p = gather(bmm(q, pos_key.repeat(B, 1, 1).transpose(-1, -2)), -1, c2p_pos.expand(N, T, S))
    p2c = gather(bmm(k, pos_query.repeat(B, 1, 1).transpose(-1, -2)), -1, p2c_pos.expand(N, S, T)).transpose(-1, -2)

with N = B * H rows of heads, ``pos_key`` / ``pos_query`` [H, 2 * span, D] (a projection of the
relative embeddings: a constant of a frozen program) and the clamped relative positions as the
indices. On partita's import path that is, per term, a ``broadcast_to`` and a ``reshape`` that
copy the table B times, its ``transpose``, the ``matmul`` over all 2 * span positions, the
``gather`` and (p2c) a ``transpose``: about six steps a term, most of the work on positions the
gather drops. The fuse-library anchor ``fuse_rel_scores`` (on ``gather``) rewrites each term into

    %s = rel_scores(%a, %table, %idx) {transpose=false|true}
    s[n, i, j] = dot(a[n, i, :], table[n % H, idx[i, j], :])        (transpose: s[n, j, i])

reading ``a`` as the [B, H, T, D] view it is made from (no copy) and the table as [H, R, D]
(no repeat), and the generated kernel (``rel_scores_ir``) computes only the T x S dot products
the gather keeps: each a vector loop over D and one sum. The rounding differs from the unfused
matmul only in the order of each dot product's sum (golden tests in
``tests/codegen/test_disentangled.py``).
"""

from __future__ import annotations

import ctypes
import math
from typing import Any

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

__all__ = ["fuse_rel_scores", "rel_scores_ir", "rel_scores_kernel", "PreparedRelScores"]

# Rows of heads are split across threads from this many multiply-adds on.
PARALLEL_MIN_FLOPS = 1 << 18


# --- the op ----------------------------------------------------------------------------------

def _rows(a: TensorType) -> tuple[int, int, int]:
    """(N, rows, D) of ``a``: [N, rows, D] or [B, H, rows, D] read as N = B * H."""
    if a.rank == 3:
        return int(a.shape[0]), int(a.shape[1]), int(a.shape[2])
    return int(a.shape[0]) * int(a.shape[1]), int(a.shape[2]), int(a.shape[3])


def _rel_scores_infer(ts: list, attrs: dict) -> list:
    if len(ts) != 3:
        raise TypeRuleError("rel_scores: takes a, table and idx")
    a, table, idx = ts
    if a.rank not in (3, 4) or not a.dtype.is_float:
        raise TypeRuleError(f"rel_scores: a is {a}; it must be a float [N, T, D] or [B, H, T, D] tensor")
    n, rows, d = _rows(a)
    if table.rank != 3 or table.dtype is not a.dtype or int(table.shape[2]) != d or n % max(int(table.shape[0]), 1):
        raise TypeRuleError(f"rel_scores: table is {table}; it must be [H, R, {d}] of a's dtype with H dividing "
                            f"a's {n} rows of heads")
    if idx.rank != 2 or not idx.dtype.is_int or int(idx.shape[0]) != rows:
        raise TypeRuleError(f"rel_scores: idx is {idx}; it must be an integer [{rows}, C] tensor")
    c = int(idx.shape[1])
    return [TensorType((n, c, rows) if attrs["transpose"] else (n, rows, c), a.dtype)]


def _rel_scores_reference(args: list, attrs: dict) -> np.ndarray:
    a, table, idx = (np.asarray(x) for x in args)
    h, r, d = table.shape
    a3 = a.reshape(-1, a.shape[-2], d)
    n = a3.shape[0]
    if idx.size and (idx.min() < 0 or idx.max() >= r):
        raise IndexError(f"rel_scores: an index is outside the table's {r} positions")
    tb = table[np.arange(n) % h]                                    # [N, R, D]
    s = np.matmul(a3, tb.transpose(0, 2, 1))                        # [N, rows, R]
    g = np.take_along_axis(s, np.broadcast_to(idx, (n, *idx.shape)).astype(np.int64), axis=2)
    out = g.transpose(0, 2, 1) if attrs["transpose"] else g
    return np.ascontiguousarray(out.astype(a.dtype))


def _rel_scores_torch(args: list, attrs: dict) -> Any:
    a, table, idx = args
    h, _, d = table.shape
    a3 = a.reshape(-1, a.shape[-2], d)
    n = a3.shape[0]
    s = torch.matmul(a3.reshape(n // h, h, a3.shape[1], d), table.transpose(-1, -2)).reshape(n, a3.shape[1], -1)
    g = torch.gather(s, 2, idx.to(torch.int64).expand(n, *idx.shape))
    return g.transpose(1, 2) if attrs["transpose"] else g


def _rel_scores_cost(ins: list, outs: list, attrs: dict) -> Cost:
    d = int(ins[1].shape[2])
    return Cost(2 * outs[0].numel * d, sum(t.nbytes for t in ins), outs[0].nbytes)


register(OpDef(
    name="rel_scores", operands=("a", "table", "idx"), attrs=(AttrSpec("transpose", "bool", False),),
    infer=_rel_scores_infer, reference=_rel_scores_reference, torch=_rel_scores_torch, cost=_rel_scores_cost,
    doc="Relative-position scores: s[n, i, j] = dot(a[n, i, :], table[n % H, idx[i, j], :]) for a [N, T, D] "
        "(or [B, H, T, D], N = B * H), table [H, R, D] and integer idx [T, C]; ``transpose`` gives s[n, j, i]. "
        "gather(matmul(a, table^T), idx) without the positions the gather drops (DeBERTa-v2's c2p and p2c "
        "terms). Made by the fuse-library pass for inference (codegen/disentangled.py).",
))


# --- the rewrite -----------------------------------------------------------------------------

def _producer(v: Value, op: str) -> Node | None:
    """``v``'s producer when it is an ``op``."""
    p = v.producer
    return p if p is not None and p.op == op else None


def _table(graph: Graph, m: Value, n: int, before: Node) -> Value | None:
    """``m`` [N, R, D] as a table [H, R, D] with m[i] = table[i % H]: the tensor a ``repeat``
    (``reshape(broadcast_to(x))`` with x's leading 1 broadcast to B) was made from, reshaped;
    ``m`` itself (H = N) when it is made some other way; None when it is not 3-D."""
    if m.type.rank != 3:
        return None
    rs = _producer(m, "reshape")
    bc = _producer(rs.operands[0], "broadcast_to") if rs is not None else None
    if bc is None:
        return m
    x = bc.operands[0]
    xs, ts = tuple(x.type.shape), tuple(bc.results[0].type.shape)
    if len(xs) != len(ts) or not xs or xs[0] != 1 or xs[1:] != ts[1:] or int(ts[0]) * math.prod(xs) != m.type.numel:
        return m
    rest = [int(s) for s in xs[1:] if s != 1]
    r, d = int(m.type.shape[1]), int(m.type.shape[2])
    h = math.prod(rest) // (r * d) if rest else 0
    if h < 1 or n % h or rest[-2:] != [r, d] or (h > 1 and rest != [h, r, d]) or (h == 1 and len(rest) != 2):
        return m
    node = Node("reshape", [x], OPS["reshape"].normalize_attrs({"shape": [h, r, d]}),
                [TensorType((h, r, d), x.type.dtype)], bc.loc)
    graph.insert_before(before, node)
    return node.results[0]


def _index(graph: Graph, idx: Value, rows: int, cols: int, before: Node) -> Value | None:
    """The [rows, cols] index every row of heads shares: what ``idx`` [N, rows, cols] was
    broadcast from, reshaped; None when ``idx`` is not such a broadcast."""
    bc = _producer(idx, "broadcast_to")
    if bc is None:
        return None
    x = bc.operands[0]
    if [int(s) for s in x.type.shape if s != 1] != [s for s in (rows, cols) if s != 1] \
            or tuple(x.type.shape[-2:]) != (rows, cols) or any(s != 1 for s in x.type.shape[:-2]):
        return None
    if x.type.rank == 2:
        return x
    node = Node("reshape", [x], OPS["reshape"].normalize_attrs({"shape": [rows, cols]}),
                [TensorType((rows, cols), x.type.dtype)], bc.loc)
    graph.insert_before(before, node)
    return node.results[0]


def _rows_source(a: Value) -> Value:
    """``a`` [N, T, D], or the [B, H, T, D] tensor it is a reshape of (read in place by the kernel)."""
    rs = _producer(a, "reshape")
    if rs is not None:
        src = rs.operands[0]
        if src.type.rank == 4 and tuple(src.type.shape[2:]) == tuple(a.type.shape[1:]) \
                and int(src.type.shape[0]) * int(src.type.shape[1]) == int(a.type.shape[0]):
            return src
    return a


def fuse_rel_scores(graph: Graph, node: Node) -> Node | None:
    """``gather(matmul(a, transpose(m)), idx)`` over the last axis, with ``idx`` the same for
    every row of heads (and a ``transpose`` of the last two axes after it, if any), into one
    ``rel_scores`` node (the module doc); None where it does not apply."""
    x, idx = node.operands
    mm = _producer(x, "matmul")
    if mm is None or sole_user(x) is not node or x.type.rank != 3 or x.type.dtype is not f32 \
            or node.attrs["axis"] not in (2, -1):
        return None
    a, mt = mm.operands
    tr = _producer(mt, "transpose")
    if tr is None or tuple(tr.attrs["perm"]) != (0, 2, 1) or a.type.rank != 3 or a.type.dtype is not f32:
        return None
    n, rows, cols = (int(s) for s in node.results[0].type.shape)
    if any(not isinstance(s, int) for s in (*x.type.shape, *idx.type.shape)):
        return None
    m = tr.operands[0]
    if int(a.type.shape[0]) != n or m.type.rank != 3 or int(m.type.shape[0]) != n or m.type.dtype is not f32:
        return None   # a matmul broadcasting one side over the rows of heads
    if _producer(idx, "broadcast_to") is None:
        return None
    ix = _index(graph, idx, rows, cols, node)
    if ix is None:
        return None
    table = _table(graph, m, n, node)
    if table is None:
        return None
    last, transpose = node, False
    t2 = sole_user(node.results[0])
    if t2 is not None and t2.op == "transpose" and tuple(t2.attrs["perm"]) == (0, 2, 1):
        last, transpose = t2, True
    src = _rows_source(a)
    new = Node("rel_scores", [src, table, ix], OPS["rel_scores"].normalize_attrs({"transpose": transpose}),
               [last.results[0].type], node.loc)
    graph.insert_before(last, new)
    graph.replace_all_uses(last.results[0], new.results[0])
    for old in ([t2] if transpose else []) + [node, mm]:
        assert old is not None
        graph.erase(old)
    return new


# --- the kernel ------------------------------------------------------------------------------

_P = ["a", "t", "ix", "o", "HA", "as0", "as1", "as2", "H", "R", "rows", "C", "osr", "osc"]
_PTRS = ("a", "t", "ix", "o")


def _lanes(d: int, width: int) -> int:
    """The widest vector of at most ``width`` lanes not wider than ``d`` (a power of two)."""
    L = width
    while L > 1 and L > d:
        L //= 2
    return L


def rel_scores_ir(name: str, d: int, lanes: int | None = None) -> str:
    """The LLVM IR of one ``rel_scores`` kernel for rows of ``d`` f32:

        void NAME(ptr params, i64 lo, i64 hi, i64 tid)

    for the rows of heads [lo, hi); ``params``: the i64s of ``_P`` (addresses; strides in
    floats; out[n] is rows x C floats at ``osr`` and ``osc``)."""
    assert d > 0
    L = _lanes(d, lanes or vector_width())
    nv, rem = d // L, d % L
    vt = f"<{L} x float>"
    out: list[str] = []
    a = out.append
    a(f"declare {vt} @llvm.fma.v{L}f32({vt}, {vt}, {vt})")
    a(f"declare float @llvm.vector.reduce.fadd.v{L}f32(float, {vt})")
    a("declare float @llvm.fma.f32(float, float, float)")
    a(f"define void @{name}(ptr noalias %pp, i64 %lo, i64 %hi, i64 %tid) nounwind {{")
    a("entry:")
    for i, p in enumerate(_P):
        a(f"  %{p}.p = getelementptr inbounds i64, ptr %pp, i64 {i}")
        a(f"  %{p}.i = load i64, ptr %{p}.p, align 8")
        a(f"  %{p} = inttoptr i64 %{p}.i to ptr" if p in _PTRS else f"  %{p} = add i64 %{p}.i, 0")
    a("  %per = mul i64 %rows, %C")
    a("  %empty = icmp uge i64 %lo, %hi")
    a("  br i1 %empty, label %exit, label %nl")
    a("nl:")
    a("  %n = phi i64 [%lo, %entry], [%n.n, %rl.end]")
    a("  %nb = udiv i64 %n, %HA")
    a("  %nh = urem i64 %n, %HA")
    a("  %ao0 = mul i64 %nb, %as0")
    a("  %ao1 = mul i64 %nh, %as1")
    a("  %ao = add i64 %ao0, %ao1")
    a("  %ah = getelementptr float, ptr %a, i64 %ao")
    a("  %th0 = urem i64 %n, %H")
    a("  %th1 = mul i64 %th0, %R")
    a(f"  %th2 = mul i64 %th1, {d}")
    a("  %th = getelementptr float, ptr %t, i64 %th2")
    a("  %oo = mul i64 %n, %per")
    a("  %oh = getelementptr float, ptr %o, i64 %oo")
    a("  br label %rl")
    a("rl:")
    a("  %r = phi i64 [0, %nl], [%r.n, %cl.end]")
    a("  %aro = mul i64 %r, %as2")
    a("  %arow = getelementptr float, ptr %ah, i64 %aro")
    for v in range(nv):
        a(f"  %avp{v} = getelementptr float, ptr %arow, i64 {v * L}")
        a(f"  %av{v} = load {vt}, ptr %avp{v}, align 4")
    for t in range(rem):
        a(f"  %atp{t} = getelementptr float, ptr %arow, i64 {nv * L + t}")
        a(f"  %at{t} = load float, ptr %atp{t}, align 4")
    a("  %ixr0 = mul i64 %r, %C")
    a("  %ixr = getelementptr i64, ptr %ix, i64 %ixr0")
    a("  %orr0 = mul i64 %r, %osr")
    a("  %orr = getelementptr float, ptr %oh, i64 %orr0")
    a("  br label %cl")
    a("cl:")
    a("  %c = phi i64 [0, %rl], [%c.n, %cl]")
    a("  %ixp = getelementptr i64, ptr %ixr, i64 %c")
    a("  %ixv = load i64, ptr %ixp, align 8")
    a(f"  %tro = mul i64 %ixv, {d}")
    a("  %trow = getelementptr float, ptr %th, i64 %tro")
    acc = "zeroinitializer"
    for v in range(nv):
        a(f"  %bvp{v} = getelementptr float, ptr %trow, i64 {v * L}")
        a(f"  %bv{v} = load {vt}, ptr %bvp{v}, align 4")
        if v == 0:
            a(f"  %acc0 = fmul {vt} %av0, %bv0")
        else:
            a(f"  %acc{v} = call {vt} @llvm.fma.v{L}f32({vt} %av{v}, {vt} %bv{v}, {vt} {acc})")
        acc = f"%acc{v}"
    s = "0.0"
    if nv:
        a(f"  %sum = call reassoc float @llvm.vector.reduce.fadd.v{L}f32(float -0.0, {vt} {acc})")
        s = "%sum"
    for t in range(rem):
        a(f"  %bsp{t} = getelementptr float, ptr %trow, i64 {nv * L + t}")
        a(f"  %bs{t} = load float, ptr %bsp{t}, align 4")
        a(f"  %st{t} = call float @llvm.fma.f32(float %at{t}, float %bs{t}, float {s})")
        s = f"%st{t}"
    a("  %oco = mul i64 %c, %osc")
    a("  %op = getelementptr float, ptr %orr, i64 %oco")
    a(f"  store float {s}, ptr %op, align 4")
    a("  %c.n = add nuw nsw i64 %c, 1")
    a("  %cc = icmp ult i64 %c.n, %C")
    a("  br i1 %cc, label %cl, label %cl.end")
    a("cl.end:")
    a("  %r.n = add nuw nsw i64 %r, 1")
    a("  %rc = icmp ult i64 %r.n, %rows")
    a("  br i1 %rc, label %rl, label %rl.end")
    a("rl.end:")
    a("  %n.n = add i64 %n, 1")
    a("  %nc = icmp ult i64 %n.n, %hi")
    a("  br i1 %nc, label %nl, label %exit")
    a("exit:")
    a("  ret void")
    a("}")
    return "\n".join(out) + "\n"


def kernel_source(d: int) -> tuple[str, str]:
    """(name, LLVM IR) of the kernel ``rel_scores`` over rows of ``d`` runs."""
    name = f"pt_rel_scores_d{d}_l{vector_width()}"
    return name, rel_scores_ir(name, d)


def _kernel(d: int) -> Any:
    from .jit import range_kernel

    return range_kernel(("rel_scores", d, vector_width()), lambda: kernel_source(d))


class PreparedRelScores:
    """One ``rel_scores`` node's kernel for a of ``a_shape``, a table [H, R, D] and idx
    [rows, C]: ``__call__(a, table, idx)`` returns the scores. a is read in place when its last
    dim is contiguous; the table and idx are copied when they are not contiguous, and every
    index is checked against the table, when they are first seen (``bind``)."""

    def __init__(self, a_shape: tuple, table_shape: tuple, idx_shape: tuple, transpose: bool) -> None:
        self.a_shape = tuple(int(s) for s in a_shape)
        self.h, self.r, self.d = (int(s) for s in table_shape)
        self.rows, self.c = (int(s) for s in idx_shape)
        self.n = math.prod(self.a_shape[:-2])
        self.transpose = transpose
        self.out_shape = (self.n, self.c, self.rows) if transpose else (self.n, self.rows, self.c)
        self.fn = _kernel(self.d)
        self.parallel = self.n > 1 and self.n * self.rows * self.c * self.d >= PARALLEL_MIN_FLOPS
        self.params = (ctypes.c_int64 * len(_P))()
        self.bound: tuple | None = None   # (a's strides, table, idx, their versions) the slots are set for
        self.table: Any = None
        self.idx: Any = None
        p = self.params
        p[4], p[8], p[9], p[10], p[11] = 1, self.h, self.r, self.rows, self.c
        p[12], p[13] = (1, self.rows) if transpose else (self.c, 1)

    def check_index(self, idx: Any) -> None:
        """Every index inside the table's R positions."""
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= self.r):
            raise IndexError(f"rel_scores: an index of idx is outside the table's {self.r} positions "
                             f"(min {int(idx.min())}, max {int(idx.max())})")

    def bind(self, a: Any, table: Any, idx: Any) -> None:
        """The parameter slots for a's strides, the table and idx (checked; copies kept alive
        while they are bound): a program's step sees the same ones at every call."""
        p = self.params
        self.bound = (a.stride(), table, idx, table._version, idx._version)
        if table.is_contiguous():
            self.table = table
        else:
            self.table = table.contiguous()
        self.idx = idx if idx.dtype == torch.int64 and idx.is_contiguous() else idx.to(torch.int64).contiguous()
        self.check_index(self.idx)
        p[1], p[2] = self.table.data_ptr(), self.idx.data_ptr()
        if a.dim() == 4:
            p[4], p[5], p[6], p[7] = a.shape[1], a.stride(0), a.stride(1), a.stride(2)
        else:
            p[4], p[5], p[6], p[7] = 1, a.stride(0), 0, a.stride(1)

    def __call__(self, a: Any, table: Any, idx: Any) -> Any:
        """The scores for a, table and idx."""
        if a.stride(-1) != 1:
            a = a.contiguous()
        b = self.bound
        if b is None or b[0] != a.stride() or b[1] is not table or b[2] is not idx or b[3] != table._version \
                or b[4] != idx._version:
            self.bind(a, table, idx)
        out = torch.empty(self.out_shape, dtype=torch.float32)
        p = self.params
        p[0], p[3] = a.data_ptr(), out.data_ptr()
        nt = min(torch.get_num_threads(), self.n) if self.parallel else 1
        if nt <= 1:
            self.fn(p, 0, self.n, 0)
        else:
            from .cpu import split_on_team

            split_on_team(self.fn, p, self.n, nt)
        return out


def rel_scores_kernel(node: Any, inplace: bool = False) -> Any:
    """The step running a ``rel_scores`` node on the generated kernel, or None (the op's own
    ATen step) where no code can be generated here."""
    del inplace
    a, table, idx = (v.type for v in node.operands)
    shapes = (*a.shape, *table.shape, *idx.shape)
    if node.op != "rel_scores" or a.dtype is not f32 or any(not isinstance(s, int) for s in shapes) \
            or node.results[0].type.numel == 0:
        return None
    try:
        pr = PreparedRelScores(tuple(a.shape), tuple(table.shape), tuple(idx.shape), bool(node.attrs["transpose"]))
    except Exception as e:  # no code generator here, or CodegenError: ATen runs it
        import warnings

        warnings.warn(f"partita: the generated rel_scores did not compile ({e}); ATen runs it", RuntimeWarning,
                      stacklevel=2)
        return None
    fallback = op_on_aten("rel_scores")

    def step(args: list, attrs: dict) -> Any:
        if not args[0].is_cpu:
            return fallback(args, attrs)
        return pr(*args)
    return step

