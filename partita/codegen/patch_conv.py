"""A generated kernel for patch convolutions (stride = kernel, no padding): ConvNeXt's stem and
downsampling layers, read in the input's own layout.

ConvNeXt's stem is a 4 x 4 convolution of stride 4 on the 3-channel NCHW image, its downsampling
layers 2 x 2 convolutions of stride 2. As a GEMM (library.py's ``_patch_conv``) the gather of
the patches copies runs of 4 or 2 floats (torch's copy of the 6-d transpose: 58 us for the zoo's
[4, 3, 32, 32]); the direct kernel (codegen/conv.py) first converts the input to channels-last
and then runs a 3-channel GEMM tile. This kernel reads each tap where it lies, in NCHW or in
channels-last memory (two variants, the one of each call's input), and writes the channels-last
result: for a block of P output pixels, the O output channels in vectors held in registers (the
bias first), then for each input channel the kh x kw taps, each an element of the input
broadcast and multiplied into the weight's row of O values ([C * kh * kw, O], packed once).
The P pixels' sums are independent chains, so the multiply-adds of one tap overlap.
"""

from __future__ import annotations

import ctypes
import math
from typing import Any

from ..ops._lazy import torch
from .cpu import split_on_team
from .lowering import vector_width

__all__ = ["supported", "patch_ir", "PreparedPatchConv", "MAX_TAPS"]

# Each tap of the kernel window is straight-line code inside the loop over the input channels.
MAX_TAPS = 64
# Accumulator registers a block may use (P pixels times the output channels' vectors).
MAX_ACCUMULATORS = 16

PARAMS = ("x", "w", "b", "y")


def supported(x_shape: tuple, w_shape: tuple, stride: list, padding: list, dilation: list, groups: int,
              padding_end: list | None, unary: str, other: bool) -> str:
    """Why the kernel does not take this convolution ("" when it does)."""
    if len(x_shape) != 4 or len(w_shape) != 4 or groups != 1:
        return f"groups={groups} or not 2-d (the kernel takes dense 2-d convolutions)"
    o, c, kh, kw = w_shape
    if tuple(stride) != (kh, kw) or any(padding) or padding_end is not None or any(d != 1 for d in dilation):
        return f"stride {list(stride)} is not the kernel {kh} x {kw}, or padding or dilation"
    if x_shape[2] % kh or x_shape[3] % kw:
        return "the windows do not tile the input"
    if unary != "none" or other:
        return f"an epilogue ({unary}{', add' if other else ''}): the kernel writes the sum and bias only"
    if kh * kw > MAX_TAPS or kh * kw < 2:
        return f"a {kh} x {kw} window (2 to {MAX_TAPS} taps)"
    if math.prod(x_shape) == 0 or o == 0:
        return "an empty tensor"
    return ""


def _lanes(o: int, width: int) -> int:
    """The widest vector of at most ``width`` lanes that divides ``o``."""
    lanes = width
    while o % lanes:
        lanes //= 2
    return lanes


def _block(m: int, nv: int) -> int:
    """Pixels a block: the most of 8, 4, 2, 1 that divides ``m`` within the accumulators."""
    return next(p for p in (8, 4, 2, 1) if m % p == 0 and (p * nv <= MAX_ACCUMULATORS or p == 1))


