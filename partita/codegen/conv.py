"""A generated f32 direct convolution on channels-last (NHWC) tensors, with bias, a residual add
and an activation (ReLU, SiLU, sigmoid, GELU, ReLU6, hardswish) applied to the tile in registers.

    y[n, oy, ox, co] = act(bias[co] + sum_{ky, kx, ci} x[n, oy*sh - ph + ky, ox*sw - pw + kx, ci]
                                                       * w[co, ci, ky, kx]  (+ other[n, oy, ox, co]))

The formulation is MLAS's NCHWc kernel's, on NHWC: the output pixels are taken as one flat list
(``m = (n * Ho + oy) * Wo + ox``, so a tile of ``MR`` pixels may run over the end of an image
row), the output channels in panels of ``NR``; the micro-kernel keeps an ``MR x NR`` tile of the
result in registers (``conv_configs``) through *all* of K = ``KH * KW * C``: for each tap
(ky, kx) it points each of its MR rows at the C input values that tap reads and does the C
steps of a GEMM micro-kernel over them, the weight panel ``[KH, KW, C, NR]`` read straight on.
So nothing is copied (no padded input, no im2col) and the tile is written once, after the
bias, the residual ``other`` and the activation. The weight is packed once per node
(``pack_weight``: ``[ceil(Co / NR), KH * KW * C, NR]``, the last panel zero-padded).

- A tile *inside* the image (its MR pixels one run of an image row, every tap of every pixel
  in the image) finds its rows at fixed distances from its first; any other tile works out
  each row's place, a row whose tap falls in the padding reading a row of zeros
  (``@<name>_zero``), and a tap that all its rows take from the padding is skipped.
- Each tile prefetches the input run and the result (and residual) rows of the tile
  ``PF_TILES`` ahead.
- Every dimension is a constant of the kernel (``PreparedConv`` compiles one per node shape,
  0.1 to 0.2 s, kept in the disk cache), so the rows' distances are immediates, the channel
  loop has a fixed count and the pixel arithmetic needs no division by a variable.

The kernel is ``NAME(ptr params, i64 lo, i64 hi, i64 tid)`` over the tiles ``[lo, hi)`` of
``ceil(N * Ho * Wo / MR)`` (``gemm.split_on_team`` splits them between threads), the
parameters an i64 block (``PARAMS``: the five addresses, then the dimensions a kernel made
without ``dims`` reads). Dilation 1 only (``supported``). A grouped convolution (a few groups,
few channels) runs as the dense one of its block-diagonal weight (``block_diagonal``), a
candidate of the measured choice only.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

from ..ops._lazy import torch
from .cpu import split_on_team
from .gemm import GemmConfig, choose, gemm_configs, pack_b
from .jit import CodegenError, jit
from .lowering import vector_width
from .mathlib import exp_neg_ir, f32, gelu_vector_lines
from .nhwc import ToChannelsLast

__all__ = ["PARAMS", "ACTS", "conv_ir", "segments", "conv_configs", "conv_dims", "kernel_source", "kernel", "kernels", "whole_entry", "WHOLE_SUFFIX", "pack_weight", "PreparedConv", "supported", "MAX_CHANNELS", "block_diagonal",
           "GROUPED_MAX_GROUPS", "GROUPED_MAX_CHANNELS",
           "CLAMP_ACTS", "hardswish_lines", "sigmoid_lines", "act_declarations",
           "gelu_lines", "activation_lines"]

PARAMS = ["x", "w", "bias", "other", "y", "n", "h", "w_", "c", "ho", "wo", "co", "kh", "kw", "sh", "sw", "ph", "pw"]
# The activations the kernel applies to its tile: SiLU, sigmoid and GELU (erf) on the inlined
# vector exp of codegen/mathlib.py (as the depthwise kernel), so a squeeze-excitation's small
# 1 x 1 convolutions, an EfficientNet's expansions and a PoolFormer's MLP run here, not on
# oneDNN's post-op (3 to 10 times the direct kernel's time on those shapes).
ACTS = ("none", "relu", "silu", "sigmoid", "gelu")
# The clamps the kernel applies too (codegen/epilogue.py's CLAMPS): ReLU6 and hardswish.
CLAMP_ACTS = ("relu6", "hardswish")
# How many tiles ahead a tile prefetches the input and result rows it will touch first.
# How many tiles ahead a tile prefetches the input and result rows it will touch first
# (1, 2, 4 and 8 measured level on the CNN; without, 5 to 7% slower on 32 channels at 64 x 64).
PF_TILES = 2
# A convolution whose output channels would leave more than this share of its tile's columns
# padding (16 channels in a 32-wide tile) runs on the library's kernel by the rules; where
# kernels are measured (codegen/choose.py) the direct kernel is still a candidate there: on few
# channels the call's fixed cost outweighs the padded columns (4 x 16 x 8 x 8 by 16 x 16 x 3 x 3:
# 14 us against oneDNN's 46; the stem 4 x 3 x 32 x 32 by 16 x 3 x 7 x 7, stride 2: 55 against
# 91; a 16-wide tile of one vector a row was no faster than the 8 x 32 one on these, one
# thread, AMD EPYC Zen 4, interleaved).
MAX_PADDING = 1.25
# A grouped convolution runs here as one dense convolution of a block-diagonal weight (the
# zeros between the groups multiplied too): a candidate of the measured choice, never the rules'
# pick, for at most this many groups and input channels. On RegNet's grouped 3 x 3 convolutions
# (4 x 16 x 16 x 16 by 16 x 8 x 3 x 3, 2 groups, stride 2; 4 x 32 x 8 x 8 by 32 x 8 x 3 x 3, 4
# groups) 14 to 15 us against ATen's 44 (one thread, interleaved); on 64 channels in 8 groups
# 149 against 75, so wider ones are left to the library.
GROUPED_MAX_GROUPS = 4
GROUPED_MAX_CHANNELS = 64
# The zero row a tap in the padding reads is this many floats: wider inputs run on the library.
MAX_CHANNELS = 4096
# The whole-range entry's symbol: the kernel's name and this (``whole_entry``).
WHOLE_SUFFIX = "_all"


def segments(dims: dict[str, int], mr: int) -> list[tuple[int, int, int]]:
    """The output columns in up to three segments, each ``(first column, width, tiles)``: the
    columns whose leftmost taps fall in the padding, those whose taps are all inside the image,
    and those whose rightmost taps fall in the padding. A segment's pixels (its columns of every
    output row of every image) are tiled on their own, so the tiles of an edge segment all
    miss the same taps and skip them, and the middle one's tiles inside the image are found at
    fixed distances."""
    wo, sw, pw, kw, w = dims["wo"], dims["sw"], dims["pw"], dims["kw"], dims["w_"]
    xl = min(wo, -(-pw // sw))                                   # first column with ox*sw - pw >= 0
    xr = max(xl, min(wo, (w - kw + pw) // sw + 1))               # past the last with ox*sw - pw + kw <= w
    rows = dims["n"] * dims["ho"]
    return [(x0, x1 - x0, -(-rows * (x1 - x0) // mr)) for x0, x1 in ((0, xl), (xl, xr), (xr, wo)) if x1 > x0]


def micro_step(cfg: GemmConfig, tag: str, k: str, bp: str, rows: str, accs: list[list[str]],
               k_off: int) -> tuple[list[str], list[list[str]]]:
    """One k step of the register tile: the NR-wide row ``k + k_off`` of the packed panel at
    ``bp`` loaded, the value at ``k + k_off`` of each of the MR rows ``{rows}0``, ``{rows}1``, ...
    broadcast, MR x NR / lanes multiply-adds onto ``accs``. The IR lines (names prefixed with
    ``tag``) and the new accumulators."""
    L, MR, NR = cfg.lanes, cfg.mr, cfg.nr
    vt = f"<{L} x float>"
    lines, bs = [], []
    for v in range(NR // L):
        lines.append(f"  %{tag}bp{v} = getelementptr inbounds float, ptr {bp}, i64 {k_off * NR + v * L}")
        lines.append(f"  %{tag}b{v} = load {vt}, ptr %{tag}bp{v}, align 4")
        bs.append(f"%{tag}b{v}")
    new = []
    for r in range(MR):
        lines.append(f"  %{tag}k{r} = add i64 {k}, {k_off}")
        lines.append(f"  %{tag}ap{r} = getelementptr inbounds float, ptr {rows}{r}, i64 %{tag}k{r}")
        lines.append(f"  %{tag}a{r} = load float, ptr %{tag}ap{r}, align 4")
        lines.append(f"  %{tag}ai{r} = insertelement {vt} poison, float %{tag}a{r}, i64 0")
        lines.append(f"  %{tag}as{r} = shufflevector {vt} %{tag}ai{r}, {vt} poison, <{L} x i32> zeroinitializer")
        row = []
        for v in range(NR // L):
            o = f"%{tag}c{r}_{v}"
            lines.append(f"  {o} = call {vt} @llvm.fma.v{L}f32({vt} %{tag}as{r}, {vt} {bs[v]}, {vt} {accs[r][v]})")
            row.append(o)
        new.append(row)
    return lines, new


def _prologue(name: str, cfg: GemmConfig, dims: dict[str, int], act: str = "none") -> list[str]:
    """The declarations, the signature and the entry block: parameters, constants, panel strides."""
    L, NR = cfg.lanes, cfg.nr
    vt = f"<{L} x float>"
    out: list[str] = [f"@{name}_zero = internal constant [{MAX_CHANNELS} x float] zeroinitializer",
                      f"declare {vt} @llvm.fma.v{L}f32({vt}, {vt}, {vt})",
                      f"declare void @llvm.masked.store.v{L}f32.p0({vt}, ptr, i32, <{L} x i1>)",
                      f"declare {vt} @llvm.masked.load.v{L}f32.p0(ptr, i32, <{L} x i1>, {vt})",
                      "declare void @llvm.prefetch.p0(ptr, i32, i32, i32)",
                      *act_declarations(act, L),
                      f"define void @{name}(ptr noalias %pp, i64 %lo, i64 %hi, i64 %tid) nounwind {{",
                      "entry:"]
    a = out.append
    for i, f in enumerate(PARAMS):
        if f in dims:  # a constant of this kernel
            a(f"  %{f} = add i64 0, {int(dims[f])}")
            continue
        a(f"  %{f}.a = getelementptr inbounds i64, ptr %pp, i64 {i}")
        a(f"  %{f} = load i64, ptr %{f}.a, align 8")
    for f in ("x", "w", "bias", "other", "y"):
        a(f"  %{f}p = inttoptr i64 %{f} to ptr")
    a("  %ntaps = mul i64 %kh, %kw")
    a(f"  %np0 = add i64 %co, {NR - 1}")
    a(f"  %np = udiv i64 %np0, {NR}")
    a("  %ktot = mul i64 %ntaps, %c")
    a(f"  %pstride = mul i64 %ktot, {NR}")
    a(f"  %tapstride = mul i64 %c, {NR}")
    # a tile inside the image takes a whole kernel row as one run of K = KW * C (the KW pixels
    # of a row are next to each other in NHWC, as are the weight's [kx][c]); another tile one tap
    # (C) at a time
    a("  %krow = mul i64 %kw, %c")
    a(f"  %rowstride = mul i64 %krow, {NR}")
    a("  %hasb = icmp ne i64 %bias, 0")
    a("  %haso = icmp ne i64 %other, 0")
    a("  %obase = select i1 %haso, ptr %otherp, ptr %yp")
    a("  %rstep0 = mul i64 %sw, %c")
    a("  %empty = icmp uge i64 %lo, %hi")
    a("  br i1 %empty, label %exit, label %panel")
    return out


def _panel(cfg: GemmConfig) -> list[str]:
    """A panel of NR output channels: its column masks and bias vectors."""
    L, NR = cfg.lanes, cfg.nr
    NV = NR // L
    vt = f"<{L} x float>"
    out: list[str] = []
    a = out.append
    a("panel:")
    a("  %p = phi i64 [0, %entry], [%p.n, %panel.end]")
    a(f"  %col0 = mul i64 %p, {NR}")
    a("  %ncr = sub i64 %co, %col0")
    a(f"  %ncb = icmp ugt i64 %ncr, {NR}")
    a(f"  %nc = select i1 %ncb, i64 {NR}, i64 %ncr")
    a("  %nc32 = trunc i64 %nc to i32")
    a(f"  %ncv0 = insertelement <{L} x i32> poison, i32 %nc32, i64 0")
    a(f"  %ncv = shufflevector <{L} x i32> %ncv0, <{L} x i32> poison, <{L} x i32> zeroinitializer")
    for v in range(NV):
        idx = ", ".join(f"i32 {v * L + i}" for i in range(L))
        a(f"  %mask{v} = icmp ult <{L} x i32> <{idx}>, %ncv")
    a("  %bpo = mul i64 %p, %pstride")
    a("  %bpan = getelementptr inbounds float, ptr %wp, i64 %bpo")
    a("  %bcol = getelementptr float, ptr %biasp, i64 %col0")
    for v in range(NV):
        a(f"  %bvp{v} = getelementptr float, ptr %bcol, i64 {v * L}")
    a("  br i1 %hasb, label %loadb, label %tile0")
    a("loadb:")
    for v in range(NV):
        a(f"  %bl{v} = call {vt} @llvm.masked.load.v{L}f32.p0(ptr %bvp{v}, i32 4, <{L} x i1> %mask{v}, "
          f"{vt} zeroinitializer)")
    a("  br label %tile0")
    a("tile0:")
    for v in range(NV):
        a(f"  %bv{v} = phi {vt} [zeroinitializer, %panel], [%bl{v}, %loadb]")
    a("  br label %tile")
    return out


def _tile_place(cfg: GemmConfig, dims: dict[str, int]) -> list[str]:
    """A tile's head: its column segment, first pixel, row count, whether it lies inside the
    image (every tap of every row, the rows one run of an image row) and its input offset."""
    MR = cfg.mr
    out: list[str] = []
    a = out.append
    a("tile:")
    a("  %t = phi i64 [%lo, %tile0], [%t.n, %tile.end]")
    # the column segment the tile is in (see ``segments``): its first tile, first column, width
    # and pixels
    segs = segments(dims, MR)
    starts = [sum(sg[2] for sg in segs[:i]) for i in range(len(segs))]
    rows_total = dims["n"] * dims["ho"]
    for q, vals in (("sb", starts), ("sx", [sg[0] for sg in segs]), ("swd", [sg[1] for sg in segs]),
                    ("sm", [rows_total * sg[1] for sg in segs])):
        sel = str(vals[0])
        for i in range(1, len(segs)):
            a(f"  %{q}.c{i} = icmp uge i64 %t, {starts[i]}")
            a(f"  %{q}.{i} = select i1 %{q}.c{i}, i64 {vals[i]}, i64 {sel}")
            sel = f"%{q}.{i}"
        a(f"  %{q} = add i64 {sel}, 0")
    a("  %tl = sub i64 %t, %sb")
    a(f"  %mt0 = mul i64 %tl, {MR}")
    a("  %mrem = sub i64 %sm, %mt0")
    a(f"  %mb = icmp ugt i64 %mrem, {MR}")
    a(f"  %mr = select i1 %mb, i64 {MR}, i64 %mrem")
    a("  %q0 = udiv i64 %mt0, %swd")
    a("  %xo0 = urem i64 %mt0, %swd")
    a("  %img0 = udiv i64 %q0, %ho")
    a("  %oy0 = urem i64 %q0, %ho")
    a("  %ox0 = add i64 %sx, %xo0")
    a("  %m0.a = mul i64 %q0, %wo")
    a("  %m0 = add i64 %m0.a, %ox0")
    for r in range(MR):
        a(f"  %mf{r} = add i64 %m0, {r}")
    a("  %tiy.s = mul i64 %oy0, %sh")
    a("  %tiy = sub i64 %tiy.s, %ph")
    a("  %tix.s = mul i64 %ox0, %sw")
    a("  %tix = sub i64 %tix.s, %pw")
    a(f"  %in1 = icmp eq i64 %mr, {MR}")
    a(f"  %oxe = add i64 %xo0, {MR}")
    a("  %in2 = icmp ule i64 %oxe, %swd")
    a("  %in3 = icmp sge i64 %tiy, 0")
    a("  %iye = add i64 %tiy, %kh")
    a("  %in4 = icmp sle i64 %iye, %h")
    a("  %in5 = icmp sge i64 %tix, 0")
    a(f"  %ixe0 = mul i64 %sw, {MR - 1}")
    a("  %ixe1 = add i64 %tix, %ixe0")
    a("  %ixe = add i64 %ixe1, %kw")
    a("  %in6 = icmp sle i64 %ixe, %w_")
    a("  %in12 = and i1 %in1, %in2")
    a("  %in34 = and i1 %in3, %in4")
    a("  %in56 = and i1 %in5, %in6")
    a("  %in14 = and i1 %in12, %in34")
    a("  %inner = and i1 %in14, %in56")
    a("  %b0.a = mul i64 %img0, %h")
    a("  %b0.b = add i64 %b0.a, %tiy")
    a("  %b0.c = mul i64 %b0.b, %w_")
    a("  %b0.d = add i64 %b0.c, %tix")
    a("  %base00 = mul i64 %b0.d, %c")
    return out


def _prefetch(cfg: GemmConfig) -> list[str]:
    """The prefetch of what tile t + PF_TILES reads first from memory (the last kernel row's
    input run, counted on within the image row) and of the result rows it writes; then the
    channel loop's counts and the branch to the rows' places."""
    L, MR, NR, U = cfg.lanes, cfg.mr, cfg.nr, cfg.unroll
    NV = NR // L
    out: list[str] = []
    a = out.append
    a(f"  %pfd = mul i64 %rstep0, {PF_TILES * MR}")
    a("  %pfa.a = sub i64 %kh, 1")
    a("  %pfa.b = mul i64 %pfa.a, %w_")
    a("  %pfa.c = mul i64 %pfa.b, %c")
    a("  %pfa.d = add i64 %base00, %pfa.c")
    a("  %pfa = add i64 %pfa.d, %pfd")
    a("  %pfx = getelementptr float, ptr %xp, i64 %pfa")
    a(f"  %pfn.a = mul i64 %rstep0, {MR * 4}")
    a("  %pfn = add i64 %pfn.a, 63")
    a("  br label %pfl")
    a("pfl:")
    a("  %pfo = phi i64 [0, %tile], [%pfo.n, %pfl]")
    a("  %pfp = getelementptr i8, ptr %pfx, i64 %pfo")
    a("  call void @llvm.prefetch.p0(ptr %pfp, i32 0, i32 3, i32 1)")
    a("  %pfo.n = add i64 %pfo, 64")
    a("  %pfc = icmp ult i64 %pfo.n, %pfn")
    a("  br i1 %pfc, label %pfl, label %pfy")
    a("pfy:")
    a(f"  %pym = add i64 %m0, {PF_TILES * MR}")
    a("  %pymo = mul i64 %pym, %co")
    a("  %pyo = add i64 %pymo, %col0")
    a("  %pyp = getelementptr float, ptr %yp, i64 %pyo")
    for r in range(MR):
        a(f"  %pyr{r}.o = mul i64 %co, {r}")
        a(f"  %pyr{r} = getelementptr float, ptr %pyp, i64 %pyr{r}.o")
        for v in range(NV):
            a(f"  %pyv{r}_{v} = getelementptr float, ptr %pyr{r}, i64 {v * L}")
            a(f"  %pyo.{r}_{v}.a = add i64 %pyo, %pyr{r}.o")
            a(f"  %pyo.{r}_{v} = add i64 %pyo.{r}_{v}.a, {v * L}")
            a(f"  call void @llvm.prefetch.p0(ptr %pyv{r}_{v}, i32 1, i32 3, i32 1)")
            a(f"  %pov{r}_{v} = getelementptr float, ptr %obase, i64 %pyo.{r}_{v}")
            a(f"  call void @llvm.prefetch.p0(ptr %pov{r}_{v}, i32 0, i32 3, i32 1)")
    a("  %kcnt = select i1 %inner, i64 %krow, i64 %c")
    a(f"  %ku = udiv i64 %kcnt, {U}")
    a(f"  %kr = urem i64 %kcnt, {U}")
    a("  %hasu = icmp ne i64 %ku, 0")
    a("  %hasr = icmp ne i64 %kr, 0")
    a("  %tstride = select i1 %inner, i64 %rowstride, i64 %tapstride")
    a("  br i1 %inner, label %tap.pre, label %rows")
    return out


def _row_places(cfg: GemmConfig) -> list[str]:
    """The places of a tile not inside the image: each row's image, output row and column,
    result row and input offset; then the phis that join them with the inside tile's."""
    MR = cfg.mr
    out: list[str] = []
    a = out.append
    a("rows:")
    # row r's image, output row and column, counted on from row 0's; rows past mr repeat the
    # last row (their results are never stored)
    prev = ("%img0", "%oy0", "%xo0")
    for r in range(MR):
        if r:
            pi, py, px = prev
            a(f"  %xo{r}.i = add i64 {px}, 1")
            a(f"  %wx{r} = icmp eq i64 %xo{r}.i, %swd")
            a(f"  %xo{r}.w = select i1 %wx{r}, i64 0, i64 %xo{r}.i")
            a(f"  %oy{r}.i = add i64 {py}, 1")
            a(f"  %oy{r}.j = select i1 %wx{r}, i64 %oy{r}.i, i64 {py}")
            a(f"  %wy{r} = icmp eq i64 %oy{r}.j, %ho")
            a(f"  %oy{r}.w = select i1 %wy{r}, i64 0, i64 %oy{r}.j")
            a(f"  %img{r}.i = add i64 {pi}, 1")
            a(f"  %img{r}.w = select i1 %wy{r}, i64 %img{r}.i, i64 {pi}")
            a(f"  %live{r} = icmp ult i64 {r}, %mr")
            for q, pv in zip(("img", "oy", "xo"), prev):
                a(f"  %{q}{r} = select i1 %live{r}, i64 %{q}{r}.w, i64 {pv}")
            prev = (f"%img{r}", f"%oy{r}", f"%xo{r}")
            a(f"  %ox{r} = add i64 %sx, %xo{r}")
        a(f"  %mq{r}.a = mul i64 %img{r}, %ho")
        a(f"  %mq{r}.b = add i64 %mq{r}.a, %oy{r}")
        a(f"  %mq{r}.c = mul i64 %mq{r}.b, %wo")
        a(f"  %mq{r} = add i64 %mq{r}.c, %ox{r}")
        a(f"  %iy0{r}.s = mul i64 %oy{r}, %sh")
        a(f"  %iy0{r} = sub i64 %iy0{r}.s, %ph")
        a(f"  %ix0{r}.s = mul i64 %ox{r}, %sw")
        a(f"  %ix0{r} = sub i64 %ix0{r}.s, %pw")
        a(f"  %base{r}.a = mul i64 %img{r}, %h")
        a(f"  %base{r}.b = add i64 %base{r}.a, %iy0{r}")
        a(f"  %base{r}.c = mul i64 %base{r}.b, %w_")
        a(f"  %base{r}.d = add i64 %base{r}.c, %ix0{r}")
        a(f"  %base{r} = mul i64 %base{r}.d, %c")
    a("  br label %tap.pre")
    a("tap.pre:")
    for r in range(MR):
        for q in ("iy0", "ix0", "base"):
            a(f"  %{q}{r}.p = phi i64 [0, %pfy], [%{q}{r}, %rows]")
        a(f"  %ym{r} = phi i64 [%mf{r}, %pfy], [%mq{r}, %rows]")
    a("  br label %tap")
    return out


