"""Generated attention: ``softmax(q k^T * scale + mask) v`` for f32 on the CPU, one native call,
in FlashAttention's formulation (an online softmax over blocks of keys, nothing T x S stored).

For each batch-and-head pair the kernel packs ``k^T``, scaled, into blocks of ``KB`` keys
(``[S / KB, E, KB]``: 32 KiB for a head of 128 keys, 64 wide), then for each tile of ``MR`` query
rows and each block of ``KB`` keys (``MR x KB`` = 6 x 64 on AVX-512, 6 x 16 on AVX2):

    s     = q[tile] @ k^T[block]                         # MR x KB accumulators in registers
    s     = -inf where masked (keys past S; causal: j > i), + the additive mask if any
    m'    = max(m, rowmax(s));  p = exp(s - m');  alpha = exp(m - m')
    l     = l * alpha + rowsum(p)
    o     = o * alpha + p @ v[block]                     # o: MR x Ev in L1, v read in place

and at the end ``out = o / l`` and ``lse = m + log(l)`` (natural log; ``attention_grad``
reads it). A row whose every score is dropped gives zeros and lse 0, as the op's record says.
Causal tiles stop at the last key their last row sees, the scores and softmax of a block run
on only the key vectors it sees (one copy of that code per count), and the ``p @ v`` loop runs
over the visible keys only. The exponentials are inlined vector code (``mathlib.exp_neg_ir``:
Cody-Waite range reduction and the degree-6 polynomial of ``mathlib``'s exp, for arguments
<= 0). With ``rope`` (the ``rotary_attention`` op, codegen/rotary.py) q's rows are rotated
into the tile buffer and k's rows as they are packed.

q, k, v, out, lse and the mask are read where they are: up to two leading dims (batch, head)
with any strides, rows with any stride, the last dim contiguous; a mask with stride 0 on the
dims it broadcasts over. ``PreparedAttention`` writes ``out`` as [batch, T, heads, Ev] memory
behind a [batch, heads, T, Ev] view, so the transpose and reshape that usually follow are free.
Threads (more than one torch thread) split the batch-and-head pairs on torch's OpenMP team.
"""

from __future__ import annotations

import ctypes
import math
import struct
import threading
from dataclasses import dataclass
from typing import Any, Callable

from ..ops._lazy import torch
from .jit import jit
from .lowering import vector_width
from .mathlib import declarations, exp_neg_ir
from .narrow_attention import narrow_config

__all__ = ["AttentionConfig", "attention_config", "attention_ir", "PreparedAttention", "supported", "MAX_KEYS"]

# Keys above this run the library's flash kernel: a head's packed k^T (S x E floats, 512 KiB at
# 2048 x 64) is read for every tile of query rows and stays in L2 up to about this (measured at
# 2048 causal keys: 0.70 of flash's time on one thread, Zen 4).
MAX_KEYS = 2048


@dataclass(frozen=True)
class AttentionConfig:
    lanes: int  # f32 per vector register
    mr: int     # query rows per tile
    nvs: int    # vectors of keys per block (KB = nvs * lanes)
    nvo: int    # vectors of out columns per pass of p @ v (the tile's MR x nvo accumulators)

    @property
    def kb(self) -> int:
        return self.nvs * self.lanes


def attention_config(lanes: int | None = None) -> AttentionConfig:
    """The tile for this CPU: 6 x 64 keys and 6 x 64 out columns on AVX-512 (24 accumulators
    of the 32 registers, as the GEMM's 6 x 64 tile), 6 x 16 on AVX2 (12 of 16)."""
    lanes = lanes or vector_width()
    if lanes >= 16:
        return AttentionConfig(lanes=16, mr=6, nvs=4, nvo=4)
    return AttentionConfig(lanes=8, mr=6, nvs=2, nvo=2)


# i64 parameter slots (pointers as integers, strides in floats; scale as its f32 bits)
_P = ["q", "k", "v", "o", "lse", "mask", "ws", "wsn", "B2",
      "qs1", "qs2", "qr", "ks1", "ks2", "kr", "vs1", "vs2", "vr", "os1", "os2", "or", "ls1", "ls2",
      "ms1", "ms2", "mr", "T", "S", "causal", "scale", "cos", "sin", "cs1", "cs2", "cr", "ss1", "ss2", "sr",
      "grp", "cap"]
_PTRS = ("q", "k", "v", "o", "lse", "mask", "ws", "cos", "sin")
_COS, _SIN = _P.index("cos"), _P.index("sin")


def attention_ir(name: str, cfg: AttentionConfig, e: int, ev: int, mask: str = "", rope: bool = False,
                 rot_dim: int = 0, softcap: bool = False, pairs: bool = False) -> str:
    """The LLVM IR of one attention kernel for head sizes ``e`` (q, k) and ``ev`` (v, a multiple
    of the lanes), with no mask (``mask=""``), an additive f32 one (``"f32"``) or a bool one
    that keeps the true scores (``"bool"``); ``rope``: q and k are rotated first, row i by
    ``x * cos[i] + rotate_half(x) * sin[i]`` (``rotate_half(x) = concat(-x[h:], x[:h])``,
    h = e / 2; self-attention, T = S), q's rows into a tile buffer, k's as they are packed:

        void NAME(ptr params, i64 lo, i64 hi, i64 tid)

    computing the batch-and-head pairs [lo, hi) with thread ``tid``'s workspace (``params``:
    the i64s of ``_P``). ``rot_dim`` (rope; 0 for all of e): only the first ``rot_dim`` of each
    head are rotated (h = rot_dim / 2), the rest read as they are. ``softcap``: each scaled score
    s becomes ``cap * tanh(s)`` before the mask (the caller folds 1 / cap into the scale; cap is
    the ``cap`` parameter). The k/v head of pair (b1, b2) is b2 / ``grp`` (grouped-query
    attention reads each key/value head for ``grp`` query heads in a row). ``pairs`` (rope): the
    rotated elements pair up as (2i, 2i + 1) instead of (i, i + h) (GPT-J's rotate_every_two,
    ``rotate_pairs(x)[2i] = -x[2i + 1]``, ``[2i + 1] = x[2i]``; the tables as repeat_interleave'd)."""
    rd = rot_dim or e
    assert ev % cfg.lanes == 0 and e > 0 and mask in ("", "f32", "bool") and (not rope or (rd % 2 == 0 and rd <= e))
    out = _AttentionEmitter(name, cfg, e, ev, mask, rope, rd, softcap, pairs).emit()
    return "\n\n".join(_attention_declarations(cfg.lanes)) + "\n\n" + "\n".join(out) + "\n"


def _attention_declarations(L: int) -> list[str]:
    """The declarations the attention kernel needs: the math library's, the vector exp and the intrinsics."""
    vt = f"<{L} x float>"
    return [declarations(set()), exp_neg_ir(L),
            f"declare {vt} @llvm.fma.v{L}f32({vt}, {vt}, {vt})",
            f"declare {vt} @llvm.maxnum.v{L}f32({vt}, {vt})",
            f"declare {vt} @llvm.rint.v{L}f32({vt})",
            f"declare float @llvm.vector.reduce.fmax.v{L}f32({vt})",
            f"declare float @llvm.vector.reduce.fadd.v{L}f32(float, {vt})",
            f"declare {vt} @llvm.masked.load.v{L}f32.p0(ptr, i32, <{L} x i1>, {vt})",
            f"declare <{L} x i8> @llvm.masked.load.v{L}i8.p0(ptr, i32, <{L} x i1>, <{L} x i8>)",
            "declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)"]


