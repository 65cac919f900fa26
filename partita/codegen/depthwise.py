"""A generated f32 depthwise convolution on channels-last (NHWC) tensors (groups = input
channels = output channels, as in MobileNets, EfficientNet and ConvNeXt's 7 x 7), with bias,
a residual add and an activation (``ACTS``: ReLU, SiLU, sigmoid, GELU) applied as each result is
written.

    y[n, oy, ox, c] = act(bias[c] + sum_{ky, kx} x[n, oy*sh - ph + ky*dh, ox*sw - pw + kx*dw, c]
                                                 * w[c, 0, ky, kx]  (+ other[n, oy, ox, c]))

Each channel is its own convolution, so there is no reduction over channels to tile: the
kernel runs along the channels in vectors of ``lanes`` floats (the last one masked where C is
not a multiple) and keeps the sums of a block of output pixels in registers through every tap.

- The work is one output row ``(n, oy)`` at a time (``N * Ho`` rows, split between threads by
  ``split_on_team``). A row's kernel rows inside the image, ``[ky_lo, ky_hi)``, are worked out
  once, so a row in the top or bottom padding simply runs fewer kernel rows.
- A row's output columns fall into border columns (their leftmost or rightmost taps in the
  padding: blocks of their own, each pixel with its own, constant, kernel columns) and the
  interior, taken in blocks of ``PX`` pixels (``pixel_block``), then one block of the
  remainder.
- For a block of P pixels and one kernel row, the ``(P - 1) * sw + KW`` input vectors the
  block reads are loaded once and the KW weight vectors once; the P x KW multiply-adds reuse
  them (a sliding window in registers).
- The weight is packed once per node (``pack_weight``: ``[KH * KW, Cp]``, Cp the channels
  rounded up to whole vectors, the padding zero), so each tap's channel vector is one load.
- Every dimension is a constant of the kernel (``PreparedDepthwise`` compiles one per node
  shape, kept in the disk cache), so the offsets are immediates and there is no division by a
  variable.

The kernel is ``NAME(ptr params, i64 lo, i64 hi, i64 tid)`` over the output rows ``[lo, hi)``,
the parameters an i64 block (``PARAMS``: x, packed weight, bias, other, y). A residual
``other`` may share the result's buffer (each element of it is read just before the same
element of the result is written). Any dilation (a dilated kernel row reads every ``dw``-th
input column); a weight of one channel per group (``supported``).
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

from ..ops._lazy import torch
from .conv import act_declarations, bound_args, bound_entry, gelu_lines, hardswish_lines
from .cpu import split_on_team
from .jit import CodegenError, jit
from .lowering import vector_width
from .mathlib import f32
from .nhwc import ToChannelsLast

__all__ = ["PARAMS", "ACTS", "CLAMP_ACTS", "depthwise_ir", "depthwise_dims", "column_blocks", "pixel_block", "kernel",
           "kernels", "kernel_name", "kernel_source", "pack_weight", "PreparedDepthwise", "supported", "MAX_BORDER",
           "MAX_KERNEL", "WHOLE_SUFFIX"]

PARAMS = ["x", "w", "bias", "other", "y"]
# The activations the kernel applies; silu and sigmoid on the inlined vector exp of
# ``mathlib.exp_neg_ir`` (of -|v|, so never above 1), one division a vector; GELU (erf) as the
# direct convolution applies it (``conv.gelu_lines``).
ACTS = ("none", "relu", "silu", "sigmoid", "gelu")
# The clamps it applies too (codegen/epilogue.py's CLAMPS): ReLU6 and hardswish.
CLAMP_ACTS = ("relu6", "hardswish")
# A row with more border columns than this (a kernel wider than the image) runs on the library:
# each border column is code of its own.
MAX_BORDER = 16
# The largest kernel side: a block's sliding window (inputs, weights, sums) stays in registers.
MAX_KERNEL = 11
# The whole-range entry's symbol: the kernel's name and this.
WHOLE_SUFFIX = "_all"


def pixel_block(lanes: int, kw: int, sw: int, dw: int = 1) -> int:
    """How many output pixels an interior block keeps in registers: as many as let the block's
    P sums, the inputs it reads of a kernel row (``(P - 1) * sw + KW`` without dilation) and
    the KW weights fit the vector registers (32 with AVX-512, 16 with AVX2), at least 1, at
    most 8."""
    regs = 32 if lanes >= 16 else 16
    best = 1
    for p in range(1, 9):
        if p + len({q * sw + kx * dw for q in range(p) for kx in range(kw)}) + kw <= regs:
            best = p
    return best


def depthwise_dims(x_shape: tuple, w_shape: tuple, stride: list, padding: list,
                   dilation: list | tuple = (1, 1), padding_end: list | None = None) -> dict[str, int]:
    """The kernel's dimensions of a depthwise convolution of ``x_shape`` by ``w_shape``:
    ``padding`` zeros before each spatial dim, ``padding_end`` after (``padding``'s where
    None; it only sets the result's size, a tap past the image reading zeros)."""
    n, c, h, w = x_shape
    _, _, kh, kw = w_shape
    sh, sw = stride
    ph, pw = padding
    pb, pr = padding if padding_end is None else padding_end
    dh, dw = dilation
    ho, wo = (h + ph + pb - dh * (kh - 1) - 1) // sh + 1, (w + pw + pr - dw * (kw - 1) - 1) // sw + 1
    return dict(n=n, c=c, h=h, w=w, ho=ho, wo=wo, kh=kh, kw=kw, sh=sh, sw=sw, ph=ph, pw=pw, dh=dh, dw=dw)


def _kx_range(d: dict[str, int], ox: int) -> tuple[int, int]:
    """The kernel columns of output column ``ox`` that fall inside the image."""
    ix0, dw = ox * d["sw"] - d["pw"], d["dw"]
    return max(0, -(ix0 // dw)), min(d["kw"], -((ix0 - d["w"]) // dw))


def column_blocks(d: dict[str, int], px: int) -> list[tuple[int, int, int]]:
    """A row's output columns as blocks ``(first column, pixels, repeats)``: the left border
    columns (up to ``px`` a block, each pixel with its own kernel columns), the interior in
    ``repeats`` blocks of ``px`` pixels and one block of the remainder, the right border."""
    wo, kw = d["wo"], d["kw"]
    full = [ox for ox in range(wo) if _kx_range(d, ox) == (0, kw)]
    xl, xr = (full[0], full[-1] + 1) if full else (wo, wo)   # the interior: every tap inside

    def border(x0: int, x1: int) -> list[tuple[int, int, int]]:
        return [(ox, min(px, x1 - ox), 1) for ox in range(x0, x1, px)]

    out = border(0, xl)
    nblk, rem = divmod(xr - xl, px)
    if nblk:
        out.append((xl, px, nblk))
    if rem:
        out.append((xl + nblk * px, rem, 1))
    return out + border(xr, wo)


class _Emitter:
    """The IR lines of one kernel, with its constants."""

    def __init__(self, d: dict[str, int], lanes: int, act: str, other: bool) -> None:
        self.d, self.L, self.act, self.other = d, lanes, act, other
        self.vt = f"<{lanes} x float>"
        self.cp = -(-d["c"] // lanes) * lanes       # the packed weight's row: whole vectors
        self.nf, self.tail = divmod(d["c"], lanes)  # full channel vectors, channels in the last
        self.lines: list[str] = []

    def a(self, line: str) -> None:
        """Append one line of IR."""
        self.lines.append(line)

    def load(self, dst: str, ptr: str, masked: bool) -> None:
        """``dst`` = the channel vector at ``ptr`` (the tail's lanes past C read as zero)."""
        L, vt = self.L, self.vt
        if masked:
            self.a(f"  {dst} = call {vt} @llvm.masked.load.v{L}f32.p0(ptr {ptr}, i32 4, <{L} x i1> %tmask, "
                   f"{vt} zeroinitializer)")
        else:
            self.a(f"  {dst} = load {vt}, ptr {ptr}, align 4")

    def store(self, val: str, ptr: str, masked: bool) -> None:
        """The channel vector ``val`` written at ``ptr`` (only the tail's lanes below C)."""
        L, vt = self.L, self.vt
        if masked:
            self.a(f"  call void @llvm.masked.store.v{L}f32.p0({vt} {val}, ptr {ptr}, i32 4, <{L} x i1> %tmask)")
        else:
            self.a(f"  store {vt} {val}, ptr {ptr}, align 4")


def _prologue(e: _Emitter, name: str) -> None:
    """The declarations, the signature, the parameters and the head of a row: its image, its
    kernel rows inside the image and its offsets."""
    d, L, vt, a = e.d, e.L, e.vt, e.a
    a(f"declare {vt} @llvm.fma.v{L}f32({vt}, {vt}, {vt})")
    a(f"declare void @llvm.masked.store.v{L}f32.p0({vt}, ptr, i32, <{L} x i1>)")
    a(f"declare {vt} @llvm.masked.load.v{L}f32.p0(ptr, i32, <{L} x i1>, {vt})")
    for line in act_declarations(e.act, L):
        a(line)
    a(f"define void @{name}(ptr noalias %pp, i64 %lo, i64 %hi, i64 %tid) nounwind {{")
    a("entry:")
    for i, f in enumerate(PARAMS):
        a(f"  %{f}.a = getelementptr inbounds i64, ptr %pp, i64 {i}")
        a(f"  %{f}.i = load i64, ptr %{f}.a, align 8")
        a(f"  %{f}p = inttoptr i64 %{f}.i to ptr")
    bits = ", ".join(f"i1 {'true' if i < e.tail else 'false'}" for i in range(L))
    a(f"  %tmask = add <{L} x i1> <{bits}>, zeroinitializer")
    a("  %empty = icmp uge i64 %lo, %hi")
    a("  br i1 %empty, label %exit, label %row")
    a("row:")
    a("  %r = phi i64 [%lo, %entry], [%r.n, %row.end]")
    a(f"  %img = udiv i64 %r, {d['ho']}")
    a(f"  %oy = urem i64 %r, {d['ho']}")
    a(f"  %iy0.s = mul i64 %oy, {d['sh']}")
    a(f"  %iy0 = sub i64 %iy0.s, {d['ph']}")
    # the kernel rows inside the image: ky from ceil(-iy0 / dh) (0 at least) to
    # ceil((H - iy0) / dh) (KH at most)
    dh = d["dh"]
    a("  %kylo.a = sub i64 0, %iy0")
    a(f"  %kylo.b = add i64 %kylo.a, {dh - 1}")
    a(f"  %kylo.0 = sdiv i64 %kylo.b, {dh}")
    a("  %kylo.c = icmp sgt i64 %kylo.0, 0")
    a("  %kylo = select i1 %kylo.c, i64 %kylo.0, i64 0")
    a(f"  %kyhi.a = sub i64 {d['h'] + dh - 1}, %iy0")
    a(f"  %kyhi.0 = sdiv i64 %kyhi.a, {dh}")
    a(f"  %kyhi.c = icmp slt i64 %kyhi.0, {d['kh']}")
    a(f"  %kyhi = select i1 %kyhi.c, i64 %kyhi.0, i64 {d['kh']}")
    a("  %hasrows = icmp slt i64 %kylo, %kyhi")
    a(f"  %xrow.a = mul i64 %img, {d['h']}")
    a("  %xrow.b = add i64 %xrow.a, %iy0")
    a(f"  %xrow0 = mul i64 %xrow.b, {d['w']}")      # the image row of kernel row 0 (may be < 0)
    a(f"  %yrow = mul i64 %r, {d['wo']}")


def _block(e: _Emitter, bp: str, cv: str, ox0: str, ranges: list[tuple[int, int]], masked: bool,
           after: str) -> None:
    """One channel vector (``cv``) of P = len(ranges) output pixels from column ``ox0``: the
    kernel rows of the row in a loop, each pixel's kernel columns ``ranges[p]`` unrolled on a
    sliding window of inputs, then bias, residual and activation, and the P results written."""
    d, L, vt, a = e.d, e.L, e.vt, e.a
    c, kw, sw, cp = d["c"], d["kw"], d["sw"], e.cp
    P = len(ranges)
    a(f"{bp}.pre:")
    a(f"  %{bp}.ix0.s = mul i64 {ox0}, {sw}")
    a(f"  %{bp}.ix0 = sub i64 %{bp}.ix0.s, {d['pw']}")
    a(f"  %{bp}.coff = mul i64 {cv}, {L}")
    a(f"  %{bp}.ixc.a = mul i64 %{bp}.ix0, {c}")
    a(f"  %{bp}.ixc = add i64 %{bp}.ixc.a, %{bp}.coff")
    a(f"  br i1 %hasrows, label %{bp}.ky, label %{bp}.done")
    dw = d["dw"]
    cols = sorted({p * sw + kx * dw for p, (lo, hi) in enumerate(ranges) for kx in range(lo, hi)})
    taps = sorted({kx for lo, hi in ranges for kx in range(lo, hi)})
    # each pixel's last sum of a kernel row (its phi's own value where it has no tap)
    last = [f"%{bp}.f{p}_{hi - 1}" if hi > lo else f"%{bp}.a{p}" for p, (lo, hi) in enumerate(ranges)]
    a(f"{bp}.ky:")
    a(f"  %{bp}.k = phi i64 [%kylo, %{bp}.pre], [%{bp}.k.n, %{bp}.ky]")
    for p in range(P):
        a(f"  %{bp}.a{p} = phi {vt} [zeroinitializer, %{bp}.pre], [{last[p]}, %{bp}.ky]")
    a(f"  %{bp}.kr.a = mul i64 %{bp}.k, {d['dh'] * d['w']}")
    a(f"  %{bp}.kr = add i64 %{bp}.kr.a, %xrow0")
    a(f"  %{bp}.xo.a = mul i64 %{bp}.kr, {c}")
    a(f"  %{bp}.xo = add i64 %{bp}.xo.a, %{bp}.ixc")
    a(f"  %{bp}.xp = getelementptr float, ptr %xp, i64 %{bp}.xo")
    a(f"  %{bp}.wo.a = mul i64 %{bp}.k, {kw * cp}")
    a(f"  %{bp}.wo = add i64 %{bp}.wo.a, %{bp}.coff")
    a(f"  %{bp}.wp = getelementptr float, ptr %wp, i64 %{bp}.wo")
    for j in cols:
        a(f"  %{bp}.xq{j} = getelementptr float, ptr %{bp}.xp, i64 {j * c}")
        e.load(f"%{bp}.x{j}", f"%{bp}.xq{j}", masked)
    for kx in taps:
        a(f"  %{bp}.wq{kx} = getelementptr float, ptr %{bp}.wp, i64 {kx * cp}")
        a(f"  %{bp}.w{kx} = load {vt}, ptr %{bp}.wq{kx}, align 4")
    for p, (lo, hi) in enumerate(ranges):
        acc = f"%{bp}.a{p}"
        for kx in range(lo, hi):
            nxt = f"%{bp}.f{p}_{kx}"
            a(f"  {nxt} = call {vt} @llvm.fma.v{L}f32({vt} %{bp}.x{p * sw + kx * dw}, {vt} %{bp}.w{kx}, {vt} {acc})")
            acc = nxt
    a(f"  %{bp}.k.n = add i64 %{bp}.k, 1")
    a(f"  %{bp}.kc = icmp slt i64 %{bp}.k.n, %kyhi")
    a(f"  br i1 %{bp}.kc, label %{bp}.ky, label %{bp}.done")
    a(f"{bp}.done:")
    for p in range(P):
        a(f"  %{bp}.s{p} = phi {vt} [zeroinitializer, %{bp}.pre], [{last[p]}, %{bp}.ky]")
    a(f"  %{bp}.bq = getelementptr float, ptr %biasp, i64 %{bp}.coff")
    e.load(f"%{bp}.b", f"%{bp}.bq", masked)
    a(f"  %{bp}.yo.a = add i64 %yrow, {ox0}")
    a(f"  %{bp}.yo.b = mul i64 %{bp}.yo.a, {c}")
    a(f"  %{bp}.yo = add i64 %{bp}.yo.b, %{bp}.coff")
    for p in range(P):
        a(f"  %{bp}.yo.{p} = add i64 %{bp}.yo, {p * c}")
    _epilogue(e, bp, P, masked)
    a(f"  br label %{after}")


def _epilogue(e: _Emitter, bp: str, P: int, masked: bool) -> None:
    """The P sums plus the bias, the residual (read just before the result is written at the
    same place) and the activation, written."""
    L, vt, a = e.L, e.vt, e.a
    for p in range(P):
        a(f"  %{bp}.q{p} = getelementptr float, ptr %yp, i64 %{bp}.yo.{p}")
        val = f"%{bp}.v{p}"
        a(f"  {val} = fadd {vt} %{bp}.s{p}, %{bp}.b")
        if e.other:
            a(f"  %{bp}.oq{p} = getelementptr float, ptr %otherp, i64 %{bp}.yo.{p}")
            e.load(f"%{bp}.o{p}", f"%{bp}.oq{p}", masked)
            a(f"  %{bp}.vo{p} = fadd {vt} {val}, %{bp}.o{p}")
            val = f"%{bp}.vo{p}"
        if e.act in ("relu", "relu6"):  # NaN stays NaN, as torch's relu (and maximum, minimum)
            a(f"  %{bp}.neg{p} = fcmp olt {vt} {val}, zeroinitializer")
            a(f"  %{bp}.vr{p} = select <{L} x i1> %{bp}.neg{p}, {vt} zeroinitializer, {vt} {val}")
            val = f"%{bp}.vr{p}"
        if e.act == "relu6":
            six = f"<{', '.join(['float 6.0'] * L)}>"
            a(f"  %{bp}.six{p} = fcmp ogt {vt} {val}, {six}")
            a(f"  %{bp}.v6{p} = select <{L} x i1> %{bp}.six{p}, {vt} {six}, {vt} {val}")
            val = f"%{bp}.v6{p}"
        elif e.act == "hardswish":
            for line in hardswish_lines(f"%{bp}.hs{p}", val, L):
                a(line)
            val = f"%{bp}.hs{p}"
        elif e.act in ("silu", "sigmoid"):
            val = _sigmoid(e, f"{bp}.g{p}", val, e.act == "silu")
        elif e.act == "gelu":
            for line in gelu_lines(f"%{bp}.ge{p}", val, L):
                a(line)
            val = f"%{bp}.ge{p}"
        e.store(val, f"%{bp}.q{p}", masked)


def _sigmoid(e: _Emitter, tag: str, v: str, times_v: bool) -> str:
    """sigmoid(v) (times v: silu) as 1 / (1 + z) for v >= 0, z / (1 + z) below, z = exp(-|v|):
    the exp's argument never positive, nothing overflows; NaN stays NaN."""
    L, vt, a = e.L, e.vt, e.a
    one = f"splat (float {f32(1.0)})"
    a(f"  %{tag}.abs = call {vt} @llvm.fabs.v{L}f32({vt} {v})")
    a(f"  %{tag}.na = fneg {vt} %{tag}.abs")
    a(f"  %{tag}.z = call {vt} @pt_vexpf_neg{L}({vt} %{tag}.na)")
    a(f"  %{tag}.d = fadd {vt} %{tag}.z, {one}")
    a(f"  %{tag}.pos = fcmp oge {vt} {v}, zeroinitializer")
    a(f"  %{tag}.num = select <{L} x i1> %{tag}.pos, {vt} {one}, {vt} %{tag}.z")
    a(f"  %{tag}.s = fdiv {vt} %{tag}.num, %{tag}.d")
    if not times_v:
        return f"%{tag}.s"
    a(f"  %{tag}.r = fmul {vt} {v}, %{tag}.s")
    return f"%{tag}.r"


def _channels(e: _Emitter, sp: str, ox0: str, ranges: list[tuple[int, int]], after: str) -> None:
    """A block of pixels over every channel: the full vectors in a loop, then the masked last."""
    a = e.a
    a(f"{sp}.c:")
    if e.nf:
        a(f"  br label %{sp}.cv")
        a(f"{sp}.cv:")
        a(f"  %{sp}.cvi = phi i64 [0, %{sp}.c], [%{sp}.cvi.n, %{sp}.cvend]")
        a(f"  br label %{sp}.f.pre")
        _block(e, f"{sp}.f", f"%{sp}.cvi", ox0, ranges, False, f"{sp}.cvend")
        a(f"{sp}.cvend:")
        a(f"  %{sp}.cvi.n = add i64 %{sp}.cvi, 1")
        a(f"  %{sp}.cvc = icmp ult i64 %{sp}.cvi.n, {e.nf}")
        a(f"  br i1 %{sp}.cvc, label %{sp}.cv, label %{sp + '.t.pre' if e.tail else after}")
    else:
        a(f"  br label %{sp}.t.pre")
    if e.tail:
        _block(e, f"{sp}.t", str(e.nf), ox0, ranges, True, after)


def _columns(e: _Emitter) -> None:
    """A row's column blocks (``column_blocks``), one after another, then the next row."""
    d, a = e.d, e.a
    blocks = column_blocks(d, pixel_block(e.L, d["kw"], d["sw"], d["dw"]))
    a("  br label %s0")
    for i, (ox, P, reps) in enumerate(blocks):
        sp, after = f"s{i}", (f"s{i + 1}" if i + 1 < len(blocks) else "row.end")
        ranges = [_kx_range(d, ox + p) for p in range(P)] if reps == 1 else [(0, d["kw"])] * P
        a(f"{sp}:")
        if reps == 1:
            a(f"  br label %{sp}.c")
            _channels(e, sp, str(ox), ranges, after)
            continue
        a(f"  br label %{sp}.bl")
        a(f"{sp}.bl:")
        a(f"  %{sp}.b = phi i64 [0, %{sp}], [%{sp}.b.n, %{sp}.blend]")
        a(f"  %{sp}.ox.a = mul i64 %{sp}.b, {P}")
        a(f"  %{sp}.ox = add i64 %{sp}.ox.a, {ox}")
        a(f"  br label %{sp}.c")
        _channels(e, sp, f"%{sp}.ox", ranges, f"{sp}.blend")
        a(f"{sp}.blend:")
        a(f"  %{sp}.b.n = add i64 %{sp}.b, 1")
        a(f"  %{sp}.bc = icmp ult i64 %{sp}.b.n, {reps}")
        a(f"  br i1 %{sp}.bc, label %{sp}.bl, label %{after}")
    a("row.end:")
    a("  %r.n = add i64 %r, 1")
    a("  %rc = icmp ult i64 %r.n, %hi")
    a("  br i1 %rc, label %row, label %exit")
    a("exit:")
    a("  ret void")
    a("}")


def depthwise_ir(name: str, lanes: int, act: str, other: bool, dims: dict[str, int]) -> str:
    """The LLVM IR of one depthwise kernel (see the module doc): ``lanes`` floats a vector,
    activation ``act`` (one of ``ACTS``) after the residual add where ``other``, the dimensions
    ``dims`` (``depthwise_dims``), each a constant of the kernel."""
    if act not in ACTS + CLAMP_ACTS:
        raise ValueError(f"partita.codegen.depthwise: no activation {act!r} "
                         f"(known: {', '.join(ACTS + CLAMP_ACTS)})")
    e = _Emitter(dims, lanes, act, other)
    _prologue(e, name)
    _columns(e)
    # the whole range at once through one pointer argument: a ctypes call of one argument costs
    # about 0.2 us against 0.55 for four (one thread, AMD EPYC Zen 4), the kernel itself well
    # under a microsecond on the small maps of MobileNets
    e.a(f"define void @{name}{WHOLE_SUFFIX}(ptr %pp) nounwind {{")
    e.a(f"  call void @{name}(ptr %pp, i64 0, i64 {dims['n'] * dims['ho']}, i64 0)")
    e.a("  ret void")
    e.a("}")
    return "\n".join(e.lines) + "\n"


_LOCK = threading.Lock()
_KERNELS: dict[tuple, Any] = {}


def kernel_name(lanes: int, act: str, other: bool, dims: dict[str, int]) -> str:
    """The kernel's symbol: every constant it is made for."""
    return (f"pt_dwconv_l{lanes}_{act}{'_add' if other else ''}"
            + "".join(f"_{k}{v}" for k, v in sorted(dims.items())))


def kernel(lanes: int, act: str, other: bool, dims: dict[str, int]) -> Any:
    """The compiled kernel (a ctypes function) for these constants, made once a process (and
    kept in the disk cache)."""
    return kernels(lanes, act, other, dims)[0]


def kernels(lanes: int, act: str, other: bool, dims: dict[str, int]) -> tuple[Any, Any]:
    """The compiled kernel over a range of rows and its whole-range entry (``fn(params)``, every
    row on the calling thread), as ctypes functions, made once a process for these constants."""
    key = (lanes, act, other, tuple(sorted(dims.items())))
    with _LOCK:
        fns = _KERNELS.get(key)
        if fns is None:
            name = kernel_name(lanes, act, other, dims)
            j = jit()
            fn = j.kernel(name, depthwise_ir(name, lanes, act, other, dims), 0,
                          argtypes=[ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]).fn
            with j.lock:   # loaded with the kernel: the same object file
                addr = j.engine.get_function_address(name + WHOLE_SUFFIX)
            if not addr:
                raise CodegenError(f"kernel {name}{WHOLE_SUFFIX} is missing from its machine code")
            fns = _KERNELS[key] = (fn, ctypes.CFUNCTYPE(None, ctypes.c_void_p)(addr))
        return fns


def kernel_source(x_shape: tuple, w_shape: tuple, stride: list, padding: list, act: str,
                  other: bool = False, dilation: list | tuple = (1, 1)) -> tuple[str, str]:
    """The name and LLVM IR of the kernel ``PreparedDepthwise`` compiles for these (``partita
    opt --emit=kernels`` prints it)."""
    dims = depthwise_dims(x_shape, w_shape, stride, padding, dilation)
    name = kernel_name(vector_width(), act, other, dims)
    return name, depthwise_ir(name, vector_width(), act, other, dims)


def pack_weight(w: Any, lanes: int) -> Any:
    """``w`` [C, 1, KH, KW] as the kernel's [KH * KW, Cp] (Cp: C rounded up to ``lanes``, the
    padding zero)."""
    c, _, kh, kw = w.shape
    cp = -(-c // lanes) * lanes
    out = torch.zeros(kh * kw, cp, dtype=torch.float32)
    out[:, :c] = w.detach().reshape(c, kh * kw).t().to(torch.float32)
    return out


def supported(x_shape: tuple, w_shape: tuple, stride: list, padding: list, dilation: list, groups: int,
              padding_end: list | None = None) -> str:
    """Why the generated depthwise convolution does not take these, or "" where it does
    (``padding_end``: the zeros after each spatial dim, ``padding``'s where None)."""
    if len(x_shape) != 4 or len(w_shape) != 4:
        return "not a 2-d convolution"
    if len(stride) != 2 or len(padding) != 2 or len(dilation) != 2:
        return f"stride {list(stride)}, padding {list(padding)}, dilation {list(dilation)} (the kernel takes two each)"
    c = x_shape[1]
    if not (groups == c == w_shape[0] and w_shape[1] == 1):
        return f"groups={groups} with {c} input and {w_shape[0]} output channels (the kernel takes a depthwise one)"
    kh, kw = w_shape[2:]
    if not (1 <= kh <= MAX_KERNEL and 1 <= kw <= MAX_KERNEL):
        return f"a {kh} x {kw} kernel (at most {MAX_KERNEL} a side)"
    if any(s < 1 for s in stride) or any(d < 1 for d in dilation):
        return f"stride {list(stride)}, dilation {list(dilation)} (the kernel takes 1 or more)"
    if not (0 <= padding[0] <= dilation[0] * (kh - 1) and 0 <= padding[1] <= dilation[1] * (kw - 1)):
        return f"padding {list(padding)} (the kernel takes up to its dilated side less one)"
    end = padding if padding_end is None else padding_end
    if len(end) != 2 or not (0 <= end[0] <= dilation[0] * (kh - 1) and 0 <= end[1] <= dilation[1] * (kw - 1)):
        return f"padding_end {list(end)} (the kernel takes up to its dilated side less one)"
    dims = depthwise_dims(tuple(x_shape), tuple(w_shape), list(stride), list(padding), list(dilation),
                          None if padding_end is None else list(padding_end))
    if min(dims["n"], c, dims["ho"], dims["wo"]) < 1:
        return "an empty result"
    border = sum(1 for ox in range(dims["wo"]) if _kx_range(dims, ox) != (0, kw))
    if border > MAX_BORDER:
        return f"{border} border columns (at most {MAX_BORDER})"
    return ""


class PreparedDepthwise:
    """One node's depthwise convolution, fixed when the executor prepares it, with
    ``conv.PreparedConv``'s interface: ``pack(w)`` makes the packed weight once;
    ``__call__(x, packed, bias, other, out)`` takes NCHW-shaped tensors in channels-last memory
    (others are converted) and returns the channels-last result, in ``out`` where given. One
    call at a time (the parameter block is reused)."""

    def __init__(self, x_shape: tuple, w_shape: tuple, stride: list, padding: list, act: str = "none",
                 other: bool = False, dilation: list | tuple = (1, 1), padding_end: list | None = None) -> None:
        dims = depthwise_dims(x_shape, w_shape, stride, padding, dilation, padding_end)
        self.lanes = vector_width()
        self.shape = (dims["n"], dims["c"], dims["ho"], dims["wo"])
        self.rows = dims["n"] * dims["ho"]
        self.fn, self.whole = kernels(self.lanes, act, other, dims)
        self.params = (ctypes.c_int64 * len(PARAMS))()
        self.addr = ctypes.addressof(self.params)
        self.zero_bias = torch.zeros(dims["c"], dtype=torch.float32)
        self.other = other
        self.last: tuple | None = None   # the tensors the parameter block points at (conv.bound_call)
        self.to_cl = ToChannelsLast()   # an NCHW input (a stem's image) converted

    def pack(self, w: Any) -> Any:
        """The weight as the kernel reads it (``pack_weight``)."""
        return pack_weight(w, self.lanes)

    def native_entry(self, x: Any, packed: Any, bias: Any, other: Any, out: Any) -> tuple[int, int] | None:
        """``conv.bound_entry`` of this kernel: what one thread's call with these tensors runs."""
        return bound_entry(self.last, self.whole, self.addr, x, packed, bias, other, out)

    def __call__(self, x: Any, packed: Any, bias: Any = None, other: Any = None, out: Any = None) -> Any:
        """The convolution of ``x`` (channels-last) with the epilogue, on this call's threads."""
        last = self.last
        # the very tensors of the last call at the same addresses (conv.bound_call, inlined:
        # this runs at every call of the program)
        if last is not None and last[0] is x and last[1] is packed and last[2] is bias and last[3] is other \
                and last[4] is out and x.data_ptr() == last[5] and (bias is None or bias.data_ptr() == last[6]) \
                and (other is None or other.data_ptr() == last[7]):
            if self.rows > 1 and torch.get_num_threads() > 1:
                split_on_team(self.fn, self.params, self.rows, min(torch.get_num_threads(), self.rows))
            else:
                self.whole(self.addr)
            return out
        self.last = None
        cl = torch.channels_last
        if not x.is_contiguous(memory_format=cl):
            x = self.to_cl(x)
        y = torch.empty(self.shape, dtype=torch.float32, memory_format=cl) if out is None else out
        p = self.params
        b = self.zero_bias if bias is None else bias.contiguous()
        p[0], p[1], p[2], p[3], p[4] = x.data_ptr(), packed.data_ptr(), b.data_ptr(), 0, y.data_ptr()
        if self.other:
            if not other.is_contiguous(memory_format=cl):
                other = other.contiguous(memory_format=cl)
            p[3] = other.data_ptr()
        self.last = bound_args(x, packed, bias, other, out)
        nt = min(torch.get_num_threads(), self.rows)
        if nt > 1:
            split_on_team(self.fn, p, self.rows, nt)
        else:
            self.whole(self.addr)
        return y