def _tap_rows(name: str, cfg: GemmConfig) -> list[str]:
    """One tap (ky, kx): its accumulators and the MR rows' pointers, at fixed distances inside
    the image, else each row's own (the zero row in the padding; a tap all in it skipped)."""
    L, MR, NR = cfg.lanes, cfg.mr, cfg.nr
    NV = NR // L
    vt = f"<{L} x float>"
    out: list[str] = []
    a = out.append
    a("tap:")
    a("  %ky = phi i64 [0, %tap.pre], [%ky.n, %tap.end]")
    a("  %kx = phi i64 [0, %tap.pre], [%kx.n, %tap.end]")
    a("  %btap = phi ptr [%bpan, %tap.pre], [%btap.n, %tap.end]")
    for r in range(MR):
        for v in range(NV):
            a(f"  %tacc{r}_{v} = phi {vt} [zeroinitializer, %tap.pre], [%eacc{r}_{v}, %tap.end]")
    a("  %toff.a = mul i64 %ky, %w_")
    a("  %toff.b = add i64 %toff.a, %kx")
    a("  %toff = mul i64 %toff.b, %c")
    a("  br i1 %inner, label %tfast, label %tslow")
    a("tfast:")
    a("  %fo = add i64 %base00, %toff")
    a("  %frp0 = getelementptr float, ptr %xp, i64 %fo")
    a("  %rstep = mul i64 %sw, %c")
    for r in range(1, MR):
        a(f"  %fro{r} = mul i64 %rstep, {r}")
        a(f"  %frp{r} = getelementptr float, ptr %frp0, i64 %fro{r}")
    a("  br label %tk")
    a("tslow:")
    for r in range(MR):
        a(f"  %iy{r} = add i64 %iy0{r}.p, %ky")
        a(f"  %ix{r} = add i64 %ix0{r}.p, %kx")
        a(f"  %vy{r} = icmp ult i64 %iy{r}, %h")
        a(f"  %vx{r} = icmp ult i64 %ix{r}, %w_")
        a(f"  %vv{r} = and i1 %vy{r}, %vx{r}")
        a(f"  %ro{r} = add i64 %base{r}.p, %toff")
        a(f"  %rq{r} = getelementptr float, ptr %xp, i64 %ro{r}")
        a(f"  %srp{r} = select i1 %vv{r}, ptr %rq{r}, ptr @{name}_zero")
    # a tap that every row takes from the padding (a kernel row above or below the image) adds
    # nothing: skipped
    anyv = "%vv0"
    for r in range(1, MR):
        a(f"  %anyv{r} = or i1 {anyv}, %vv{r}")
        anyv = f"%anyv{r}"
    a(f"  br i1 {anyv}, label %tk, label %tap.end")
    a("tk:")
    for r in range(MR):
        a(f"  %rp{r} = phi ptr [%frp{r}, %tfast], [%srp{r}, %tslow]")
    a("  br i1 %hasu, label %uloop, label %uexit")
    return out