def patch_ir(name: str, dims: dict[str, int], channels_last: bool, lanes: int) -> str:
    """The LLVM IR of one patch convolution ``void NAME(ptr params, i64 lo, i64 hi, i64 tid)``
    over pixel blocks [lo, hi); params: x, the packed weight [C * kh * kw, O], the bias (O) and
    the channels-last y."""
    n, c, h, w, o, kh, kw = (dims[k] for k in ("n", "c", "h", "w", "o", "kh", "kw"))
    ho, wo = h // kh, w // kw
    L = lanes
    nv, vt = o // L, f"<{L} x float>"
    P = _block(n * ho * wo, nv)
    sn, sc, sh, sw = (h * w * c, 1, w * c, c) if channels_last else (c * h * w, h * w, w, 1)
    out: list[str] = []
    a = out.append
    a(f"declare {vt} @llvm.fmuladd.v{L}f32({vt}, {vt}, {vt})")
    a(f"define void @{name}(ptr noalias %pp, i64 %lo, i64 %hi, i64 %tid) nounwind {{")
    a("entry:")
    for i, p in enumerate(PARAMS):
        a(f"  %{p}.p = getelementptr inbounds i64, ptr %pp, i64 {i}")
        a(f"  %{p}.i = load i64, ptr %{p}.p, align 8")
        a(f"  %{p} = inttoptr i64 %{p}.i to ptr")
    for v in range(nv):
        a(f"  %bp{v} = getelementptr inbounds float, ptr %b, i64 {v * L}")
        a(f"  %bias{v} = load {vt}, ptr %bp{v}, align 4")
    a("  %empty = icmp sge i64 %lo, %hi")
    a("  br i1 %empty, label %exit, label %blk")
    a("blk:")
    a("  %bi = phi i64 [ %lo, %entry ], [ %bi.next, %blk.end ]")
    a(f"  %p0 = mul i64 %bi, {P}")
    for k in range(P):
        a(f"  %p{k}.i = add i64 %p0, {k}")
        a(f"  %n{k} = udiv i64 %p{k}.i, {ho * wo}")
        a(f"  %r{k} = urem i64 %p{k}.i, {ho * wo}")
        a(f"  %ho{k} = udiv i64 %r{k}, {wo}")
        a(f"  %wo{k} = urem i64 %r{k}, {wo}")
        a(f"  %on{k} = mul i64 %n{k}, {sn}")
        a(f"  %oh{k} = mul i64 %ho{k}, {kh * sh}")
        a(f"  %ow{k} = mul i64 %wo{k}, {kw * sw}")
        a(f"  %o1{k} = add i64 %on{k}, %oh{k}")
        a(f"  %org{k} = add i64 %o1{k}, %ow{k}")
        a(f"  %xo{k} = getelementptr inbounds float, ptr %x, i64 %org{k}")
    a("  br label %ch")
    a("ch:")
    a("  %ci = phi i64 [ 0, %blk ], [ %ci.next, %ch ]")
    for k in range(P):
        for v in range(nv):
            a(f"  %acc{k}_{v} = phi {vt} [ %bias{v}, %blk ], [ %acc{k}_{v}.t{kh * kw - 1}, %ch ]")
    a(f"  %xc = mul i64 %ci, {sc}")
    a(f"  %wc = mul i64 %ci, {kh * kw * o}")
    for k in range(P):
        a(f"  %xk{k} = getelementptr inbounds float, ptr %xo{k}, i64 %xc")
    for t in range(kh * kw):
        i, j = divmod(t, kw)
        for v in range(nv):
            a(f"  %wo.t{t}.{v} = add i64 %wc, {t * o + v * L}")
            a(f"  %wp.t{t}.{v} = getelementptr inbounds float, ptr %w, i64 %wo.t{t}.{v}")
            a(f"  %wv.t{t}.{v} = load {vt}, ptr %wp.t{t}.{v}, align 4")
        for k in range(P):
            a(f"  %xp{k}.t{t} = getelementptr inbounds float, ptr %xk{k}, i64 {i * sh + j * sw}")
            a(f"  %xs{k}.t{t} = load float, ptr %xp{k}.t{t}, align 4")
            a(f"  %x1{k}.t{t} = insertelement <1 x float> poison, float %xs{k}.t{t}, i64 0")
            a(f"  %xv{k}.t{t} = shufflevector <1 x float> %x1{k}.t{t}, <1 x float> poison, <{L} x i32> zeroinitializer")
            for v in range(nv):
                prev = f"%acc{k}_{v}" if t == 0 else f"%acc{k}_{v}.t{t - 1}"
                a(f"  %acc{k}_{v}.t{t} = call {vt} @llvm.fmuladd.v{L}f32({vt} %xv{k}.t{t}, {vt} %wv.t{t}.{v}, {vt} {prev})")
    a("  %ci.next = add i64 %ci, 1")
    a(f"  %ci.more = icmp ult i64 %ci.next, {c}")
    a("  br i1 %ci.more, label %ch, label %blk.end")
    a("blk.end:")
    for k in range(P):
        a(f"  %yo{k} = mul i64 %p{k}.i, {o}")
        for v in range(nv):
            a(f"  %yo{k}_{v} = add i64 %yo{k}, {v * L}")
            a(f"  %yp{k}_{v} = getelementptr inbounds float, ptr %y, i64 %yo{k}_{v}")
            a(f"  store {vt} %acc{k}_{v}.t{kh * kw - 1}, ptr %yp{k}_{v}, align 4")
    a("  %bi.next = add i64 %bi, 1")
    a("  %bi.more = icmp slt i64 %bi.next, %hi")
    a("  br i1 %bi.more, label %blk, label %exit")
    a("exit:")
    a("  ret void")
    a("}")
    return "\n".join(out) + "\n"


