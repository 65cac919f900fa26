"""A generated f32 Winograd convolution F(2x2, 3x3) on channels-last (NHWC) tensors, for 3 x 3
convolutions of stride 1: bias, a residual add and ReLU applied as each result is written.

Winograd's minimal filtering (Lavin and Gray, "Fast Algorithms for Convolutional Neural
Networks", 2016) computes a 2 x 2 block of outputs from a 4 x 4 block of input by

    Y = A^T [ (G g G^T) . (B^T d B) ] A         (. elementwise over the 4 x 4 positions)

so the 36 multiplies per channel pair of four outputs become 16: for every one of the 16
positions ``xi`` a GEMM ``M[xi] = V[xi] @ U[xi]`` over the channels, with ``V = B^T d B`` the
transformed input of every 2 x 2 output tile, ``U = G g G^T`` the transformed weight (made once,
when the weight is packed). 2.25 times fewer multiply-adds than the direct kernel (conv.py) for
the price of the two transforms, additions along the channel vectors; the errors stay those of
f32 sums (the transforms' coefficients are 0, +-1 and +-1/2; see tests/codegen/test_winograd.py).

The kernel works on blocks of ``TB`` output tiles (tiles numbered over (image, tile row, tile
column)), each block in three phases on a per-thread scratch that stays in L2:

1. input transform: each tile's 4 x 4 x C input (a position outside the image reads a row of
   zeros, ``@<name>_zero``) becomes ``V[xi][t][:]``, L channels at a time;
2. 16 GEMMs ``M[xi][t][:] = V[xi][t][:] @ U[xi]``: the register tile of ``conv_configs``
   (MR tiles x NR output channels) through all of K = C, the weight's panels
   ``[16, ceil(Co / NR), C, NR]`` read straight on;
3. output transform: ``A^T M A`` for each tile, L output channels at a time, then the bias, the
   residual and the activation, each of the 2 x 2 results inside the image written once.

Every dimension is a constant of the kernel. The kernel is
``NAME(ptr params, i64 lo, i64 hi, i64 tid)`` over the blocks ``[lo, hi)``; the parameters an
i64 block (``PARAMS``: x, packed weight, bias, other, y, scratch), thread ``tid`` using its own
``scratch_floats`` of the scratch. It takes C a multiple of the vector width (``supported``).
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from typing import Any

from ..ops._lazy import torch
from .conv import MAX_CHANNELS, MAX_PADDING, conv_dims, micro_step, tile_for
from .cpu import l2_bytes, split_on_team
from .gemm import GemmConfig, pack_b
from .jit import jit
from .lowering import vector_width

__all__ = ["PARAMS", "winograd_ir", "kernel_source", "transform_weight", "PreparedWinograd", "supported",
           "block_tiles", "MIN_CHANNELS"]

PARAMS = ["x", "w", "bias", "other", "y", "scratch"]
# Fewer input or output channels than this run on the direct kernel: the transforms' additions,
# per channel, weigh more against the GEMMs' multiply-adds the fewer channels meet.
MIN_CHANNELS = 16
# The scratch of one block (V and M) fills at most this share of L2.
L2_SHARE = 0.5
# At most this many register tiles of rows in one block.
MAX_ROW_TILES = 16

# G, the 4 x 3 weight transform of F(2x2, 3x3)
_G = ((1.0, 0.0, 0.0), (0.5, 0.5, 0.5), (0.5, -0.5, 0.5), (0.0, 0.0, 1.0))


def supported(x_shape: tuple, w_shape: tuple, stride: list, padding: list, dilation: list, groups: int) -> str:
    """Why the Winograd kernel does not take these, or "" where it does: 3 x 3, stride 1,
    dilation 1, groups 1, padding at most 2, at least ``MIN_CHANNELS`` input and output channels,
    the input channels a multiple of the vector width, the output channels filling the register
    tile's columns as the direct kernel asks (``conv.MAX_PADDING``)."""
    if len(x_shape) != 4 or len(w_shape) != 4:
        return "not a 2-d convolution"
    if tuple(w_shape[2:]) != (3, 3):
        return f"a {w_shape[2]} x {w_shape[3]} kernel (F(2x2, 3x3) takes 3 x 3)"
    if list(stride) != [1, 1] or list(dilation) != [1, 1] or groups != 1:
        return f"stride {list(stride)}, dilation {list(dilation)}, groups {groups} (it takes 1 each)"
    if len(padding) != 2 or any(not 0 <= p <= 2 for p in padding):
        return f"padding {list(padding)} (it takes 0 to 2)"
    c, co = x_shape[1], w_shape[0]
    if c < MIN_CHANNELS or co < MIN_CHANNELS:
        return f"{c} input and {co} output channels (it takes {MIN_CHANNELS} or more each)"
    if c % vector_width() or c > MAX_CHANNELS:
        return f"{c} input channels (it takes a multiple of {vector_width()}, at most {MAX_CHANNELS})"
    dims = conv_dims(tuple(x_shape), tuple(w_shape), [1, 1], list(padding))
    if dims["ho"] < 1 or dims["wo"] < 1 or dims["n"] < 1:
        return "an empty result"
    nr = tile_for(_tiles(dims)[2], co).nr
    padded = -(-co // nr) * nr
    if padded > MAX_PADDING * co:
        return f"{co} output channels fill {100 * co // padded}% of the {nr}-wide tile"
    return ""


def _tiles(dims: dict[str, int]) -> tuple[int, int, int]:
    th, tw = -(-dims["ho"] // 2), -(-dims["wo"] // 2)
    return th, tw, dims["n"] * th * tw


def block_tiles(cfg: GemmConfig, c: int, co: int, ntiles: int) -> int:
    """Output tiles per block: a multiple of ``cfg.mr`` whose scratch (16 V rows of C and 16 M
    rows of the padded Co per tile) fills at most ``L2_SHARE`` of L2, at most ``MAX_ROW_TILES``
    register tiles, no more than the tiles there are (rounded up)."""
    cop = -(-co // cfg.nr) * cfg.nr
    per_tile = 16 * (c + cop) * 4
    rows = int(l2_bytes() * L2_SHARE) // per_tile // cfg.mr
    rows = max(1, min(rows, MAX_ROW_TILES, -(-ntiles // cfg.mr)))
    return rows * cfg.mr


def scratch_floats(cfg: GemmConfig, c: int, co: int, tb: int) -> int:
    """Floats of scratch one thread uses (V then M), rounded up to 64 bytes."""
    cop = -(-co // cfg.nr) * cfg.nr
    n = 16 * tb * (c + cop)
    return -(-n // 16) * 16


def _tile_coords(sfx: str, tw: int, th: int) -> list[str]:
    """Tile ``%g{sfx}``'s column ``%tx{sfx}``, row ``%ty{sfx}`` and image ``%im{sfx}``."""
    return [f"  %tx{sfx} = urem i64 %g{sfx}, {tw}", f"  %q{sfx} = udiv i64 %g{sfx}, {tw}",
            f"  %ty{sfx} = urem i64 %q{sfx}, {th}", f"  %im{sfx} = udiv i64 %q{sfx}, {th}"]


@dataclass(frozen=True)
class _Plan:
    """One kernel's constants: its name, tile, activation, block size and dimensions, and what
    follows from them."""
    name: str
    cfg: GemmConfig
    act: str
    tb: int
    h: int
    w: int
    c: int
    ho: int
    wo: int
    co: int
    ph: int
    pw: int
    th: int
    tw: int
    ntiles: int

    @property
    def vt(self) -> str:
        """The vector type."""
        return f"<{self.cfg.lanes} x float>"

    @property
    def np_(self) -> int:
        """Panels of NR output channels."""
        return -(-self.co // self.cfg.nr)

    @property
    def cop(self) -> int:
        """The output channels padded to whole panels."""
        return self.np_ * self.cfg.nr


def _entry(p: _Plan) -> list[str]:
    """The declarations, the signature and the entry block: parameters and the thread's scratch."""
    L, vt = p.cfg.lanes, p.vt
    vfl = 16 * p.tb * p.c       # floats of V in the scratch
    per_thread = scratch_floats(p.cfg, p.c, p.co, p.tb)
    out: list[str] = [f"@{p.name}_zero = internal constant [{MAX_CHANNELS} x float] zeroinitializer",
                      f"declare {vt} @llvm.fma.v{L}f32({vt}, {vt}, {vt})",
                      f"declare void @llvm.masked.store.v{L}f32.p0({vt}, ptr, i32, <{L} x i1>)",
                      f"declare {vt} @llvm.masked.load.v{L}f32.p0(ptr, i32, <{L} x i1>, {vt})",
                      f"define void @{p.name}(ptr noalias %pp, i64 %lo, i64 %hi, i64 %tid) nounwind {{",
                      "entry:"]
    a = out.append
    for i, f in enumerate(PARAMS):
        a(f"  %{f}.a = getelementptr inbounds i64, ptr %pp, i64 {i}")
        a(f"  %{f} = load i64, ptr %{f}.a, align 8")
        a(f"  %{f}p = inttoptr i64 %{f} to ptr")
    a("  %hasb = icmp ne i64 %bias, 0")
    a("  %haso = icmp ne i64 %other, 0")
    a(f"  %sto = mul i64 %tid, {per_thread}")
    a("  %vs = getelementptr inbounds float, ptr %scratchp, i64 %sto")
    a(f"  %ms = getelementptr inbounds float, ptr %vs, i64 {vfl}")
    a("  %empty = icmp uge i64 %lo, %hi")
    a("  br i1 %empty, label %exit, label %block")
    return out


def _block_head(p: _Plan) -> list[str]:
    """A block of TB tiles: its first tile, its tile count and its rows (whole register tiles)."""
    tb, MR = p.tb, p.cfg.mr
    return ["block:",
            "  %b = phi i64 [%lo, %entry], [%b.n, %p3.done]",
            f"  %g0 = mul i64 %b, {tb}",
            f"  %left = sub i64 {p.ntiles}, %g0",
            f"  %full = icmp ugt i64 %left, {tb}",
            f"  %count = select i1 %full, i64 {tb}, i64 %left",
            f"  %rt.a = add i64 %count, {MR - 1}",
            f"  %nrt = udiv i64 %rt.a, {MR}",
            f"  %rows = mul i64 %nrt, {MR}",
            "  br label %p1.tile"]


def _input_transform(p: _Plan) -> list[str]:
    """Phase 1: the input transform ``B^T d B`` of the tiles [0, rows) into V (those past
    count read only zeros), L channels at a time."""
    L, vt, c, h, w, tb = p.cfg.lanes, p.vt, p.c, p.h, p.w, p.tb
    out: list[str] = []
    a = out.append
    a("p1.tile:")
    a("  %t1 = phi i64 [0, %block], [%t1.n, %p1.tend]")
    a("  %g1 = add i64 %g0, %t1")
    a(f"  %live1 = icmp ult i64 %g1, {p.ntiles}")
    out += _tile_coords("1", p.tw, p.th)
    a("  %iyb.s = shl i64 %ty1, 1")
    a(f"  %iyb = sub i64 %iyb.s, {p.ph}")
    a("  %ixb.s = shl i64 %tx1, 1")
    a(f"  %ixb = sub i64 %ixb.s, {p.pw}")
    a(f"  %ib.a = mul i64 %im1, {h}")
    for i in range(4):
        a(f"  %iy{i} = add i64 %iyb, {i}")
        a(f"  %vy{i}.a = icmp ult i64 %iy{i}, {h}")
        a(f"  %vy{i} = and i1 %vy{i}.a, %live1")
        a(f"  %ir{i}.a = add i64 %ib.a, %iy{i}")
        a(f"  %ir{i} = mul i64 %ir{i}.a, {w}")
    for j in range(4):
        a(f"  %ix{j} = add i64 %ixb, {j}")
        a(f"  %vx{j} = icmp ult i64 %ix{j}, {w}")
    for i in range(4):
        for j in range(4):
            a(f"  %v{i}{j} = and i1 %vy{i}, %vx{j}")
            a(f"  %o{i}{j}.a = add i64 %ir{i}, %ix{j}")
            a(f"  %o{i}{j} = mul i64 %o{i}{j}.a, {c}")
            a(f"  %q{i}{j} = getelementptr float, ptr %xp, i64 %o{i}{j}")
            a(f"  %d{i}{j}p = select i1 %v{i}{j}, ptr %q{i}{j}, ptr @{p.name}_zero")
    a(f"  %vrow = mul i64 %t1, {c}")
    a("  %vt0 = getelementptr inbounds float, ptr %vs, i64 %vrow")
    a("  br label %p1.cv")
    a("p1.cv:")
    a("  %cv = phi i64 [0, %p1.tile], [%cv.n, %p1.cv]")
    a(f"  %cvo = mul i64 %cv, {L}")
    d = [[f"%d{i}{j}" for j in range(4)] for i in range(4)]
    for i in range(4):
        for j in range(4):
            a(f"  %d{i}{j}q = getelementptr inbounds float, ptr %d{i}{j}p, i64 %cvo")
            a(f"  %d{i}{j} = load {vt}, ptr %d{i}{j}q, align 4")
    # B^T d: rows
    t = [[""] * 4 for _ in range(4)]
    for j in range(4):
        for i, (op, x, y) in enumerate((("fsub", 0, 2), ("fadd", 1, 2), ("fsub", 2, 1), ("fsub", 1, 3))):
            a(f"  %r{i}{j} = {op} {vt} {d[x][j]}, {d[y][j]}")
            t[i][j] = f"%r{i}{j}"
    # (B^T d) B: columns
    for i in range(4):
        for j, (op, x, y) in enumerate((("fsub", 0, 2), ("fadd", 1, 2), ("fsub", 2, 1), ("fsub", 1, 3))):
            xi = 4 * i + j
            a(f"  %e{i}{j} = {op} {vt} {t[i][x]}, {t[i][y]}")
            a(f"  %ep{i}{j} = getelementptr inbounds float, ptr %vt0, i64 {xi * tb * c}")
            a(f"  %eq{i}{j} = getelementptr inbounds float, ptr %ep{i}{j}, i64 %cvo")
            a(f"  store {vt} %e{i}{j}, ptr %eq{i}{j}, align 4")
    a("  %cv.n = add i64 %cv, 1")
    a(f"  %cv.c = icmp ult i64 %cv.n, {c // L}")
    a("  br i1 %cv.c, label %p1.cv, label %p1.tend")
    a("p1.tend:")
    a("  %t1.n = add i64 %t1, 1")
    a("  %t1.c = icmp ult i64 %t1.n, %rows")
    a("  br i1 %t1.c, label %p1.tile, label %p2.xi")
    return out


def _gemms(p: _Plan) -> list[str]:
    """Phase 2: 16 GEMMs, [rows, C] x [C, Co] each, in register tiles of MR x NR, into M."""
    cfg, vt, c, tb, cop, np_ = p.cfg, p.vt, p.c, p.tb, p.cop, p.np_
    L, MR, NR, U = cfg.lanes, cfg.mr, cfg.nr, cfg.unroll
    NV = NR // L
    out: list[str] = []
    a = out.append
    a("p2.xi:")
    a("  %xi = phi i64 [0, %p1.tend], [%xi.n, %p2.xend]")
    a(f"  %vxo = mul i64 %xi, {tb * c}")
    a("  %vx = getelementptr inbounds float, ptr %vs, i64 %vxo")
    a(f"  %mxo = mul i64 %xi, {tb * cop}")
    a("  %mx = getelementptr inbounds float, ptr %ms, i64 %mxo")
    a(f"  %uxo = mul i64 %xi, {np_ * c * NR}")
    a("  %ux = getelementptr inbounds float, ptr %wp, i64 %uxo")
    a("  br label %p2.pan")
    a("p2.pan:")
    a("  %pn = phi i64 [0, %p2.xi], [%pn.n, %p2.pend]")
    a(f"  %upo = mul i64 %pn, {c * NR}")
    a("  %up = getelementptr inbounds float, ptr %ux, i64 %upo")
    a(f"  %mco = mul i64 %pn, {NR}")
    a("  br label %p2.rt")
    a("p2.rt:")
    a("  %rt = phi i64 [0, %p2.pan], [%rt.n, %p2.store]")
    a(f"  %r0 = mul i64 %rt, {MR}")
    for r in range(MR):
        a(f"  %ar{r}.a = add i64 %r0, {r}")
        a(f"  %ar{r}.b = mul i64 %ar{r}.a, {c}")
        a(f"  %ar{r} = getelementptr inbounds float, ptr %vx, i64 %ar{r}.b")
    a("  br label %p2.k")
    a("p2.k:")
    a("  %k = phi i64 [0, %p2.rt], [%k.n, %p2.k]")
    a("  %bk = phi ptr [%up, %p2.rt], [%bk.n, %p2.k]")
    cur = [[f"%acc{r}_{v}" for v in range(NV)] for r in range(MR)]
    body: list[str] = []
    for u in range(U):
        lines, cur = micro_step(cfg, f"u{u}", "%k", "%bk", "%ar", cur, u)
        body += lines
    for r in range(MR):
        for v in range(NV):
            a(f"  %acc{r}_{v} = phi {vt} [zeroinitializer, %p2.rt], [{cur[r][v]}, %p2.k]")
    out += body
    a(f"  %k.n = add i64 %k, {U}")
    a(f"  %bk.n = getelementptr inbounds float, ptr %bk, i64 {U * NR}")
    a(f"  %k.c = icmp ult i64 %k.n, {c}")
    a("  br i1 %k.c, label %p2.k, label %p2.store")
    a("p2.store:")
    for r in range(MR):
        a(f"  %mr{r}.a = add i64 %r0, {r}")
        a(f"  %mr{r}.b = mul i64 %mr{r}.a, {cop}")
        a(f"  %mr{r}.c = add i64 %mr{r}.b, %mco")
        a(f"  %mr{r} = getelementptr inbounds float, ptr %mx, i64 %mr{r}.c")
        for v in range(NV):
            a(f"  %mq{r}_{v} = getelementptr inbounds float, ptr %mr{r}, i64 {v * L}")
            a(f"  store {vt} {cur[r][v]}, ptr %mq{r}_{v}, align 4")
    a("  %rt.n = add i64 %rt, 1")
    a("  %rt.c = icmp ult i64 %rt.n, %nrt")
    a("  br i1 %rt.c, label %p2.rt, label %p2.pend")
    a("p2.pend:")
    a("  %pn.n = add i64 %pn, 1")
    a(f"  %pn.c = icmp ult i64 %pn.n, {np_}")
    a("  br i1 %pn.c, label %p2.pan, label %p2.xend")
    a("p2.xend:")
    a("  %xi.n = add i64 %xi, 1")
    a("  %xi.c = icmp ult i64 %xi.n, 16")
    a("  br i1 %xi.c, label %p2.xi, label %p3.tile")
    return out


def _output_transform(p: _Plan) -> list[str]:
    """Phase 3's head: a tile's result rows, the output-channel mask, the 16 M vectors
    through ``A^T m A`` with the bias added (``%z{i}{j}``)."""
    L, vt, co, cop, tb = p.cfg.lanes, p.vt, p.co, p.cop, p.tb
    out: list[str] = []
    a = out.append
    a("p3.tile:")
    a("  %t3 = phi i64 [0, %p2.xend], [%t3.n, %p3.tend]")
    a("  %g3 = add i64 %g0, %t3")
    out += _tile_coords("3", p.tw, p.th)
    a("  %oy0 = shl i64 %ty3, 1")
    a("  %ox0 = shl i64 %tx3, 1")
    a("  %oy1 = add i64 %oy0, 1")
    a("  %ox1 = add i64 %ox0, 1")
    a(f"  %wy1 = icmp ult i64 %oy1, {p.ho}")
    a(f"  %wx1 = icmp ult i64 %ox1, {p.wo}")
    a(f"  %yb.a = mul i64 %im3, {p.ho}")
    for i in range(2):
        a(f"  %yr{i}.a = add i64 %yb.a, %oy{i}")
        a(f"  %yr{i} = mul i64 %yr{i}.a, {p.wo}")
        for j in range(2):
            a(f"  %yo{i}{j}.a = add i64 %yr{i}, %ox{j}")
            a(f"  %yo{i}{j} = mul i64 %yo{i}{j}.a, {co}")
    a(f"  %mrow = mul i64 %t3, {cop}")
    a("  %mt0 = getelementptr inbounds float, ptr %ms, i64 %mrow")
    a("  br label %p3.cv")
    a("p3.cv:")
    a("  %ov = phi i64 [0, %p3.tile], [%ov.n, %p3.cvend]")
    a(f"  %ovo = mul i64 %ov, {L}")
    if co % L != 0:
        a(f"  %ncr = sub i64 {co}, %ovo")
        a("  %nc32 = trunc i64 %ncr to i32")
        a(f"  %ncv0 = insertelement <{L} x i32> poison, i32 %nc32, i64 0")
        a(f"  %ncv = shufflevector <{L} x i32> %ncv0, <{L} x i32> poison, <{L} x i32> zeroinitializer")
        idx = ", ".join(f"i32 {i}" for i in range(L))
        a(f"  %mask = icmp slt <{L} x i32> <{idx}>, %ncv")
    else:
        a(f"  %mask = icmp eq <{L} x i32> zeroinitializer, zeroinitializer")
    m = [[f"%m{i}{j}" for j in range(4)] for i in range(4)]
    for i in range(4):
        for j in range(4):
            a(f"  %m{i}{j}p = getelementptr inbounds float, ptr %mt0, i64 {(4 * i + j) * tb * cop}")
            a(f"  %m{i}{j}q = getelementptr inbounds float, ptr %m{i}{j}p, i64 %ovo")
            a(f"  %m{i}{j} = load {vt}, ptr %m{i}{j}q, align 4")
    # A^T m: rows (4 -> 2), then columns
    s = [[""] * 4 for _ in range(2)]
    for j in range(4):
        a(f"  %s0{j}.a = fadd {vt} {m[0][j]}, {m[1][j]}")
        a(f"  %s0{j} = fadd {vt} %s0{j}.a, {m[2][j]}")
        a(f"  %s1{j}.a = fsub {vt} {m[1][j]}, {m[2][j]}")
        a(f"  %s1{j} = fsub {vt} %s1{j}.a, {m[3][j]}")
        s[0][j], s[1][j] = f"%s0{j}", f"%s1{j}"
    a("  br i1 %hasb, label %p3.lb, label %p3.nb")
    a("p3.lb:")
    a("  %bq = getelementptr inbounds float, ptr %biasp, i64 %ovo")
    a(f"  %bl = call {vt} @llvm.masked.load.v{L}f32.p0(ptr %bq, i32 4, <{L} x i1> %mask, {vt} zeroinitializer)")
    a("  br label %p3.nb")
    a("p3.nb:")
    a(f"  %bv = phi {vt} [zeroinitializer, %p3.cv], [%bl, %p3.lb]")
    for i in range(2):
        a(f"  %z{i}0.a = fadd {vt} {s[i][0]}, {s[i][1]}")
        a(f"  %z{i}0.b = fadd {vt} %z{i}0.a, {s[i][2]}")
        a(f"  %z{i}0 = fadd {vt} %z{i}0.b, %bv")
        a(f"  %z{i}1.a = fsub {vt} {s[i][1]}, {s[i][2]}")
        a(f"  %z{i}1.b = fsub {vt} %z{i}1.a, {s[i][3]}")
        a(f"  %z{i}1 = fadd {vt} %z{i}1.b, %bv")
    return out


def _store_results(p: _Plan) -> list[str]:
    """Phase 3's end: the four results of a tile in turn ((0, 0) always inside the image, the
    others where they are), each with the residual and the activation; then the loops' ends."""
    L, vt, masked = p.cfg.lanes, p.vt, p.co % p.cfg.lanes != 0
    out: list[str] = []
    a = out.append
    conds = {(0, 0): None, (0, 1): "%wx1", (1, 0): "%wy1", (1, 1): "%wxy"}
    a("  %wxy = and i1 %wx1, %wy1")
    a("  br label %p3.o00")
    order = [(0, 0), (0, 1), (1, 0), (1, 1)]
    for k_, (i, j) in enumerate(order):
        nxt = f"p3.o{order[k_ + 1][0]}{order[k_ + 1][1]}" if k_ + 1 < 4 else "p3.cvend"
        a(f"p3.o{i}{j}:")
        cond = conds[(i, j)]
        if cond is not None:
            a(f"  br i1 {cond}, label %p3.w{i}{j}, label %{nxt}")
        else:
            a(f"  br label %p3.w{i}{j}")
        a(f"p3.w{i}{j}:")
        a(f"  %yo{i}{j}.c = add i64 %yo{i}{j}, %ovo")
        val = f"%z{i}{j}"
        a("  br i1 %haso, label %p3.ro" + f"{i}{j}, label %p3.act{i}{j}")
        a(f"p3.ro{i}{j}:")
        a(f"  %oq{i}{j} = getelementptr inbounds float, ptr %otherp, i64 %yo{i}{j}.c")
        a(f"  %ol{i}{j} = call {vt} @llvm.masked.load.v{L}f32.p0(ptr %oq{i}{j}, i32 4, <{L} x i1> %mask, "
          f"{vt} zeroinitializer)")
        a(f"  %oa{i}{j} = fadd {vt} {val}, %ol{i}{j}")
        a(f"  br label %p3.act{i}{j}")
        a(f"p3.act{i}{j}:")
        a(f"  %ya{i}{j} = phi {vt} [{val}, %p3.w{i}{j}], [%oa{i}{j}, %p3.ro{i}{j}]")
        val = f"%ya{i}{j}"
        if p.act == "relu":  # NaN stays NaN, as torch's relu
            a(f"  %yn{i}{j} = fcmp olt {vt} {val}, zeroinitializer")
            a(f"  %yv{i}{j} = select <{L} x i1> %yn{i}{j}, {vt} zeroinitializer, {vt} {val}")
            val = f"%yv{i}{j}"
        a(f"  %yq{i}{j} = getelementptr inbounds float, ptr %yp, i64 %yo{i}{j}.c")
        if masked:
            a(f"  call void @llvm.masked.store.v{L}f32.p0({vt} {val}, ptr %yq{i}{j}, i32 4, <{L} x i1> %mask)")
        else:
            a(f"  store {vt} {val}, ptr %yq{i}{j}, align 4")
        a(f"  br label %{nxt}")
    a("p3.cvend:")
    a("  %ov.n = add i64 %ov, 1")
    a(f"  %ov.c = icmp ult i64 %ov.n, {-(-p.co // L)}")
    a("  br i1 %ov.c, label %p3.cv, label %p3.tend")
    a("p3.tend:")
    a("  %t3.n = add i64 %t3, 1")
    a("  %t3.c = icmp ult i64 %t3.n, %count")
    a("  br i1 %t3.c, label %p3.tile, label %p3.done")
    a("p3.done:")
    a("  %b.n = add i64 %b, 1")
    a("  %b.c = icmp ult i64 %b.n, %hi")
    a("  br i1 %b.c, label %block, label %exit")
    a("exit:")
    a("  ret void")
    a("}")
    return out


def winograd_ir(name: str, cfg: GemmConfig, act: str, dims: dict[str, int], tb: int) -> str:
    """The LLVM IR of one Winograd kernel (see the module doc): register tile ``cfg``,
    activation ``act`` (none or relu) after the residual add where the call gives one
    (``other`` not null), the dimensions ``dims`` (conv.conv_dims's), ``tb`` tiles a block."""
    if act not in ("none", "relu"):
        raise ValueError(f"partita.codegen.winograd: no activation {act!r} (known: none, relu)")
    L, MR, U = cfg.lanes, cfg.mr, cfg.unroll
    n, h, w, c, ho, wo, co, ph, pw = (dims[k] for k in ("n", "h", "w_", "c", "ho", "wo", "co", "ph", "pw"))
    if c % L or c % U or tb % MR:
        raise ValueError(f"partita.codegen.winograd: C={c}, TB={tb} do not fit lanes {L}, unroll {U}, MR {MR}")
    th, tw, ntiles = _tiles(dims)
    p = _Plan(name, cfg, act, tb, h, w, c, ho, wo, co, ph, pw, th, tw, ntiles)
    out = (_entry(p) + _block_head(p) + _input_transform(p) + _gemms(p) + _output_transform(p)
           + _store_results(p))
    return "\n".join(out) + "\n"


_LOCK = threading.Lock()
_KERNELS: dict[tuple, Any] = {}


def kernel_name(cfg: GemmConfig, act: str, dims: dict[str, int], tb: int) -> str:
    return (f"pt_wino23_{cfg.mr}x{cfg.nr}_l{cfg.lanes}_tb{tb}_{act}" +
            "".join(f"_{k}{v}" for k, v in sorted(dims.items())))


def kernel(cfg: GemmConfig, act: str, dims: dict[str, int], tb: int) -> Any:
    """The compiled kernel (a ctypes function) for tile ``cfg``, ``act``, ``dims`` and ``tb``
    tiles a block (one for a convolution with and without a residual: the call says)."""
    key = (cfg, act, tuple(sorted(dims.items())), tb)
    with _LOCK:
        fn = _KERNELS.get(key)
        if fn is None:
            name = kernel_name(cfg, act, dims, tb)
            fn = jit().kernel(name, winograd_ir(name, cfg, act, dims, tb), 0,
                              argtypes=[ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]).fn
            _KERNELS[key] = fn
        return fn


def _plan(x_shape: tuple, w_shape: tuple, padding: list) -> tuple[dict[str, int], GemmConfig, int]:
    dims = conv_dims(tuple(x_shape), tuple(w_shape), [1, 1], list(padding))
    _, _, ntiles = _tiles(dims)
    cfg = tile_for(max(1, ntiles), dims["co"])
    return dims, cfg, block_tiles(cfg, dims["c"], dims["co"], ntiles)


def kernel_source(x_shape: tuple, w_shape: tuple, padding: list, act: str) -> tuple[str, str]:
    """The name and LLVM IR of the kernel ``PreparedWinograd`` compiles for these (``partita
    opt --emit=kernels`` prints it)."""
    dims, cfg, tb = _plan(x_shape, w_shape, padding)
    name = kernel_name(cfg, act, dims, tb)
    return name, winograd_ir(name, cfg, act, dims, tb)


def transform_weight(w: Any, nr: int) -> Any:
    """``w`` [Co, C, 3, 3] as ``U = G w G^T`` in the kernel's panels [16, ceil(Co / nr), C, nr]
    (position ``xi = 4 * i + j`` of the 4 x 4 transform first), computed in f64."""
    co, c = w.shape[:2]
    g = torch.tensor(_G, dtype=torch.float64)
    u = torch.einsum("ik,ockl,jl->ijco", g, w.detach().to(torch.float64), g).to(torch.float32)
    return torch.stack([pack_b(u[i, j], nr) for i in range(4) for j in range(4)]).contiguous()


class PreparedWinograd:
    """One node's Winograd convolution, fixed when the executor prepares it, with
    ``conv.PreparedConv``'s interface: ``pack(w)`` makes the transformed weight once;
    ``__call__(x, packed, bias, other, out)`` takes NCHW-shaped tensors in channels-last
    memory (others are converted) and returns the channels-last result, in ``out`` where given.
    One call at a time (the parameter block and the scratch are reused)."""

    def __init__(self, x_shape: tuple, w_shape: tuple, padding: list, act: str = "none", other: bool = False,
                 cfg: GemmConfig | None = None, tb: int | None = None) -> None:
        dims, self.cfg, self.tb = _plan(x_shape, w_shape, padding)
        if cfg is not None:  # a tile and a block asked for (the tests)
            self.cfg, self.tb = cfg, tb or cfg.mr
        self.shape = (dims["n"], dims["co"], dims["ho"], dims["wo"])
        _, _, ntiles = _tiles(dims)
        self.blocks = -(-ntiles // self.tb)
        self.fn = kernel(self.cfg, act, dims, self.tb)
        self.per_thread = scratch_floats(self.cfg, dims["c"], dims["co"], self.tb)
        self.scratch = torch.empty(0, dtype=torch.float32)
        self.params = (ctypes.c_int64 * len(PARAMS))()
        self.other = other

    def pack(self, w: Any) -> Any:
        return transform_weight(w, self.cfg.nr)

    def __call__(self, x: Any, packed: Any, bias: Any = None, other: Any = None, out: Any = None) -> Any:
        cl = torch.channels_last
        if not x.is_contiguous(memory_format=cl):
            x = x.contiguous(memory_format=cl)
        y = torch.empty(self.shape, dtype=torch.float32, memory_format=cl) if out is None else out
        nt = min(torch.get_num_threads(), self.blocks)
        if self.scratch.numel() < nt * self.per_thread:
            self.scratch = torch.empty(nt * self.per_thread, dtype=torch.float32)
        p = self.params
        p[0], p[1], p[4], p[5] = x.data_ptr(), packed.data_ptr(), y.data_ptr(), self.scratch.data_ptr()
        if bias is not None:
            bias = bias.contiguous()
        p[2] = 0 if bias is None else bias.data_ptr()
        p[3] = 0
        if self.other:
            if not other.is_contiguous(memory_format=cl):
                other = other.contiguous(memory_format=cl)
            p[3] = other.data_ptr()
        if nt > 1:
            split_on_team(self.fn, p, self.blocks, nt)
        else:
            self.fn(ctypes.addressof(p), 0, self.blocks, 0)
        return y