def _channel_loops(cfg: GemmConfig) -> list[str]:
    """The micro-kernel over a tap's channels: the loop unrolled U times, the remainder loop,
    and the tap's end (the accumulators joined, the next tap)."""
    L, MR, NR, U = cfg.lanes, cfg.mr, cfg.nr, cfg.unroll
    NV = NR // L
    vt = f"<{L} x float>"
    out: list[str] = []
    a = out.append
    # the unrolled loop over C
    a("uloop:")
    a("  %uk = phi i64 [0, %tk], [%uk.n, %uloop]")
    a("  %ui = phi i64 [0, %tk], [%ui.n, %uloop]")
    a("  %ubp = phi ptr [%btap, %tk], [%ubp.n, %uloop]")
    cur = [[f"%uacc{r}_{v}" for v in range(NV)] for r in range(MR)]
    body: list[str] = []
    for u in range(U):
        lines, cur = micro_step(cfg, f"u{u}_", "%uk", "%ubp", "%rp", cur, u)
        body += lines
    for r in range(MR):
        for v in range(NV):
            a(f"  %uacc{r}_{v} = phi {vt} [%tacc{r}_{v}, %tk], [{cur[r][v]}, %uloop]")
    out += body
    a(f"  %uk.n = add i64 %uk, {U}")
    a(f"  %ubp.n = getelementptr inbounds float, ptr %ubp, i64 {U * NR}")
    a("  %ui.n = add i64 %ui, 1")
    a("  %ucont = icmp ult i64 %ui.n, %ku")
    a("  br i1 %ucont, label %uloop, label %uexit")
    a("uexit:")
    a("  %xk = phi i64 [0, %tk], [%uk.n, %uloop]")
    a("  %xbp = phi ptr [%btap, %tk], [%ubp.n, %uloop]")
    for r in range(MR):
        for v in range(NV):
            a(f"  %xacc{r}_{v} = phi {vt} [%tacc{r}_{v}, %tk], [{cur[r][v]}, %uloop]")
    a("  br i1 %hasr, label %rloop, label %tap.end")
    # the remainder of C
    a("rloop:")
    a("  %rk = phi i64 [%xk, %uexit], [%rk.n, %rloop]")
    a("  %rbp = phi ptr [%xbp, %uexit], [%rbp.n, %rloop]")
    lines, rcur = micro_step(cfg, "r_", "%rk", "%rbp", "%rp",
                             [[f"%racc{r}_{v}" for v in range(NV)] for r in range(MR)], 0)
    for r in range(MR):
        for v in range(NV):
            a(f"  %racc{r}_{v} = phi {vt} [%xacc{r}_{v}, %uexit], [{rcur[r][v]}, %rloop]")
    out += lines
    a("  %rk.n = add i64 %rk, 1")
    a(f"  %rbp.n = getelementptr inbounds float, ptr %rbp, i64 {NR}")
    a("  %rcont = icmp ult i64 %rk.n, %kcnt")
    a("  br i1 %rcont, label %rloop, label %tap.end")
    a("tap.end:")
    for r in range(MR):
        for v in range(NV):
            a(f"  %eacc{r}_{v} = phi {vt} [%xacc{r}_{v}, %uexit], [{rcur[r][v]}, %rloop], [%tacc{r}_{v}, %tslow]")
    a("  %btap.n = getelementptr inbounds float, ptr %btap, i64 %tstride")
    a("  %kx.1 = add i64 %kx, 1")
    a("  %kxe = icmp eq i64 %kx.1, %kw")
    a("  %kxw = or i1 %kxe, %inner")
    a("  %kx.n = select i1 %kxw, i64 0, i64 %kx.1")
    a("  %ky.1 = add i64 %ky, 1")
    a("  %ky.n = select i1 %kxw, i64 %ky.1, i64 %ky")
    a("  %tdone = icmp eq i64 %ky.n, %kh")
    a("  br i1 %tdone, label %store0, label %tap")
    return out