def _kernel(dims: dict[str, int], channels_last: bool, lanes: int) -> Any:
    from .jit import range_kernel

    def source() -> tuple[str, str]:
        d = dims
        name = (f"pt_patch_conv_n{d['n']}_c{d['c']}_h{d['h']}_w{d['w']}_o{d['o']}_k{d['kh']}x{d['kw']}"
                f"{'_cl' if channels_last else ''}_l{lanes}")
        return name, patch_ir(name, dims, channels_last, lanes)

    return range_kernel(("patch_conv", tuple(sorted(dims.items())), channels_last, lanes), source)


class PreparedPatchConv:
    """One node's patch convolution with ``conv.PreparedConv``'s interface: ``pack(w)`` the
    weight as [C * kh * kw, O]; ``__call__(x, packed, bias, other, out)`` takes x in NCHW or
    channels-last memory (others are made NCHW) and returns the channels-last result, in
    ``out`` where given. One call at a time (the parameter block is reused)."""

    def __init__(self, x_shape: tuple, w_shape: tuple) -> None:
        n, c, h, w = (int(d) for d in x_shape)
        o, _, kh, kw = (int(d) for d in w_shape)
        self.dims = {"n": n, "c": c, "h": h, "w": w, "o": o, "kh": kh, "kw": kw}
        self.lanes = _lanes(o, vector_width())
        self.shape = (n, o, h // kh, w // kw)
        self.blocks = n * (h // kh) * (w // kw) // _block(n * (h // kh) * (w // kw), o // self.lanes)
        self.fns = {cl: _kernel(self.dims, cl, self.lanes) for cl in (False, True)}
        self.params = (ctypes.c_int64 * len(PARAMS))()
        self.zero_bias = torch.zeros(o, dtype=torch.float32)

    def pack(self, w: Any) -> Any:
        """The weight as [C * kh * kw, O], taps in (c, i, j) order."""
        return w.detach().permute(1, 2, 3, 0).reshape(-1, w.shape[0]).contiguous()

    def __call__(self, x: Any, packed: Any, bias: Any = None, other: Any = None, out: Any = None) -> Any:
        """The convolution of ``x`` plus the bias, channels-last, on this call's threads."""
        del other
        cl = x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
        if not cl and not x.is_contiguous():
            x = x.contiguous()
        y = torch.empty(self.shape, dtype=torch.float32, memory_format=torch.channels_last) if out is None else out
        bias = self.zero_bias if bias is None else bias.contiguous()
        p = self.params
        p[0], p[1], p[2], p[3] = x.data_ptr(), packed.data_ptr(), bias.data_ptr(), y.data_ptr()
        fn = self.fns[cl]
        nt = min(torch.get_num_threads(), self.blocks)
        if nt > 1:
            split_on_team(fn, p, self.blocks, nt)
        else:
            fn(ctypes.addressof(p), 0, self.blocks, 0)
        return y
