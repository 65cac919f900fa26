"""A generated copy of an f32 NCHW tensor with few channels into channels-last (NHWC) memory.

A CNN's stem convolution gets the user's image as NCHW memory with 3 channels; its generated
kernel (conv.py) reads NHWC, and ATen's ``x.contiguous(memory_format=torch.channels_last)``
of a 4 x 3 x 32 x 32 image took 8 to 10 us (one thread), as long as the 3 x 3 stride-2
convolution itself. The generated copy loads one vector of ``lanes`` pixels of each channel,
interleaves the C vectors with one shuffle and stores the C x lanes floats at once; the last
pixels of an image (fewer than a vector) go one float at a time. One task per image. Every
dimension is a constant of the kernel, which goes to the disk cache.

``NhwcCopy(shape)(x)`` returns the copy in a buffer of its own (the same at every call: the
caller reads it before the next call).
"""

from __future__ import annotations

import ctypes
from typing import Any

from ..ops._lazy import torch
from .cpu import split_on_team
from .jit import range_kernel
from .lowering import vector_width

__all__ = ["MAX_CHANNELS", "NhwcCopy", "ToChannelsLast", "nhwc_ir", "takes"]

# The copy is generated for at most this many channels (its shuffle is C vectors wide).
MAX_CHANNELS = 4


def takes(x: Any) -> bool:
    """Whether ``x`` is an f32 NCHW-contiguous 4-d CPU tensor of at most ``MAX_CHANNELS``
    channels (and not channels-last already), one ``NhwcCopy`` converts."""
    return (x.dim() == 4 and x.dtype == torch.float32 and 1 < x.shape[1] <= MAX_CHANNELS and x.is_cpu
            and x.shape[2] * x.shape[3] > 1 and x.is_contiguous())


def _concat(vals: list[str], width: int, lines: list[str], tag: str) -> str:
    """The vectors ``vals`` (each ``width`` floats, a power of two of them) joined by a tree of
    shuffles into one of ``len(vals) * width``."""
    level = 0
    while len(vals) > 1:
        nxt = []
        for i in range(0, len(vals), 2):
            name = f"%{tag}.j{level}.{i}"
            mask = ", ".join(f"i32 {k}" for k in range(2 * width))
            lines.append(f"  {name} = shufflevector <{width} x float> {vals[i]}, <{width} x float> {vals[i + 1]}, "
                         f"<{2 * width} x i32> <{mask}>")
            nxt.append(name)
        vals, width, level = nxt, 2 * width, level + 1
    return vals[0]


def nhwc_ir(name: str, lanes: int, c: int, hw: int) -> str:
    """The LLVM IR of the copy of ``c`` channels of ``hw`` pixels an image, ``lanes`` pixels a
    vector; the parameter block holds the source and the destination."""
    L = lanes
    full = hw // L * L
    p2 = 1
    while p2 < c:
        p2 *= 2
    lines = [f"define void @{name}(ptr noalias %pp, i64 %lo, i64 %hi, i64 %tid) nounwind {{", "entry:",
             "  %src = load ptr, ptr %pp, align 8",
             "  %dst.a = getelementptr inbounds i64, ptr %pp, i64 1",
             "  %dst = load ptr, ptr %dst.a, align 8",
             "  %empty = icmp uge i64 %lo, %hi",
             "  br i1 %empty, label %exit, label %img",
             "img:",
             "  %i = phi i64 [%lo, %entry], [%i.n, %tail]",
             f"  %off = mul i64 %i, {c * hw}",
             "  %sb = getelementptr inbounds float, ptr %src, i64 %off",
             "  %db = getelementptr inbounds float, ptr %dst, i64 %off",
             f"  br label {'%blk' if full else '%tail'}"]
    if full:
        lines += ["blk:", "  %p = phi i64 [0, %img], [%p.n, %blk]"]
        vals = []
        for ch in range(c):
            lines += [f"  %so{ch} = add i64 %p, {ch * hw}",
                      f"  %sp{ch} = getelementptr inbounds float, ptr %sb, i64 %so{ch}",
                      f"  %v{ch} = load <{L} x float>, ptr %sp{ch}, align 4"]
            vals.append(f"%v{ch}")
        vals += ["poison"] * (p2 - c)
        joined = _concat(vals, L, lines, "c")
        mask = ", ".join(f"i32 {(j % c) * L + j // c}" for j in range(c * L))
        lines += [f"  %iv = shufflevector <{p2 * L} x float> {joined}, <{p2 * L} x float> poison, "
                  f"<{c * L} x i32> <{mask}>",
                  f"  %do = mul i64 %p, {c}",
                  "  %dp = getelementptr inbounds float, ptr %db, i64 %do",
                  f"  store <{c * L} x float> %iv, ptr %dp, align 4",
                  f"  %p.n = add i64 %p, {L}",
                  f"  %more = icmp ult i64 %p.n, {full}",
                  "  br i1 %more, label %blk, label %tail"]
    lines.append("tail:")
    for p in range(full, hw):
        for ch in range(c):
            t = f"{p}.{ch}"
            lines += [f"  %ts{t} = getelementptr inbounds float, ptr %sb, i64 {ch * hw + p}",
                      f"  %tv{t} = load float, ptr %ts{t}, align 4",
                      f"  %td{t} = getelementptr inbounds float, ptr %db, i64 {p * c + ch}",
                      f"  store float %tv{t}, ptr %td{t}, align 4"]
    lines += ["  %i.n = add i64 %i, 1", "  %done = icmp uge i64 %i.n, %hi",
              "  br i1 %done, label %exit, label %img", "exit:", "  ret void", "}"]
    return "\n".join(lines) + "\n"


def kernel(lanes: int, c: int, hw: int) -> Any:
    """The compiled copy (a ctypes function) for these constants, made once a process."""
    name = f"pt_nhwc_l{lanes}_c{c}_hw{hw}"
    return range_kernel(("nhwc", lanes, c, hw), lambda: (name, nhwc_ir(name, lanes, c, hw)))


class NhwcCopy:
    """The copy of NCHW tensors of ``shape`` into channels-last memory, into a buffer of its own
    (the same at every call). One call at a time."""

    def __init__(self, shape: tuple) -> None:
        n, c, h, w = shape
        self.n = n
        self.fn = kernel(vector_width(), c, h * w)
        self.out = torch.empty(tuple(shape), dtype=torch.float32, memory_format=torch.channels_last)
        self.params = (ctypes.c_int64 * 2)(0, self.out.data_ptr())
        self.addr = ctypes.addressof(self.params)

    def __call__(self, x: Any) -> Any:
        """``x`` (NCHW-contiguous, of the shape) copied into channels-last memory."""
        self.params[0] = x.data_ptr()
        nt = min(torch.get_num_threads(), self.n)
        if nt > 1:
            split_on_team(self.fn, self.params, self.n, nt)
        else:
            self.fn(self.addr, 0, self.n, 0)
        return self.out


class ToChannelsLast:
    """A prepared kernel's conversion of its input to channels-last memory: the generated copy
    (``NhwcCopy``, made at the first such call, into its own buffer) where ``takes`` says so,
    else ATen's ``contiguous``."""

    __slots__ = ("copy",)

    def __init__(self) -> None:
        self.copy: NhwcCopy | None = None

    def __call__(self, x: Any) -> Any:
        if not takes(x):
            return x.contiguous(memory_format=torch.channels_last)
        c = self.copy
        if c is None or c.out.shape != x.shape:
            c = self.copy = NhwcCopy(tuple(x.shape))
        return c(x)