def hardswish_lines(tag: str, v: str, lanes: int) -> list[str]:
    """IR giving ``tag`` = hardswish(``v``) = v * min(max(v + 3, 0), 6) / 6 on ``lanes`` floats,
    step by step as the ops it replaces (NaN stays NaN)."""
    vt = f"<{lanes} x float>"

    def splat(c: float) -> str:
        return "<" + ", ".join([f"float {c}"] * lanes) + ">"

    return [f"  {tag}.a = fadd {vt} {v}, {splat(3.0)}",
            f"  {tag}.n = fcmp olt {vt} {tag}.a, zeroinitializer",
            f"  {tag}.b = select <{lanes} x i1> {tag}.n, {vt} zeroinitializer, {vt} {tag}.a",
            f"  {tag}.s = fcmp ogt {vt} {tag}.b, {splat(6.0)}",
            f"  {tag}.c = select <{lanes} x i1> {tag}.s, {vt} {splat(6.0)}, {vt} {tag}.b",
            f"  {tag}.m = fmul {vt} {v}, {tag}.c",
            f"  {tag} = fdiv {vt} {tag}.m, {splat(6.0)}"]


def act_declarations(act: str, lanes: int) -> list[str]:
    """The declarations ``activation_lines`` needs for ``act`` on ``lanes`` floats (once per
    module; the module declares ``llvm.fma`` itself)."""
    if act not in ("silu", "sigmoid", "gelu"):
        return []
    vt = f"<{lanes} x float>"
    out = [f"declare {vt} @llvm.maxnum.v{lanes}f32({vt}, {vt})", f"declare {vt} @llvm.rint.v{lanes}f32({vt})",
           f"declare {vt} @llvm.fabs.v{lanes}f32({vt})", exp_neg_ir(lanes)]
    if act == "gelu":
        out.insert(0, f"declare {vt} @llvm.minnum.v{lanes}f32({vt}, {vt})")
    return out