class _AttentionEmitter:
    """The lines of one attention kernel's function (``attention_ir``), emitted part by part into ``out``."""

    U = 4                          # steps of e per trip of the score loop
    NINF = "0xFFF0000000000000"    # -inf

    def __init__(self, name: str, cfg: AttentionConfig, e: int, ev: int, mask: str, rope: bool, rd: int = 0,
                 softcap: bool = False, pairs: bool = False) -> None:
        self.name, self.e, self.ev, self.mask, self.rope = name, e, ev, mask, rope
        self.pairs = pairs
        self.L, self.MR, self.NVS, self.KB = cfg.lanes, cfg.mr, cfg.nvs, cfg.kb
        L = self.L
        self.rd = rd or e
        self.softcap = softcap
        self.h = self.rd // 2
        self.has_mask = bool(mask)
        CH = cfg.nvo * L                       # out columns per pass
        self.chunks = [(c0, min(CH, ev - c0) // L) for c0 in range(0, ev, CH)]
        self.vt = f"<{L} x float>"
        self.vi = f"<{L} x i32>"
        # the rotation's vectors: the widest of at most L lanes (4 or more) that divides half a head
        self.RL = next((w for w in (L, L // 2, L // 4) if w >= 4 and self.h % w == 0), 0)
        self.vec_rope = rope and self.rd == e and self.RL > 0
        self.lanes_i32 = [f"<{', '.join(f'i32 {v * L + i}' for i in range(L))}>" for v in range(self.NVS)]
        # the block that enters the key blocks
        self.tile = f"qrot{self.MR - 1}.end" if rope and not self.vec_rope else "qt"
        self.out: list[str] = []

    def emit(self) -> list[str]:
        """The whole function: per batch-and-head pair, k^T packed, then per tile of query rows the key blocks."""
        self.prologue()
        self.head_pointers()
        self.pack_k()
        self.query_tile()
        self.rotate_q()
        self.key_block_head()
        for nv in range(1, self.NVS + 1):
            self.block(nv)
        self.join_blocks()
        for ci, (c0, nv) in enumerate(self.chunks):
            self.pv_chunk(ci, c0, nv)
        self.finish_tile()
        self.loop_ends()
        return self.out

    # --- helpers emitting a few lines -------------------------------------------------------

    def splat(self, dst: str, ty: str, scalar: str) -> None:
        """%dst = every lane of a <L x ty> vector holding the scalar value ``scalar``."""
        a, L = self.out.append, self.L
        vty = f"<{L} x {ty}>"
        a(f"  {dst}.0 = insertelement {vty} poison, {ty} {scalar}, i64 0")
        a(f"  {dst} = shufflevector {vty} {dst}.0, {vty} poison, <{L} x i32> zeroinitializer")

    def rot(self, tag: str, row: str, ei: str, pos: str, x: str) -> None:
        """%{tag}.rot = x * cos[pos, ei] + rotate_half(row)[ei] * sin[pos, ei] (x itself at ei >= rd)."""
        a, h = self.out.append, self.h
        partial = self.rd < self.e
        if partial:   # the indices below stay inside the rotated part; the select at the end keeps x
            a(f"  %{tag}.in = icmp ult i64 {ei}, {self.rd}")
            a(f"  %{tag}.ei = select i1 %{tag}.in, i64 {ei}, i64 0")
            ei = f"%{tag}.ei"
        if self.pairs:   # the partner of 2i is 2i + 1 and back; the even one takes the negation
            a(f"  %{tag}.odd = and i64 {ei}, 1")
            a(f"  %{tag}.lo = icmp eq i64 %{tag}.odd, 0")
            a(f"  %{tag}.pi = xor i64 {ei}, 1")
        else:
            a(f"  %{tag}.lo = icmp ult i64 {ei}, {h}")
            a(f"  %{tag}.pi0 = add i64 {ei}, {h}")
            a(f"  %{tag}.pi1 = sub i64 {ei}, {h}")
            a(f"  %{tag}.pi = select i1 %{tag}.lo, i64 %{tag}.pi0, i64 %{tag}.pi1")
        a(f"  %{tag}.pp = getelementptr float, ptr {row}, i64 %{tag}.pi")
        a(f"  %{tag}.pv = load float, ptr %{tag}.pp, align 4")
        a(f"  %{tag}.pn = fneg float %{tag}.pv")
        a(f"  %{tag}.rh = select i1 %{tag}.lo, float %{tag}.pn, float %{tag}.pv")
        for t, st in (("c", "cr"), ("s", "sr")):
            src = "cosh" if t == "c" else "sinh"
            a(f"  %{tag}.{t}o0 = mul i64 {pos}, %{st}")
            a(f"  %{tag}.{t}o = add i64 %{tag}.{t}o0, {ei}")
            a(f"  %{tag}.{t}p = getelementptr float, ptr %{src}, i64 %{tag}.{t}o")
            a(f"  %{tag}.{t}v = load float, ptr %{tag}.{t}p, align 4")
        a(f"  %{tag}.m1 = fmul float {x}, %{tag}.cv")
        a(f"  %{tag}.m2 = fmul float %{tag}.rh, %{tag}.sv")
        if partial:
            a(f"  %{tag}.rt = fadd float %{tag}.m1, %{tag}.m2")
            a(f"  %{tag}.rot = select i1 %{tag}.in, float %{tag}.rt, float {x}")
        else:
            a(f"  %{tag}.rot = fadd float %{tag}.m1, %{tag}.m2")

    def vrot(self, tag: str, row: str, pos: str, dst: str, scale: str | None) -> None:
        """dst[0:E] = rope(row)[0:E] (times scale) with vectors: the low half x_lo c - x_hi s,
        the high half x_hi c + x_lo s, at position pos of the cos and sin tables."""
        a, L, h = self.out.append, self.RL, self.h
        vt = f"<{L} x float>"
        if self.pairs:
            self.vrot_pairs(tag, row, pos, dst, scale)
            return
        sp = self.vrot_tables(tag, pos, scale)
        for i in range(h // L):
            for part, off in (("lo", i * L), ("hi", h + i * L)):
                a(f"  %{tag}.{part}p{i} = getelementptr float, ptr {row}, i64 {off}")
                a(f"  %{tag}.{part}{i} = load {vt}, ptr %{tag}.{part}p{i}, align 4")
            for part, off in (("lo", i * L), ("hi", h + i * L)):
                for t in ("c", "s"):
                    a(f"  %{tag}.{t}{part}p{i} = getelementptr float, ptr %{tag}.{t}r, i64 {off}")
                    a(f"  %{tag}.{t}{part}{i} = load {vt}, ptr %{tag}.{t}{part}p{i}, align 4")
            # low: x_lo * c_lo + (-x_hi) * s_lo; high: x_hi * c_hi + x_lo * s_hi (rounded as the ops)
            a(f"  %{tag}.nh{i} = fneg {vt} %{tag}.hi{i}")
            for part, x, rh in (("lo", f"%{tag}.lo{i}", f"%{tag}.nh{i}"), ("hi", f"%{tag}.hi{i}", f"%{tag}.lo{i}")):
                a(f"  %{tag}.{part}m1_{i} = fmul {vt} {x}, %{tag}.c{part}{i}")
                a(f"  %{tag}.{part}m2_{i} = fmul {vt} {rh}, %{tag}.s{part}{i}")
                a(f"  %{tag}.{part}r{i} = fadd {vt} %{tag}.{part}m1_{i}, %{tag}.{part}m2_{i}")
                res = f"%{tag}.{part}r{i}"
                if sp is not None:
                    a(f"  %{tag}.{part}rs{i} = fmul {vt} {res}, {sp}")
                    res = f"%{tag}.{part}rs{i}"
                off = i * L if part == "lo" else h + i * L
                a(f"  %{tag}.{part}d{i} = getelementptr inbounds float, ptr {dst}, i64 {off}")
                a(f"  store {vt} {res}, ptr %{tag}.{part}d{i}, align 4")

    def vrot_tables(self, tag: str, pos: str, scale: str | None) -> str | None:
        """The cos and sin rows at position ``pos`` (``%tag.cr``, ``%tag.sr``) and, with a
        ``scale``, its splat over RL lanes: the splat's name, else None."""
        a, L = self.out.append, self.RL
        vt = f"<{L} x float>"
        for t, st in (("c", "cr"), ("s", "sr")):
            src = "cosh" if t == "c" else "sinh"
            a(f"  %{tag}.{t}o = mul i64 {pos}, %{st}")
            a(f"  %{tag}.{t}r = getelementptr float, ptr %{src}, i64 %{tag}.{t}o")
        if scale is None:
            return None
        a(f"  %{tag}.sc.0 = insertelement {vt} poison, float {scale}, i64 0")
        a(f"  %{tag}.sc = shufflevector {vt} %{tag}.sc.0, {vt} poison, <{L} x i32> zeroinitializer")
        return f"%{tag}.sc"

    def vrot_pairs(self, tag: str, row: str, pos: str, dst: str, scale: str | None) -> None:
        """dst[0:E] = rope(row)[0:E] (times scale) for pairs (2i, 2i + 1) with vectors of RL lanes:
        x c + rotate_pairs(x) s, rotate_pairs(x) a shuffle of x and -x."""
        a, L = self.out.append, self.RL
        vt = f"<{L} x float>"
        mask = ", ".join(f"i32 {j + 1 if j % 2 == 0 else L + j - 1}" for j in range(L))
        sp = self.vrot_tables(tag, pos, scale)
        for i in range(self.e // L):
            off = i * L
            a(f"  %{tag}.xp{i} = getelementptr float, ptr {row}, i64 {off}")
            a(f"  %{tag}.x{i} = load {vt}, ptr %{tag}.xp{i}, align 4")
            for t in ("c", "s"):
                a(f"  %{tag}.{t}p{i} = getelementptr float, ptr %{tag}.{t}r, i64 {off}")
                a(f"  %{tag}.{t}{i} = load {vt}, ptr %{tag}.{t}p{i}, align 4")
            # rh[2j] = -x[2j + 1], rh[2j + 1] = x[2j]: lanes of (-x, x)
            a(f"  %{tag}.n{i} = fneg {vt} %{tag}.x{i}")
            a(f"  %{tag}.rh{i} = shufflevector {vt} %{tag}.n{i}, {vt} %{tag}.x{i}, <{L} x i32> <{mask}>")
            a(f"  %{tag}.m1_{i} = fmul {vt} %{tag}.x{i}, %{tag}.c{i}")
            a(f"  %{tag}.m2_{i} = fmul {vt} %{tag}.rh{i}, %{tag}.s{i}")
            a(f"  %{tag}.r{i} = fadd {vt} %{tag}.m1_{i}, %{tag}.m2_{i}")
            res = f"%{tag}.r{i}"
            if sp is not None:
                a(f"  %{tag}.rs{i} = fmul {vt} {res}, {sp}")
                res = f"%{tag}.rs{i}"
            a(f"  %{tag}.d{i} = getelementptr inbounds float, ptr {dst}, i64 {off}")
            a(f"  store {vt} {res}, ptr %{tag}.d{i}, align 4")

    # --- the parts of the kernel, in order ---------------------------------------------------

    def prologue(self) -> None:
        """The signature, the stack buffers, the parameters read from ``params`` and this thread's k^T workspace."""
        a, MR, KB, e, ev = self.out.append, self.MR, self.KB, self.e, self.ev
        a(f"define void @{self.name}(ptr noalias %pp, i64 %lo, i64 %hi, i64 %tid) nounwind {{")
        a("entry:")
        a(f"  %Pb = alloca [{MR * KB} x float], align 64")
        a(f"  %Ob = alloca [{MR * ev} x float], align 64")
        if self.softcap:
            a(f"  %Tb = alloca [{self.L} x float], align 64")
        if self.rope:
            a(f"  %Qb = alloca [{MR * e} x float], align 64")
            a(f"  %Kr = alloca [{e} x float], align 64")
        for i, p in enumerate(_P):
            a(f"  %{p}.p = getelementptr inbounds i64, ptr %pp, i64 {i}")
            a(f"  %{p}.i = load i64, ptr %{p}.p, align 8")
            if p in _PTRS:
                a(f"  %{p} = inttoptr i64 %{p}.i to ptr")
            elif p not in ("scale", "cap"):
                a(f"  %{p} = add i64 %{p}.i, 0")
        for p in ("scale", "cap"):
            a(f"  %{p}.t = trunc i64 %{p}.i to i32")
            a(f"  %{p} = bitcast i32 %{p}.t to float")
        a("  %iscausal = icmp ne i64 %causal, 0")
        a("  %wso = mul i64 %tid, %wsn")
        a("  %KT = getelementptr inbounds float, ptr %ws, i64 %wso")

    def head_pointers(self) -> None:
        """The loop over batch-and-head pairs: each operand's pointer to the pair's head."""
        a = self.out.append
        a("  %empty = icmp uge i64 %lo, %hi")
        a("  br i1 %empty, label %exit, label %bh")
        # --- one batch-and-head pair -------------------------------------------------------
        a("bh:")
        a("  %idx = phi i64 [%lo, %entry], [%idx.n, %bh.end]")
        a("  %b1 = udiv i64 %idx, %B2")
        a("  %b2 = urem i64 %idx, %B2")
        a("  %b2kv = udiv i64 %b2, %grp")    # the key/value head this query head reads
        for t, (s1, s2) in {"q": ("qs1", "qs2"), "k": ("ks1", "ks2"), "v": ("vs1", "vs2"), "o": ("os1", "os2"),
                            "lse": ("ls1", "ls2"), "mask": ("ms1", "ms2"), "cos": ("cs1", "cs2"),
                            "sin": ("ss1", "ss2")}.items():
            a(f"  %{t}o1 = mul i64 %b1, %{s1}")
            a(f"  %{t}o2 = mul i64 %b2{'kv' if t in ('k', 'v') else ''}, %{s2}")
            a(f"  %{t}o = add i64 %{t}o1, %{t}o2")
            ty = 'i8' if t == 'mask' and self.mask == 'bool' else 'float'
            a(f"  %{t}h = getelementptr {ty}, ptr %{t}, i64 %{t}o")

    def pack_k(self) -> None:
        """k^T packed, scaled (rotated with rope): KT[(j / KB) * E * KB + e * KB + j % KB] = scale * k[j, e]."""
        a, KB, e = self.out.append, self.KB, self.e
        a("  br label %pk.t")
        a("pk.t:")
        a("  %pkt = phi i64 [0, %bh], [%pkt.n, %pk.t.end]")
        a(f"  %pkb = udiv i64 %pkt, {KB}")
        a(f"  %pkj = urem i64 %pkt, {KB}")
        a("  %pks0 = mul i64 %pkt, %kr")
        if self.vec_rope:  # the key's row rotated and scaled into Kr, packed from there
            a("  %pksrow0 = getelementptr float, ptr %kh, i64 %pks0")
            self.vrot("kr", "%pksrow0", "%pkt", "%Kr", "%scale")
            a("  %pksrow = getelementptr float, ptr %Kr, i64 0")
        else:
            a("  %pksrow = getelementptr float, ptr %kh, i64 %pks0")
        a(f"  %pkd0 = mul i64 %pkb, {e * KB}")
        a("  %pkd1 = add i64 %pkd0, %pkj")
        a("  %pkdst = getelementptr inbounds float, ptr %KT, i64 %pkd1")
        a("  br label %pk.e")
        a("pk.e:")
        a("  %pke = phi i64 [0, %pk.t], [%pke.n, %pk.e]")
        a("  %pksp = getelementptr float, ptr %pksrow, i64 %pke")
        a("  %pkv0 = load float, ptr %pksp, align 4")
        pkv = "%pkv"
        if self.vec_rope:
            pkv = "%pkv0"
        elif self.rope:  # k[j, e] cos[j, e] + rotate_half(k)[j, e] sin[j, e], as the unfused ops round it
            self.rot("pk", "%pksrow", "%pke", "%pkt", "%pkv0")
            a("  %pkv = fmul float %pk.rot, %scale")
        else:
            a("  %pkv = fmul float %pkv0, %scale")
        a(f"  %pkdo = mul i64 %pke, {KB}")
        a("  %pkd = getelementptr inbounds float, ptr %pkdst, i64 %pkdo")
        a(f"  store float {pkv}, ptr %pkd, align 4")
        a("  %pke.n = add nuw nsw i64 %pke, 1")
        a(f"  %pkec = icmp ult i64 %pke.n, {e}")
        a("  br i1 %pkec, label %pk.e, label %pk.t.end")
        a("pk.t.end:")
        a("  %pkt.n = add i64 %pkt, 1")
        a("  %pktc = icmp ult i64 %pkt.n, %S")
        a("  br i1 %pktc, label %pk.t, label %qt")

    def query_tile(self) -> None:
        """The loop over tiles of MR query rows: the keys the tile sees, each row's q and mask rows and key limit."""
        a, MR, e, mask = self.out.append, self.MR, self.e, self.mask
        a("qt:")
        a("  %q0 = phi i64 [0, %pk.t.end], [%q1, %qt.end]")
        a("  %qrem = sub i64 %T, %q0")
        a(f"  %qbig = icmp ugt i64 %qrem, {MR}")
        a(f"  %rows = select i1 %qbig, i64 {MR}, i64 %qrem")
        a("  %q1 = add i64 %q0, %rows")
        a("  %rowl = sub i64 %rows, 1")
        # keys the tile sees: all, or (causal) those up to its last row
        a("  %kc0 = icmp ult i64 %q1, %S")
        a("  %kcau = select i1 %kc0, i64 %q1, i64 %S")
        a("  %kend = select i1 %iscausal, i64 %kcau, i64 %S")
        for r in range(MR):  # rows past the tile read the last row again (never stored)
            a(f"  %rlt{r} = icmp ult i64 {r}, %rows")
            a(f"  %rr{r} = select i1 %rlt{r}, i64 {r}, i64 %rowl")
            a(f"  %gi{r} = add i64 %q0, %rr{r}")
            a(f"  %qro{r} = mul i64 %gi{r}, %qr")
            a(f"  %qrow{r}.src = getelementptr float, ptr %qh, i64 %qro{r}")
            if self.rope:
                a(f"  %qrow{r} = getelementptr inbounds float, ptr %Qb, i64 {r * e}")
            else:
                a(f"  %qrow{r} = getelementptr float, ptr %qrow{r}.src, i64 0")
            if self.has_mask:
                a(f"  %mro{r} = mul i64 %gi{r}, %mr")
                a(f"  %mrow{r} = getelementptr {'float' if mask == 'f32' else 'i8'}, ptr %maskh, i64 %mro{r}")
            # the keys row r sees: S, or (causal) min(S, i + 1)
            a(f"  %gi1{r} = add i64 %gi{r}, 1")
            a(f"  %lc{r} = icmp ult i64 %gi1{r}, %S")
            a(f"  %lcau{r} = select i1 %lc{r}, i64 %gi1{r}, i64 %S")
            a(f"  %lim{r} = select i1 %iscausal, i64 %lcau{r}, i64 %S")

    def rotate_q(self) -> None:
        """With rope, the tile's q rows rotated into Qb (vectors when half a head is whole vectors)."""
        a, MR, e = self.out.append, self.MR, self.e
        if self.vec_rope:  # the tile's q rows rotated into Qb
            for r in range(MR):
                self.vrot(f"qv{r}", f"%qrow{r}.src", f"%gi{r}", f"%qrow{r}", None)
        elif self.rope:
            for r in range(MR):
                a(f"  br label %qrot{r}")
                a(f"qrot{r}:")
                a(f"  %qre{r} = phi i64 [0, %{'qt' if r == 0 else f'qrot{r - 1}.end'}], [%qre{r}.n, %qrot{r}]")
                a(f"  %qrp{r} = getelementptr float, ptr %qrow{r}.src, i64 %qre{r}")
                a(f"  %qrx{r} = load float, ptr %qrp{r}, align 4")
                self.rot(f"qr{r}", f"%qrow{r}.src", f"%qre{r}", f"%gi{r}", f"%qrx{r}")
                a(f"  %qrd{r} = getelementptr inbounds float, ptr %qrow{r}, i64 %qre{r}")
                a(f"  store float %qr{r}.rot, ptr %qrd{r}, align 4")
                a(f"  %qre{r}.n = add nuw nsw i64 %qre{r}, 1")
                a(f"  %qrc{r} = icmp ult i64 %qre{r}.n, {e}")
                a(f"  br i1 %qrc{r}, label %qrot{r}, label %qrot{r}.end")
                a(f"qrot{r}.end:")

    def key_block_head(self) -> None:
        """The tile's out buffer cleared, then the key-block loop's head: the keys each row sees, the switch on nv."""
        a, L, MR, KB, NVS, e, tile = self.out.append, self.L, self.MR, self.KB, self.NVS, self.e, self.tile
        a(f"  call void @llvm.memset.p0.i64(ptr align 64 %Ob, i8 0, i64 {4 * MR * self.ev}, i1 false)")
        a("  %nokeys = icmp eq i64 %kend, 0")
        a("  br i1 %nokeys, label %fin, label %kb")
        # --- one block of KB keys --------------------------------------------------------------
        a("kb:")
        a(f"  %j0 = phi i64 [0, %{tile}], [%j0.n, %kb.end]")
        for r in range(MR):
            a(f"  %m{r} = phi float [{self.NINF}, %{tile}], [%mn{r}, %kb.end]")
            a(f"  %l{r} = phi float [0.0, %{tile}], [%ln{r}, %kb.end]")
        a("  %krem = sub i64 %kend, %j0")
        a(f"  %kbig = icmp ugt i64 %krem, {KB}")
        a(f"  %kn = select i1 %kbig, i64 {KB}, i64 %krem")
        a(f"  %ktb = mul i64 %j0, {e}")
        a("  %KTb = getelementptr inbounds float, ptr %KT, i64 %ktb")
        # The scores and the softmax of a block with nv vectors of keys (nv = ceil(kn / L): a causal
        # tile's last block and a short sequence compute only the key vectors they see), one copy
        # of the code per nv, joined before p @ v.
        # the keys of the block each row sees, as a count from j0 (0 to KB)
        for r in range(MR):
            a(f"  %dl{r}.0 = sub i64 %lim{r}, %j0")
            a(f"  %dl{r}.1 = icmp slt i64 %dl{r}.0, {KB}")
            a(f"  %dl{r}.2 = select i1 %dl{r}.1, i64 %dl{r}.0, i64 {KB}")
            a(f"  %dl{r}.3 = icmp sgt i64 %dl{r}.2, 0")
            a(f"  %dl{r}.4 = select i1 %dl{r}.3, i64 %dl{r}.2, i64 0")
            a(f"  %dl{r} = trunc i64 %dl{r}.4 to i32")
            self.splat(f"%dv{r}", "i32", f"%dl{r}")
        a(f"  %knv0 = add i64 %kn, {L - 1}")
        a(f"  %knv = udiv i64 %knv0, {L}")
        a(f"  switch i64 %knv, label %kbv{NVS} [" + " ".join(f"i64 {n}, label %kbv{n}" for n in range(1, NVS)) + "]")

    def sstep(self, tag: str, nv: int, e_off: str, accs: list[list[str]]) -> list[list[str]]:
        """One step of e of the scores: nv vectors of k^T, MR broadcasts of q, MR x nv FMAs."""
        a, L, vt = self.out.append, self.L, self.vt
        bs = []
        for v in range(nv):
            a(f"  %{tag}o{v} = add i64 {e_off}, {v * L}")
            a(f"  %{tag}bp{v} = getelementptr inbounds float, ptr %KTb, i64 %{tag}o{v}")
            a(f"  %{tag}b{v} = load {vt}, ptr %{tag}bp{v}, align 4")
            bs.append(f"%{tag}b{v}")
        new = []
        for r in range(self.MR):
            a(f"  %{tag}ap{r} = getelementptr float, ptr %qrow{r}, i64 %{tag}e")
            a(f"  %{tag}a{r} = load float, ptr %{tag}ap{r}, align 4")
            self.splat(f"%{tag}as{r}", "float", f"%{tag}a{r}")
            row = []
            for v in range(nv):
                a(f"  %{tag}c{r}_{v} = call {vt} @llvm.fma.v{L}f32({vt} %{tag}as{r}, {vt} {bs[v]}, {vt} {accs[r][v]})")
                row.append(f"%{tag}c{r}_{v}")
            new.append(row)
        return new

    def block(self, nv: int) -> None:
        """The copy of a key block's scores and softmax for nv vectors of keys."""
        self.out.append(f"kbv{nv}:")
        cur = self.block_scores(nv)
        self.block_mask_max(nv, cur)
        self.block_softmax(nv)

    def block_scores(self, nv: int) -> list[list[str]]:
        """s = q[tile] @ k^T[block]: a loop of U steps of e, then the rest straight; the accumulators."""
        a, MR, KB, U, e, vt = self.out.append, self.MR, self.KB, self.U, self.e, self.vt
        X = f"_v{nv}"
        eu = e // U
        cur = [["zeroinitializer"] * nv for _ in range(MR)]
        if eu:
            a(f"  br label %se{X}")
            a(f"se{X}:")
            a(f"  %sei{X} = phi i64 [0, %kbv{nv}], [%sei{X}.n, %se{X}]")
            for r in range(MR):
                for v in range(nv):
                    a(f"  %sacc{X}{r}_{v} = phi {vt} [zeroinitializer, %kbv{nv}], [%su{U - 1}{X}_c{r}_{v}, %se{X}]")
            cur = [[f"%sacc{X}{r}_{v}" for v in range(nv)] for r in range(MR)]
            a(f"  %se0{X} = mul i64 %sei{X}, {U}")
            for u in range(U):
                tag = f"su{u}{X}_"
                a(f"  %{tag}e = add i64 %se0{X}, {u}")
                a(f"  %{tag}eo = mul i64 %{tag}e, {KB}")
                cur = self.sstep(tag, nv, f"%{tag}eo", cur)
            a(f"  %sei{X}.n = add nuw nsw i64 %sei{X}, 1")
            a(f"  %secont{X} = icmp ult i64 %sei{X}.n, {eu}")
            a(f"  br i1 %secont{X}, label %se{X}, label %se.end{X}")
            a(f"se.end{X}:")
        for u in range(e % U):
            tag = f"sr{u}{X}_"
            a(f"  %{tag}e = add i64 {eu * U + u}, 0")
            a(f"  %{tag}eo = mul i64 %{tag}e, {KB}")
            cur = self.sstep(tag, nv, f"%{tag}eo", cur)
        return cur

    def block_mask_max(self, nv: int, cur: list[list[str]]) -> None:
        """The scores masked (keys not seen, the mask) and each row's new running max, in registers."""
        a, L, vt, vi, mask, ninf = self.out.append, self.L, self.vt, self.vi, self.mask, self.NINF
        X = f"_v{nv}"
        if self.softcap:
            self.splat(f"%capv{X}", "float", "%cap")
        for r in range(self.MR):
            R = f"{X}_{r}"
            mx = None
            for v in range(nv):
                sc = cur[r][v]
                if self.softcap:
                    sc = self.capped(f"{R}_{v}", sc, f"%capv{X}")
                ok = f"%ok{R}_{v}"
                a(f"  {ok} = icmp slt {vi} {self.lanes_i32[v]}, %dv{r}")
                if mask == "f32":
                    a(f"  %mo{R}_{v} = add i64 %j0, {v * L}")
                    a(f"  %mp{R}_{v} = getelementptr float, ptr %mrow{r}, i64 %mo{R}_{v}")
                    a(f"  %mv{R}_{v} = call {vt} @llvm.masked.load.v{L}f32.p0(ptr %mp{R}_{v}, i32 4, <{L} x i1> {ok}, "
                      f"{vt} zeroinitializer)")
                    a(f"  %sm{R}_{v} = fadd {vt} {sc}, %mv{R}_{v}")
                    sc = f"%sm{R}_{v}"
                elif mask == "bool":  # bytes, nonzero keeps the score
                    a(f"  %mo{R}_{v} = add i64 %j0, {v * L}")
                    a(f"  %mp{R}_{v} = getelementptr i8, ptr %mrow{r}, i64 %mo{R}_{v}")
                    a(f"  %mv{R}_{v} = call <{L} x i8> @llvm.masked.load.v{L}i8.p0(ptr %mp{R}_{v}, i32 1, "
                      f"<{L} x i1> {ok}, <{L} x i8> zeroinitializer)")
                    a(f"  %mk{R}_{v} = icmp ne <{L} x i8> %mv{R}_{v}, zeroinitializer")
                    a(f"  %okm{R}_{v} = and <{L} x i1> {ok}, %mk{R}_{v}")
                    ok = f"%okm{R}_{v}"
                a(f"  %sk{R}_{v} = select <{L} x i1> {ok}, {vt} {sc}, {vt} splat (float {ninf})")
                if mx is None:
                    mx = f"%sk{R}_{v}"
                else:
                    a(f"  %mxv{R}_{v} = call {vt} @llvm.maxnum.v{L}f32({vt} {mx}, {vt} %sk{R}_{v})")
                    mx = f"%mxv{R}_{v}"
            a(f"  %bm{R} = call float @llvm.vector.reduce.fmax.v{L}f32({vt} {mx})")
            a(f"  %mn{R} = call float @llvm.maxnum.f32(float %m{r}, float %bm{R})")
            a(f"  %mdead{R} = fcmp oeq float %mn{R}, {ninf}")
            a(f"  %mu{R} = select i1 %mdead{R}, float 0.0, float %mn{R}")
            a(f"  %da{R} = fsub float %m{r}, %mu{R}")

    def capped(self, tag: str, sc: str, capv: str) -> str:
        """cap * tanh(sc) (mathlib's tanh, as a fused kernel computes it); the result's name. The
        vector goes through the ``Tb`` buffer and a loop over its lanes, which the loop vectorizer
        turns into vector code, as in a fused kernel (lane by lane calls stayed scalar)."""
        a, L, vt = self.out.append, self.L, self.vt
        a(f"  store {vt} {sc}, ptr %Tb, align 64")
        a(f"  br label %thp{tag}")
        a(f"thp{tag}:")
        a(f"  br label %th{tag}")
        a(f"th{tag}:")
        a(f"  %thi{tag} = phi i64 [0, %thp{tag}], [%thn{tag}, %th{tag}]")
        a(f"  %thq{tag} = getelementptr inbounds float, ptr %Tb, i64 %thi{tag}")
        a(f"  %thx{tag} = load float, ptr %thq{tag}, align 4")
        a(f"  %thy{tag} = call float @pt_tanhf(float %thx{tag})")
        a(f"  store float %thy{tag}, ptr %thq{tag}, align 4")
        a(f"  %thn{tag} = add nuw nsw i64 %thi{tag}, 1")
        a(f"  %thc{tag} = icmp ult i64 %thn{tag}, {L}")
        a(f"  br i1 %thc{tag}, label %th{tag}, label %the{tag}")
        a(f"the{tag}:")
        a(f"  %thv{tag} = load {vt}, ptr %Tb, align 64")
        a(f"  %tc{tag} = fmul {vt} %thv{tag}, {capv}")
        return f"%tc{tag}"

    def block_softmax(self, nv: int) -> None:
        """alpha = exp(m - m') for the tile's rows in one vector exp, p = exp(s - m') stored, l updated."""
        a, L, MR, KB, vt = self.out.append, self.L, self.MR, self.KB, self.vt
        X = f"_v{nv}"
        prev_v = "poison"
        for r in range(MR):
            a(f"  %dav{X}_{r} = insertelement {vt} {prev_v}, float %da{X}_{r}, i64 {r}")
            prev_v = f"%dav{X}_{r}"
        a(f"  %alv{X} = call {vt} @pt_vexpf_neg{L}({vt} {prev_v})")
        for r in range(MR):
            R = f"{X}_{r}"
            a(f"  %al{R} = extractelement {vt} %alv{X}, i64 {r}")
            self.splat(f"%mus{R}", "float", f"%mu{R}")
            tot = None
            for v in range(nv):
                a(f"  %x{R}_{v} = fsub {vt} %sk{R}_{v}, %mus{R}")
                a(f"  %p{R}_{v} = call {vt} @pt_vexpf_neg{L}({vt} %x{R}_{v})")
                a(f"  %pp{R}_{v} = getelementptr inbounds float, ptr %Pb, i64 {r * KB + v * L}")
                a(f"  store {vt} %p{R}_{v}, ptr %pp{R}_{v}, align 64")
                if tot is None:
                    tot = f"%p{R}_{v}"
                else:
                    a(f"  %ps{R}_{v} = fadd {vt} {tot}, %p{R}_{v}")
                    tot = f"%ps{R}_{v}"
            a(f"  %rs{R} = call reassoc float @llvm.vector.reduce.fadd.v{L}f32(float 0.0, {vt} {tot})")
            a(f"  %lsc{R} = fmul float %l{r}, %al{R}")
            a(f"  %ln{R} = fadd float %lsc{R}, %rs{R}")
        a(f"  br label %kbv.end{nv}")
        a(f"kbv.end{nv}:")
        a("  br label %kbj")

    def join_blocks(self) -> None:
        """The copies per nv joined: the new max, sum and alpha of each row."""
        a, L, MR, NVS, vt = self.out.append, self.L, self.MR, self.NVS, self.vt
        a("kbj:")
        for r in range(MR):
            a(f"  %mn{r} = phi float " + ", ".join(f"[%mn_v{n}_{r}, %kbv.end{n}]" for n in range(1, NVS + 1)))
            a(f"  %ln{r} = phi float " + ", ".join(f"[%ln_v{n}_{r}, %kbv.end{n}]" for n in range(1, NVS + 1)))
        a(f"  %alj = phi {vt} " + ", ".join(f"[%alv_v{n}, %kbv.end{n}]" for n in range(1, NVS + 1)))
        for r in range(MR):
            a(f"  %als{r} = shufflevector {vt} %alj, {vt} poison, <{L} x i32> <{', '.join([f'i32 {r}'] * L)}>")
        a(f"  br label %pv0.pre")

    def pv_chunk(self, ci: int, c0: int, nv: int) -> None:
        """o = o * alpha + p @ v[block] for one pass of nv vectors of out columns from c0, over the visible keys."""
        a, L, MR, KB, ev, vt = self.out.append, self.L, self.MR, self.KB, self.ev, self.vt
        a(f"pv{ci}.pre:")
        init = []
        for r in range(MR):
            row = []
            for v in range(nv):
                a(f"  %oq{ci}_{r}_{v} = getelementptr inbounds float, ptr %Ob, i64 {r * ev + c0 + v * L}")
                a(f"  %oi{ci}_{r}_{v}.0 = load {vt}, ptr %oq{ci}_{r}_{v}, align 4")
                a(f"  %oi{ci}_{r}_{v} = fmul {vt} %oi{ci}_{r}_{v}.0, %als{r}")
                row.append(f"%oi{ci}_{r}_{v}")
            init.append(row)
        a(f"  br label %pv{ci}")
        a(f"pv{ci}:")
        a(f"  %pj{ci} = phi i64 [0, %pv{ci}.pre], [%pj{ci}.n, %pv{ci}]")
        for r in range(MR):
            for v in range(nv):
                a(f"  %oa{ci}_{r}_{v} = phi {vt} [{init[r][v]}, %pv{ci}.pre], [%of{ci}_{r}_{v}, %pv{ci}]")
        a(f"  %pjg{ci} = add i64 %j0, %pj{ci}")
        a(f"  %pvo{ci} = mul i64 %pjg{ci}, %vr")
        a(f"  %pvrow{ci} = getelementptr float, ptr %vh, i64 %pvo{ci}")
        for v in range(nv):
            a(f"  %vp{ci}_{v} = getelementptr float, ptr %pvrow{ci}, i64 {c0 + v * L}")
            a(f"  %vv{ci}_{v} = load {vt}, ptr %vp{ci}_{v}, align 4")
        for r in range(MR):
            a(f"  %pro{ci}_{r} = add i64 %pj{ci}, {r * KB}")
            a(f"  %prp{ci}_{r} = getelementptr inbounds float, ptr %Pb, i64 %pro{ci}_{r}")
            a(f"  %pr{ci}_{r} = load float, ptr %prp{ci}_{r}, align 4")
            self.splat(f"%prs{ci}_{r}", "float", f"%pr{ci}_{r}")
            for v in range(nv):
                a(f"  %of{ci}_{r}_{v} = call {vt} @llvm.fma.v{L}f32({vt} %prs{ci}_{r}, {vt} %vv{ci}_{v}, "
                  f"{vt} %oa{ci}_{r}_{v})")
        a(f"  %pj{ci}.n = add nuw nsw i64 %pj{ci}, 1")
        a(f"  %pjc{ci} = icmp ult i64 %pj{ci}.n, %kn")
        a(f"  br i1 %pjc{ci}, label %pv{ci}, label %pv{ci}.end")
        a(f"pv{ci}.end:")
        for r in range(MR):
            for v in range(nv):
                a(f"  store {vt} %of{ci}_{r}_{v}, ptr %oq{ci}_{r}_{v}, align 4")
        nxt = f"pv{ci + 1}.pre" if ci + 1 < len(self.chunks) else "kb.end"
        a(f"  br label %{nxt}")

    def finish_tile(self) -> None:
        """The next key block, else the tile's rows out: o / l and lse = m + log(l) (0 and 0 for a row with no key)."""
        a, L, MR, KB, ev, vt, ninf, tile = (self.out.append, self.L, self.MR, self.KB, self.ev, self.vt, self.NINF,
                                            self.tile)
        a("kb.end:")
        a(f"  %j0.n = add i64 %j0, {KB}")
        a("  %kbc = icmp ult i64 %j0.n, %kend")
        a("  br i1 %kbc, label %kb, label %fin")
        a("fin:")
        for r in range(MR):
            a(f"  %fm{r} = phi float [{ninf}, %{tile}], [%mn{r}, %kb.end]")
            a(f"  %fl{r} = phi float [0.0, %{tile}], [%ln{r}, %kb.end]")
        a("  br label %fr0")
        for r in range(MR):
            nxt = f"%fr{r + 1}" if r + 1 < MR else "%qt.end"
            a(f"fr{r}:")
            a(f"  %fin{r} = icmp ult i64 {r}, %rows")
            a(f"  br i1 %fin{r}, label %fdo{r}, label {nxt}")
            a(f"fdo{r}:")
            a(f"  %fz{r} = fcmp oeq float %fl{r}, 0.0")
            a(f"  %fli{r} = fdiv float 1.0, %fl{r}")
            a(f"  %finv{r} = select i1 %fz{r}, float 0.0, float %fli{r}")
            self.splat(f"%fiv{r}", "float", f"%finv{r}")
            a(f"  %fg{r} = add i64 %q0, {r}")
            a(f"  %foo{r} = mul i64 %fg{r}, %or")
            a(f"  %forow{r} = getelementptr float, ptr %oh, i64 %foo{r}")
            for v in range(ev // L):
                a(f"  %fs{r}_{v} = getelementptr inbounds float, ptr %Ob, i64 {r * ev + v * L}")
                a(f"  %fx{r}_{v} = load {vt}, ptr %fs{r}_{v}, align 4")
                a(f"  %fy{r}_{v} = fmul {vt} %fx{r}_{v}, %fiv{r}")
                a(f"  %fd{r}_{v} = getelementptr float, ptr %forow{r}, i64 {v * L}")
                a(f"  store {vt} %fy{r}_{v}, ptr %fd{r}_{v}, align 4")
            a(f"  %flg{r} = call float @pt_logf(float %fl{r})")
            a(f"  %flse{r}.0 = fadd float %fm{r}, %flg{r}")
            a(f"  %flse{r} = select i1 %fz{r}, float 0.0, float %flse{r}.0")
            a(f"  %flp{r} = getelementptr float, ptr %lseh, i64 %fg{r}")
            a(f"  store float %flse{r}, ptr %flp{r}, align 4")
            a(f"  br label {nxt}")

    def loop_ends(self) -> None:
        """The latches of the query-tile and batch-and-head loops, and the return."""
        a = self.out.append
        a("qt.end:")
        a("  %qc = icmp ult i64 %q1, %T")
        a("  br i1 %qc, label %qt, label %bh.end")
        a("bh.end:")
        a("  %idx.n = add i64 %idx, 1")
        a("  %idxc = icmp ult i64 %idx.n, %hi")
        a("  br i1 %idxc, label %bh, label %exit")
        a("exit:")
        a("  ret void")
        a("}")


_LOCK = threading.Lock()
_COMPILED: dict[tuple, Any] = {}

# Below this many multiply-adds a call stays on one thread.
PARALLEL_MIN_MACS = 1 << 21


def _kernel(cfg: AttentionConfig, e: int, ev: int, mask: str, rope: bool = False, rot_dim: int = 0,
            softcap: bool = False, pairs: bool = False) -> Any:
    rd = (rot_dim or e) if rope else 0
    pairs = pairs and rope
    key = (cfg, e, ev, mask, rope, rd, softcap, pairs)
    with _LOCK:
        fn = _COMPILED.get(key)
        if fn is None:
            name = (f"pt_attention_{cfg.mr}x{cfg.kb}_e{e}_v{ev}{'_' + mask if mask else ''}{'_rope' if rope else ''}"
                    f"{f'{rd}' if rope and rd != e else ''}{'_pairs' if pairs else ''}{'_softcap' if softcap else ''}")
            fn = _COMPILED[key] = jit().kernel(name, attention_ir(name, cfg, e, ev, mask, rope, rd, softcap, pairs), 0,
                                               argtypes=[ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                                         ctypes.c_int64]).fn
        return fn


def supported(q_shape: tuple, k_shape: tuple, v_shape: tuple, group: int = 1) -> str | None:
    """Why the generated kernel does not take these shapes, or None when it does; ``group``:
    k and v have 1 / group of q's heads (dim -3), query head h reading key/value head h / group."""
    lanes = vector_width()
    if len(q_shape) < 2 or len(q_shape) > 4:
        return "q is not of rank 2 to 4"
    kv_lead = tuple(q_shape[:-2])
    if group != 1:
        if len(q_shape) < 3 or q_shape[-3] % group:
            return f"q's heads are not a multiple of the key/value group {group}"
        kv_lead = kv_lead[:-1] + (q_shape[-3] // group,)
    if kv_lead != tuple(k_shape[:-2]) or kv_lead != tuple(v_shape[:-2]):
        return "batch/head dims of q, k and v differ"
    t, e = q_shape[-2:]
    s, ev = v_shape[-2:]
    if k_shape[-1] != e or k_shape[-2] != s:
        return "k's shape does not match q and v"
    if t == 0 or s == 0 or e == 0 or ev == 0 or math.prod(q_shape[:-2]) == 0:
        return "an empty dim"
    if ev % lanes:
        return f"v's head size {ev} is not a multiple of {lanes}"
    if s > MAX_KEYS:
        return f"more than {MAX_KEYS} keys"
    return None


def _lead2(t: Any, nlead: int) -> tuple[int, int]:
    """Strides of ``t``'s (at most two) leading dims as (outer, inner), 0 for a missing one."""
    st = t.stride()[:nlead]
    if nlead == 0:
        return 0, 0
    if nlead == 1:
        return 0, st[0]
    return st[0], st[1]


def _f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


class PreparedAttention:
    """One attention node's kernel: q [*lead, T, E], k [*lead, S, E], v [*lead, S, Ev] (lead of
    rank 0 to 2), f32, ``scale`` and ``causal`` fixed; ``mask`` ("" for none, "f32" or "bool")
    the kind of the mask tensor, broadcastable to [*lead, T, S], that each call passes (f32 is
    added to the scores, bool keeps the true ones). ``__call__`` returns (out, lse). Like the program
    that holds it, one call at a time (the workspaces are reused). ``group``: k and v have
    1 / group of q's heads (the last leading dim); ``rot_dim``: with rope, the rotated part of a
    head (0 for all of it); ``softcap``: scores become ``softcap * tanh(score / softcap)``
    before the mask; ``rotary_pairs``: rope rotates pairs (2i, 2i + 1) (``attention_ir``'s ``pairs``)."""

    def __init__(self, lead: tuple, t: int, s: int, e: int, ev: int, scale: float | None, causal: bool,
                 mask: str = "", cfg: AttentionConfig | None = None, rope: bool = False, group: int = 1,
                 rot_dim: int = 0, softcap: float | None = None, rotary_pairs: bool = False) -> None:
        if len(lead) > 2:
            raise ValueError("partita.codegen.attention: at most two leading dims")
        self.lead, self.t, self.s, self.e, self.ev = tuple(lead), t, s, e, ev
        self.scale = 1.0 / math.sqrt(e) if scale is None else float(scale)
        self.softcap = float(softcap) if softcap else None
        # the kernel scales by scale / cap and multiplies tanh by cap
        self.scale_bits = _f32_bits(self.scale / self.softcap if self.softcap else self.scale)
        self.cap_bits = _f32_bits(self.softcap or 1.0)
        if group < 1 or (group > 1 and (not lead or lead[-1] % group)):
            raise ValueError(f"partita.codegen.attention: {lead[-1] if lead else 1} query heads do not split into "
                             f"groups of {group}")
        self.group = group
        self.causal = bool(causal)
        self.mask = mask
        self.cfg = cfg = cfg or attention_config()
        if ev % cfg.lanes:
            raise ValueError(f"partita.codegen.attention: v's head size {ev} is not a multiple of {cfg.lanes}")
        rd = rot_dim or e
        if rope and (rd % 2 or rd > e or t != s):
            raise ValueError("partita.codegen.attention: rotary embedding needs an even rotated size within the "
                             "head and T = S")
        self.rope, self.rot_dim = rope, rd if rope else 0
        self.fn = _kernel(cfg, e, ev, mask, rope, self.rot_dim, self.softcap is not None, rotary_pairs)
        self.wsn = -(-s // cfg.kb) * cfg.kb * e + 16    # floats of one thread's packed k^T
        self.pairs = math.prod(self.lead)
        self.ws = torch.empty(self.wsn, dtype=torch.float32)
        self.parallel = self.pairs > 1 and self.pairs * t * s * (e + ev) >= PARALLEL_MIN_MACS
        self.params = (ctypes.c_int64 * len(_P))()
        self._key: tuple | None = None   # the strides the parameter slots were set for

    def out_views(self, out: Any, lse: Any) -> tuple[Any, Any]:
        """Buffers of the result's and the log-sum-exp's sizes (contiguous, as the memory plan
        gives them) as the tensors ``__call__`` writes: the result as [B, T, H, Ev] memory
        behind its [B, H, T, Ev] view where there are two leading dims."""
        lead, t, ev = self.lead, self.t, self.ev
        if len(lead) == 2:
            out = out.view(-1).view(lead[0], t, lead[1], ev).transpose(1, 2)
        return out, lse

    def __call__(self, q: Any, k: Any, v: Any, mask: Any = None, cos: Any = None, sin: Any = None,
                 out: Any = None, lse: Any = None) -> tuple[Any, Any]:
        """``(out, lse)``; written into ``out`` and ``lse`` where given (``out_views``'s)."""
        lead, t, ev = self.lead, self.t, self.ev
        if q.stride(-1) != 1:
            q = q.contiguous()
        if k.stride(-1) != 1:
            k = k.contiguous()
        if v.stride(-1) != 1:
            v = v.contiguous()
        if out is None:
            if len(lead) == 2:  # [B, T, H, Ev] memory seen as [B, H, T, Ev]: the usual transpose after is a view
                out = torch.empty(lead[0], t, lead[1], ev, dtype=torch.float32).transpose(1, 2)
            else:
                out = torch.empty(*lead, t, ev, dtype=torch.float32)
        if lse is None:
            lse = torch.empty(*lead, t, dtype=torch.float32)
        nt = min(torch.get_num_threads(), self.pairs) if self.parallel else 1
        # Every call of a program's step sees the same strides: only the pointers are set then.
        key = (q.stride(), k.stride(), v.stride(), out.stride(), lse.stride(), nt,
               (mask.shape, mask.stride()) if self.mask else None,
               (cos.shape, cos.stride(), sin.shape, sin.stride()) if self.rope else None)
        p = self.params
        if key != self._key:
            copies = self._set_params(q, k, v, mask, cos, sin, out, lse, nt)   # alive until the call ends
            self._key = None if copies else key
        else:
            p[0], p[1], p[2], p[3], p[4] = q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr()
            if self.mask:
                p[5] = mask.data_ptr()
            if self.rope:
                p[_COS], p[_SIN] = cos.data_ptr(), sin.data_ptr()
        if nt == 1:
            self.fn(p, 0, self.pairs, 0)
        else:
            from .cpu import split_on_team

            split_on_team(self.fn, p, self.pairs, nt)
        return out, lse

    def bind(self, q: Any, k: Any, v: Any, mask: Any, cos: Any, sin: Any, out: Any, lse: Any) -> bool:
        """Point the parameter block at these tensors for one thread without running the kernel
        (a step chain runs it from the block later, codegen/step_chain.py); False where an
        operand, mask or table would need a copy first (the block then points at nothing the
        chain may use)."""
        if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
            return False
        self._key = None   # the next ``__call__`` sets every slot again
        return not self._set_params(q, k, v, mask, cos, sin, out, lse, 1)

    def _set_params(self, q: Any, k: Any, v: Any, mask: Any, cos: Any, sin: Any, out: Any, lse: Any,
                    nt: int) -> list:
        """Every parameter slot for these tensors; the copies made to make a mask's or a
        table's last dim contiguous, which the slots point into (none: a later call with the
        same strides may set only the pointers)."""
        lead, t, s = self.lead, self.t, self.s
        nl = len(lead)
        copies: list = []
        mptr, ms = 0, (0, 0, 0)
        if self.mask:
            m = mask.expand(*lead, t, s)
            if s > 1 and m.stride(-1) != 1:
                m = m.contiguous()
                copies.append(m)
            ms = (*_lead2(m, nl), m.stride(-2))
            mptr = m.data_ptr()
        rp: list[int] = [0] * 8
        if self.rope:
            c = cos.expand(*lead, t, self.rot_dim)
            sn = sin.expand(*lead, t, self.rot_dim)
            if c.stride(-1) != 1:
                c = c.contiguous()
                copies.append(c)
            if sn.stride(-1) != 1:
                sn = sn.contiguous()
                copies.append(sn)
            rp = [c.data_ptr(), sn.data_ptr(), *_lead2(c, nl), c.stride(-2), *_lead2(sn, nl), sn.stride(-2)]
        b2 = lead[-1] if nl == 2 else (lead[0] if lead else 1)
        if self.ws.numel() < nt * self.wsn:
            self.ws = torch.empty(nt * self.wsn, dtype=torch.float32)
        self.params[:] = [q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(), mptr,
                          self.ws.data_ptr(), self.wsn, b2, *_lead2(q, nl), q.stride(-2), *_lead2(k, nl),
                          k.stride(-2), *_lead2(v, nl), v.stride(-2), *_lead2(out, nl), out.stride(-2),
                          *_lead2(lse, nl), *ms, t, s, int(self.causal), self.scale_bits, *rp, self.group,
                          self.cap_bits]
        return copies


import os as _os

# "generated" (the default) or "flash": which kernel an attention node the generated kernel
# takes runs (the flash kernel is the library's, aten._scaled_dot_product_flash_attention_for_cpu).
ATTENTION = _os.environ.get("PARTITA_ATTENTION", "generated")


def _prepared(node: Any, rope: bool) -> "PreparedAttention | None":
    """The generated kernel for an ``attention`` (or, ``rope``, ``rotary_attention``) node, or
    None where it does not take the node: another kernel asked for (``ATTENTION``), operands or
    tables not f32, a mask neither f32 nor bool, shapes ``supported`` refuses."""
    from ..ir.dtypes import bool_ as _bool, f32 as _f32

    if ATTENTION != "generated":
        return None
    n = 5 if rope else 3                     # q, k, v (, cos, sin), then the optional mask
    dense = node.operands[:n]
    mask = node.operands[n] if len(node.operands) > n else None
    if any(x.type.dtype is not _f32 for x in dense) or node.results[0].type.dtype is not _f32:
        return None
    if mask is not None and mask.type.dtype not in (_f32, _bool):
        return None
    qs, ks, vs = (x.type.shape for x in dense[:3])
    if any(not isinstance(d, int) for d in (*qs, *ks, *vs)):
        return None
    group = qs[-3] // ks[-3] if rope and len(qs) >= 3 and len(ks) == len(qs) and ks[-3] else 1
    cfg = None
    if supported(qs, ks, vs, group) is not None:
        narrow = None if rope else narrow_config(qs, ks, vs, group, supported)
        if narrow is None:
            return None
        cfg = AttentionConfig(*narrow)   # a head the machine's lanes do not divide (narrow_attention.py)
    kind = "" if mask is None else ("bool" if mask.type.dtype is _bool else "f32")
    extra = {"group": group, "rot_dim": node.attrs.get("rotary_dim") or 0,
             "softcap": node.attrs.get("softcap"), "rotary_pairs": bool(node.attrs.get("rotary_pairs"))} if rope else {}
    return PreparedAttention(tuple(qs[:-2]), qs[-2], ks[-2], qs[-1], vs[-1], node.attrs.get("scale"),
                             bool(node.attrs.get("causal")), kind, cfg=cfg, rope=rope, **extra)


def _written_into(pa: "PreparedAttention", outs: list | None) -> tuple[Any, Any]:
    """The (out, lse) tensors a step given the memory plan's buffers ``outs`` writes, or
    (None, None) without them."""
    if not outs or outs[0] is None or len(outs) < 2 or outs[1] is None:
        return None, None
    return pa.out_views(outs[0], outs[1])


def attention_kernel(node: Any, inplace: bool = False, outs: list | None = None) -> Any:
    """The step running an ``attention`` node on the generated kernel, or None (the op's own
    step: the flash kernel, or torch's math for what it does not take) where ``_prepared``
    refuses it. ``outs``: buffers of the memory plan for the result and the log-sum-exp,
    written at every call (the step's ``written`` attribute holds the tensors it writes)."""
    from .aten_fallback import op_on_aten

    del inplace
    pa = _prepared(node, rope=False)
    if pa is None:
        return None
    fallback = op_on_aten("attention")
    out, lse = _written_into(pa, outs)

    def step(args: list, attrs: dict) -> Any:
        q, k, v = args[:3]
        if not q.is_cpu:
            return fallback(args, attrs)
        return pa(q, k, v, args[3] if len(args) > 3 else None, out=out, lse=lse)

    setattr(step, "written", (out, lse))  # noqa: B010 (a function attribute)
    _offer_native(step, pa, out, lse, lambda a: (a[0], a[1], a[2], a[3] if len(a) > 3 else None, None, None))
    return step


def _offer_native(step: Any, pa: "PreparedAttention", out: Any, lse: Any,
                  operands: Callable[[list], tuple]) -> None:
    """Give ``step`` (writing the memory plan's ``out`` and ``lse``) a ``native_entry`` for
    codegen/step_chain.py: the kernel over every head on one thread from its parameter block,
    pointed at the call's tensors (``operands(args)``: q, k, v, mask, cos, sin)."""
    if out is None or lse is None:
        return
    from .jit import offer_native, range_entry

    def bind(args: list) -> bool:
        q, k, v, mask, cos, sin = operands(args)
        return q.is_cpu and pa.bind(q, k, v, mask, cos, sin, out, lse)

    offer_native(step, range_entry(pa.fn, ctypes.addressof(pa.params), pa.pairs, bind), (out, lse))


def rotary_attention_kernel(node: Any, inplace: bool = False, outs: list | None = None) -> Any:
    """The step running a ``rotary_attention`` node (codegen/rotary.py) on the generated kernel
    with the rotation inside, or None (the op's own step: the rotation in torch ops, then the
    attention op's step) where ``_prepared`` refuses it; ``outs`` as ``attention_kernel``'s."""
    from .aten_fallback import op_on_aten

    del inplace
    pa = _prepared(node, rope=True)
    if pa is None:
        return None
    fallback = op_on_aten("rotary_attention")
    out, lse = _written_into(pa, outs)

    def step(args: list, attrs: dict) -> Any:
        q = args[0]
        if not q.is_cpu:
            return fallback(args, attrs)
        return pa(q, args[1], args[2], args[5] if len(args) > 5 else None, args[3], args[4], out=out, lse=lse)

    setattr(step, "written", (out, lse))  # noqa: B010 (a function attribute)
    _offer_native(step, pa, out, lse, lambda a: (a[0], a[1], a[2], a[5] if len(a) > 5 else None, a[3], a[4]))
    return step