def activation_lines(act: str, tag: str, v: str, lanes: int) -> tuple[list[str], str]:
    """(IR lines, the result) of the exp-based activation ``act`` (silu, sigmoid, gelu) of ``v``."""
    if act == "gelu":
        return gelu_lines(tag, v, lanes), tag
    return sigmoid_lines(tag, v, lanes, act == "silu"), tag


def gelu_lines(tag: str, v: str, lanes: int) -> list[str]:
    """IR giving ``tag`` = GELU(``v``) = v / 2 * (1 + erf(v / sqrt(2))) on ``lanes`` floats, erf
    as mathlib's division-free ``pt_erff`` computes it; NaN stays NaN."""
    return gelu_vector_lines(tag, v, lanes)


def sigmoid_lines(tag: str, v: str, lanes: int, times_v: bool) -> list[str]:
    """IR giving ``tag`` = sigmoid(``v``) (times ``v``: SiLU) on ``lanes`` floats, as 1 / (1 + z)
    for v >= 0 and z / (1 + z) below, z = exp(-|v|): nothing overflows; NaN stays NaN."""
    vt = f"<{lanes} x float>"
    one = f"splat (float {f32(1.0)})"
    s = f"{tag}.s" if times_v else tag
    out = [f"  {tag}.abs = call {vt} @llvm.fabs.v{lanes}f32({vt} {v})",
           f"  {tag}.na = fneg {vt} {tag}.abs",
           f"  {tag}.z = call {vt} @pt_vexpf_neg{lanes}({vt} {tag}.na)",
           f"  {tag}.d = fadd {vt} {tag}.z, {one}",
           f"  {tag}.pos = fcmp oge {vt} {v}, zeroinitializer",
           f"  {tag}.num = select <{lanes} x i1> {tag}.pos, {vt} {one}, {vt} {tag}.z",
           f"  {s} = fdiv {vt} {tag}.num, {tag}.d"]
    if times_v:
        out.append(f"  {tag} = fmul {vt} {v}, {s}")
    return out


def _store_tile(cfg: GemmConfig, act: str) -> list[str]:
    """The tile written once (bias, other, activation, masked to the panel's columns), then
    the tile, panel and kernel ends."""
    L, MR, NR = cfg.lanes, cfg.mr, cfg.nr
    NV = NR // L
    vt = f"<{L} x float>"
    out: list[str] = []
    a = out.append
    a("store0:")
    a("  br i1 %haso, label %store0.o, label %store0.n")
    for sfx, with_other in ((".o", True), (".n", False)):
        for r in range(MR):
            nxt = f"store{r + 1}{sfx}" if r + 1 < MR else "tile.end"
            a(f"store{r}{sfx}:")
            a(f"  %sin{r}{sfx} = icmp ult i64 {r}, %mr")
            a(f"  br i1 %sin{r}{sfx}, label %sdo{r}{sfx}, label %tile.end")
            a(f"sdo{r}{sfx}:")
            a(f"  %yo{r}{sfx}.a = mul i64 %ym{r}, %co")
            a(f"  %yo{r}{sfx} = add i64 %yo{r}{sfx}.a, %col0")
            a(f"  %yr{r}{sfx} = getelementptr float, ptr %yp, i64 %yo{r}{sfx}")
            if with_other:
                a(f"  %or{r} = getelementptr float, ptr %otherp, i64 %yo{r}{sfx}")
            for v in range(NV):
                val = f"%sb{r}_{v}{sfx}"
                a(f"  {val} = fadd {vt} %eacc{r}_{v}, %bv{v}")
                if with_other:
                    a(f"  %sop{r}_{v} = getelementptr float, ptr %or{r}, i64 {v * L}")
                    a(f"  %so{r}_{v} = call {vt} @llvm.masked.load.v{L}f32.p0(ptr %sop{r}_{v}, i32 4, <{L} x i1> %mask{v}, "
                      f"{vt} zeroinitializer)")
                    a(f"  %sa{r}_{v} = fadd {vt} {val}, %so{r}_{v}")
                    val = f"%sa{r}_{v}"
                if act in ("relu", "relu6"):  # NaN stays NaN, as torch's relu (and maximum, minimum)
                    a(f"  %sneg{r}_{v}{sfx} = fcmp olt {vt} {val}, zeroinitializer")
                    a(f"  %sr{r}_{v}{sfx} = select <{L} x i1> %sneg{r}_{v}{sfx}, {vt} zeroinitializer, {vt} {val}")
                    val = f"%sr{r}_{v}{sfx}"
                if act == "relu6":
                    six = f"<{', '.join(['float 6.0'] * L)}>"
                    a(f"  %ssix{r}_{v}{sfx} = fcmp ogt {vt} {val}, {six}")
                    a(f"  %sr6{r}_{v}{sfx} = select <{L} x i1> %ssix{r}_{v}{sfx}, {vt} {six}, {vt} {val}")
                    val = f"%sr6{r}_{v}{sfx}"
                if act == "hardswish":
                    out += hardswish_lines(f"%shs{r}_{v}{sfx}", val, L)
                    val = f"%shs{r}_{v}{sfx}"
                if act in ("silu", "sigmoid", "gelu"):
                    lines, val = activation_lines(act, f"%ssg{r}_{v}{sfx}", val, L)
                    out += lines
                a(f"  %syp{r}_{v}{sfx} = getelementptr float, ptr %yr{r}{sfx}, i64 {v * L}")
                a(f"  call void @llvm.masked.store.v{L}f32.p0({vt} {val}, ptr %syp{r}_{v}{sfx}, i32 4, <{L} x i1> %mask{v})")
            a(f"  br label %{nxt}")
    a("tile.end:")
    a("  %t.n = add i64 %t, 1")
    a("  %tc = icmp ult i64 %t.n, %hi")
    a("  br i1 %tc, label %tile, label %panel.end")
    a("panel.end:")
    a("  %p.n = add i64 %p, 1")
    a("  %pc = icmp ult i64 %p.n, %np")
    a("  br i1 %pc, label %panel, label %exit")
    a("exit:")
    a("  ret void")
    a("}")
    return out


def conv_ir(name: str, cfg: GemmConfig, act: str, dims: dict[str, int]) -> str:
    """The LLVM IR of one convolution kernel (see the module doc): tile ``cfg``, activation
    ``act`` (one of ``ACTS`` or ``CLAMP_ACTS``) after the residual add where the call gives one (``other`` not
    null), the dimensions ``dims`` (``PARAMS[5:]``, each a constant of the kernel)."""
    if act not in ACTS + CLAMP_ACTS:
        raise ValueError(f"partita.codegen.conv: no activation {act!r} (known: {', '.join(ACTS + CLAMP_ACTS)})")
    out = (_prologue(name, cfg, dims, act) + _panel(cfg) + _tile_place(cfg, dims) + _prefetch(cfg) + _row_places(cfg)
           + _tap_rows(name, cfg) + _channel_loops(cfg) + _store_tile(cfg, act))
    if all(f in dims for f in PARAMS[5:]):
        out += whole_entry(name, sum(sg[2] for sg in segments(dims, cfg.mr)))
    return "\n".join(out) + "\n"


def whole_entry(name: str, tiles: int) -> list[str]:
    """``NAME_all(ptr params)``: every tile of the kernel ``name`` on the calling thread. A
    ctypes call of one argument costs about 0.2 us against 0.55 for the range kernel's four
    (one thread, AMD EPYC Zen 4), as ``depthwise.WHOLE_SUFFIX``'s entry."""
    return [f"define void @{name}{WHOLE_SUFFIX}(ptr %pp) nounwind {{",
            f"  call void @{name}(ptr %pp, i64 0, i64 {tiles}, i64 0)",
            "  ret void",
            "}"]


_LOCK = threading.Lock()
_KERNELS: dict[tuple, Any] = {}


def kernel(cfg: GemmConfig, act: str, dims: dict[str, int]) -> Any:
    """The compiled kernel (a ctypes function) for tile ``cfg``, ``act`` and the dimensions
    ``dims`` (one for a convolution with and without a residual: the call says)."""
    return kernels(cfg, act, dims)[0]


def kernels(cfg: GemmConfig, act: str, dims: dict[str, int]) -> tuple[Any, Any]:
    """The compiled kernel over a range of tiles and its whole-range entry (``fn(params)``,
    every tile on the calling thread), as ctypes functions, made once a process for these
    constants (``dims``: every dimension of ``PARAMS[5:]``)."""
    key = (cfg, act, tuple(sorted(dims.items())))
    with _LOCK:
        fns = _KERNELS.get(key)
        if fns is None:
            name = kernel_name(cfg, act, dims)
            j = jit()
            fn = j.kernel(name, conv_ir(name, cfg, act, dims), 0,
                          argtypes=[ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]).fn
            with j.lock:   # loaded with the kernel: the same object file
                addr = j.engine.get_function_address(name + WHOLE_SUFFIX)
            if not addr:
                raise CodegenError(f"kernel {name}{WHOLE_SUFFIX} is missing from its machine code")
            fns = _KERNELS[key] = (fn, ctypes.CFUNCTYPE(None, ctypes.c_void_p)(addr))
        return fns


def kernel_name(cfg: GemmConfig, act: str, dims: dict[str, int]) -> str:
    return f"pt_conv_{cfg.mr}x{cfg.nr}_l{cfg.lanes}_{act}" + "".join(f"_{k}{v}" for k, v in sorted(dims.items()))


def conv_dims(x_shape: tuple, w_shape: tuple, stride: list, padding: list,
              padding_end: list | None = None) -> dict[str, int]:
    """The kernel's dimensions (``PARAMS[5:]``) of a convolution of ``x_shape`` by ``w_shape``,
    ``padding`` zeros before each spatial dim (top, left) and ``padding_end`` after (bottom,
    right; ``padding``'s where None). The kernel reads the padding before as ``ph``, ``pw``;
    the padding after only sets the result's size (a tap past the image reads zeros)."""
    n, c, h, w = x_shape
    co, _, kh, kw = w_shape
    sh, sw = stride
    ph, pw = padding
    pb, pr = padding if padding_end is None else padding_end
    ho, wo = (h + ph + pb - kh) // sh + 1, (w + pw + pr - kw) // sw + 1
    return dict(zip(PARAMS[5:], (n, h, w, c, ho, wo, co, kh, kw, sh, sw, ph, pw)))


def kernel_source(x_shape: tuple, w_shape: tuple, stride: list, padding: list, act: str) -> tuple[str, str]:
    """The name and LLVM IR of the kernel ``PreparedConv`` compiles for these (``partita opt
    --emit=kernels`` prints it)."""
    dims = conv_dims(x_shape, w_shape, stride, padding)
    cfg = tile_for(dims["n"] * dims["ho"] * dims["wo"], dims["co"])
    name = kernel_name(cfg, act, dims)
    return name, conv_ir(name, cfg, act, dims)


def conv_configs(lanes: int) -> tuple[GemmConfig, ...]:
    """The register tiles of the convolution, in order of preference: on AVX-512 6 x 64
    (24 accumulators) and 8 x 32 (16), on AVX2 the GEMM's 6 x 16 and 4 x 24. With 32 output
    channels 8 x 32 was 3 to 8% faster than 12 x 32, the GEMM's tile for 32 columns, and 10 x 32
    in between (8 x 32 x 64 x 64, 3 x 3; AMD EPYC Zen 4, one thread, interleaved with oneDNN)."""
    if lanes >= 16:
        return (GemmConfig(lanes=16, mr=6, nr=64, kc=256, mc=96), GemmConfig(lanes=16, mr=8, nr=32, kc=256, mc=96))
    return gemm_configs(lanes)


def tile_for(m: int, co: int) -> GemmConfig:
    """The tile of ``conv_configs`` with the least padded work for ``m`` pixels and ``co``
    output channels (``gemm.choose``'s rule)."""
    return choose(m, co, vector_width(), conv_configs(vector_width()))


def pack_weight(w: Any, nr: int) -> Any:
    """``w`` [Co, C, KH, KW] as the kernel's panels [ceil(Co / nr), KH * KW * C, nr]."""
    co, c, kh, kw = w.shape
    return pack_b(w.detach().permute(2, 3, 1, 0).reshape(kh * kw * c, co), nr)


def block_diagonal(w: Any, groups: int) -> Any:
    """A grouped convolution's weight [Co, C / groups, KH, KW] as the dense [Co, C, KH, KW] one
    of the same convolution: group ``g``'s output channels read its own input channels alone."""
    if groups == 1:
        return w
    co, cg, kh, kw = w.shape
    cog = co // groups
    dense = w.new_zeros((co, cg * groups, kh, kw))
    for g in range(groups):
        dense[g * cog:(g + 1) * cog, g * cg:(g + 1) * cg] = w[g * cog:(g + 1) * cog]
    return dense


def supported(x_shape: tuple, w_shape: tuple, stride: list, padding: list, dilation: list, groups: int,
              candidate: bool = False) -> str:
    """Why the generated convolution does not take these, or "" where it does. ``candidate``:
    whether it can run them at all (as a candidate the measured choice times against the
    library's kernels), a padded tile included; without, whether the rules prefer it."""
    if len(x_shape) != 4 or len(w_shape) != 4:
        return "not a 2-d convolution"
    if len(stride) != 2 or len(padding) != 2 or len(dilation) != 2:
        return f"stride {list(stride)}, padding {list(padding)}, dilation {list(dilation)} (the kernel takes two each)"
    if groups != 1:
        if not candidate:
            return f"groups={groups} (the rules' kernel takes groups=1; a grouped one is a candidate of the measured choice)"
        if w_shape[1] * groups != x_shape[1] or groups > GROUPED_MAX_GROUPS or x_shape[1] > GROUPED_MAX_CHANNELS:
            return (f"groups={groups} on {x_shape[1]} channels (as a block-diagonal weight: at most "
                    f"{GROUPED_MAX_GROUPS} groups and {GROUPED_MAX_CHANNELS} channels)")
    if any(d != 1 for d in dilation):
        return f"dilation={list(dilation)} (the kernel takes dilation 1)"
    if x_shape[1] > MAX_CHANNELS:
        return f"{x_shape[1]} input channels (at most {MAX_CHANNELS})"
    co = w_shape[0]
    if candidate:
        return ""
    nr = tile_for(max(1, x_shape[0]), co).nr
    padded = -(-co // nr) * nr
    if padded > MAX_PADDING * co:
        return f"{co} output channels fill {100 * co // padded}% of the {nr}-wide tile"
    return ""


class PreparedConv:
    """One node's convolution, fixed when the executor prepares it: shapes, tile, kernel,
    parameter block. ``__call__(x, packed, bias, other, out)`` takes NCHW-shaped tensors in
    channels-last memory (others are converted) and returns the channels-last result, in
    ``out`` where given (channels-last, of the result's shape). Like the program that holds
    it, one call at a time (the parameter block is reused)."""

    def __init__(self, x_shape: tuple, w_shape: tuple, stride: list, padding: list, act: str = "none",
                 other: bool = False, cfg: GemmConfig | None = None, padding_end: list | None = None,
                 groups: int = 1) -> None:
        self.groups = groups  # > 1: run as the dense convolution of the block-diagonal weight
        w_shape = (w_shape[0], w_shape[1] * groups, *w_shape[2:])
        dims = conv_dims(x_shape, w_shape, stride, padding, padding_end)
        self.ho, self.wo = dims["ho"], dims["wo"]
        self.shape = (dims["n"], dims["co"], self.ho, self.wo)
        self.m = dims["n"] * self.ho * self.wo
        self.cfg = cfg = cfg or tile_for(self.m, dims["co"])
        self.tiles = sum(sg[2] for sg in segments(dims, cfg.mr)) if self.m else 0
        self.fn: Any = None
        self.whole: Any = None
        if self.m:
            self.fn, self.whole = kernels(cfg, act, dims)
        self.params = (ctypes.c_int64 * len(PARAMS))(0, 0, 0, 0, 0, *(dims[f] for f in PARAMS[5:]))
        self.addr = ctypes.addressof(self.params)
        self.other = other
        self.last: tuple | None = None   # the tensors the parameter block points at (``bound_call``)
        self.to_cl = ToChannelsLast()   # an NCHW input (a stem's image) converted

    def pack(self, w: Any) -> Any:
        return pack_weight(block_diagonal(w, self.groups), self.cfg.nr)

    def native_entry(self, x: Any, packed: Any, bias: Any, other: Any, out: Any) -> tuple[int, int] | None:
        """``bound_entry`` of this kernel: what one thread's call with these tensors runs."""
        return bound_entry(self.last, self.whole, self.addr, x, packed, bias, other, out)

    def __call__(self, x: Any, packed: Any, bias: Any = None, other: Any = None, out: Any = None) -> Any:
        last = self.last
        # the very tensors of the last call at the same addresses (``bound_call``, inlined: this
        # runs at every call of the program)
        if last is not None and last[0] is x and last[1] is packed and last[2] is bias and last[3] is other \
                and last[4] is out and x.data_ptr() == last[5] and (bias is None or bias.data_ptr() == last[6]) \
                and (other is None or other.data_ptr() == last[7]):
            if self.tiles > 1 and torch.get_num_threads() > 1:
                split_on_team(self.fn, self.params, self.tiles, min(torch.get_num_threads(), self.tiles))
            else:
                self.whole(self.addr)
            return out
        self.last = None
        cl = torch.channels_last
        if not x.is_contiguous(memory_format=cl):
            x = self.to_cl(x)
        y = torch.empty(self.shape, dtype=torch.float32, memory_format=cl) if out is None else out
        if self.m == 0:
            return y
        p = self.params
        p[0], p[1], p[4] = x.data_ptr(), packed.data_ptr(), y.data_ptr()
        if bias is not None:
            bias = bias.contiguous()
        p[2] = 0 if bias is None else bias.data_ptr()
        if self.other:
            if not other.is_contiguous(memory_format=cl):
                other = other.contiguous(memory_format=cl)
            p[3] = other.data_ptr()
        fn = self.fn
        assert fn is not None
        self.last = bound_args(x, packed, bias, other, out)
        nt = min(torch.get_num_threads(), self.tiles)
        if nt > 1:
            split_on_team(fn, p, self.tiles, nt)
        else:
            self.whole(self.addr)
        return y


def bound_args(x: Any, packed: Any, bias: Any, other: Any, out: Any) -> tuple | None:
    """What a prepared kernel keeps of a call whose parameter block now points at these tensors,
    so that a later call with the same ones skips the conversions and pointer writes: the
    tensors and the addresses of those that come from outside the program (the input, bias,
    residual). None (nothing kept) where ``out`` was not given (each call's result is new) or
    where the block points at a converted copy (an input not in channels-last memory, a
    non-contiguous bias)."""
    cl = torch.channels_last
    if out is None or not x.is_contiguous(memory_format=cl) or (bias is not None and not bias.is_contiguous()) \
            or (other is not None and not other.is_contiguous(memory_format=cl)):
        return None
    return (x, packed, bias, other, out, x.data_ptr(), None if bias is None else bias.data_ptr(),
            None if other is None else other.data_ptr())


def bound_entry(last: tuple | None, whole: Any, addr: int, x: Any, packed: Any, bias: Any, other: Any,
                out: Any) -> tuple[int, int] | None:
    """(the whole-range entry's address, the parameter block's) where a call with these tensors
    (``x`` None: the last call's input, bias and residual) is that entry on the block as it
    stands (``bound_call``), else None: what codegen/step_chain.py calls in its place."""
    if last is None or whole is None:
        return None
    if x is None:
        x, bias, other = last[0], last[2], last[3]
    if not bound_call(last, x, packed, bias, other, out):
        return None
    return ctypes.cast(whole, ctypes.c_void_p).value or 0, addr


def bound_call(last: tuple, x: Any, packed: Any, bias: Any, other: Any, out: Any) -> bool:
    """Whether a call takes the very tensors of ``last`` (``bound_args``) at the same addresses:
    the parameter block holds them already (the arena's views and the packed weight are the
    same objects at every call of a program; the input, bias and residual are checked by
    address, as a tensor's storage can be swapped)."""
    return (last[0] is x and last[1] is packed and last[2] is bias and last[3] is other and last[4] is out
            and x.data_ptr() == last[5] and (bias is None or bias.data_ptr() == last[6])
            and (other is None or other.data_ptr() == last[7]))
