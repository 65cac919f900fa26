"""The pre-activation GroupNorm before a convolution, on channels-last memory.

A pre-activation residual block (BiT, ResNetV2) runs GroupNorm -> ReLU -> convolution. The
convolutions hand their results on in channels-last memory; group_norm.py's kernel takes
contiguous NCHW, so each norm copied its input to NCHW and each convolution after it copied the
norm's NCHW result back to channels-last (with the conversion, the convolution also left its
bound fast path): two copies and about 6 to 20 us of a 4 x 16 x 8 x 8 block, one thread.

``preact_group_norm_kernel`` (the executor's step for ``group_norm``) wraps group_norm.py's step:
a channels-last input of a 4-d f32 norm whose channels are a multiple of 8 (at most
``MAX_CHANNELS``) runs ``group_norm_nhwc_ir``'s kernel, which writes a channels-last result; any
other input runs group_norm.py's step as before. The two are measured against each other at the
first channels-last call (codegen/choose.py, default the NHWC kernel).

The kernel, per sample (one task each): the channels of one pixel are one vector of C floats.
Pass 1 sums the pixels per channel, then the channels of each group (its mean); pass 2 sums the
squared deviations about the group's mean per channel, then per group (var, 1 / sqrt(var +
eps)); pass 3 writes ``((x - mean) * rstd) * w + b`` and the ReLU, the reference's order.
"""

from __future__ import annotations

import ctypes
import math
import struct
from typing import Any, Callable

from ..ir.dtypes import f32
from ..ir.graph import Node
from ..ops._lazy import torch

__all__ = ["MAX_CHANNELS", "NhwcGroupNorm", "group_norm_nhwc_ir", "nhwc_for", "preact_group_norm_kernel",
           "takes_channels_last"]

# The channels of one pixel are one LLVM vector: at most this many (16 AVX-512 registers).
MAX_CHANNELS = 256
# Samples are split across threads from this many elements on.
PARALLEL_MIN_ELEMENTS = 1 << 17


def _hex(x: float) -> str:
    """An f32 constant as LLVM writes it (the double of the same value, in hex)."""
    f = struct.unpack("<f", struct.pack("<f", x))[0]
    return "0x%016X" % struct.unpack("<Q", struct.pack("<d", f))[0]


def _pixel_loop(lines: list[str], tag: str, hw: int, c: int, body: Callable[[str], list[str]],
                acc: bool) -> str:
    """A loop over the ``hw`` pixels of the sample (``%xs``): ``body(v)`` gets the pixel's vector
    ``v`` and returns lines ending in ``%{tag}.new`` (the accumulator's next value, with ``acc``);
    returns the accumulator after the loop (or "")."""
    vt = f"<{c} x float>"
    lines += [f"  br label %{tag}", f"{tag}:",
              f"  %{tag}.p = phi i64 [0, %{tag}.pre], [%{tag}.pn, %{tag}]"]
    if acc:
        lines.append(f"  %{tag}.acc = phi {vt} [zeroinitializer, %{tag}.pre], [%{tag}.new, %{tag}]")
    lines += [f"  %{tag}.off = mul i64 %{tag}.p, {c}",
              f"  %{tag}.xp = getelementptr inbounds float, ptr %xs, i64 %{tag}.off",
              f"  %{tag}.x = load {vt}, ptr %{tag}.xp, align 4"]
    lines += body(f"%{tag}.x")
    lines += [f"  %{tag}.pn = add i64 %{tag}.p, 1",
              f"  %{tag}.more = icmp ult i64 %{tag}.pn, {hw}",
              f"  br i1 %{tag}.more, label %{tag}, label %{tag}.post",
              f"{tag}.post:"]
    return f"%{tag}.new" if acc else ""


def _group_means(lines: list[str], tag: str, acc: str, c: int, groups: int, scale: float) -> str:
    """Per group the sum of its channels of ``acc`` times ``scale``, spread back over the group's
    channels: the name of the <c x float> result."""
    cg = c // groups
    for g in range(groups):
        mask = ", ".join(f"i32 {g * cg + j}" for j in range(cg))
        lines += [f"  %{tag}.s{g} = shufflevector <{c} x float> {acc}, <{c} x float> poison, <{cg} x i32> <{mask}>",
                  f"  %{tag}.r{g} = call reassoc float @llvm.vector.reduce.fadd.v{cg}f32(float 0.0, "
                  f"<{cg} x float> %{tag}.s{g})",
                  f"  %{tag}.m{g} = fmul float %{tag}.r{g}, {_hex(scale)}"]
        prev = "poison" if g == 0 else f"%{tag}.g{g - 1}"
        lines.append(f"  %{tag}.g{g} = insertelement <{groups} x float> {prev}, float %{tag}.m{g}, i64 {g}")
    spread = ", ".join(f"i32 {ch // cg}" for ch in range(c))
    lines.append(f"  %{tag}.v = shufflevector <{groups} x float> %{tag}.g{groups - 1}, <{groups} x float> poison, "
                 f"<{c} x i32> <{spread}>")
    return f"%{tag}.v"


def group_norm_nhwc_ir(name: str, c: int, hw: int, groups: int, eps: float, affine: bool, relu: bool) -> str:
    """The LLVM IR of a GroupNorm over channels-last f32 memory: ``void NAME(ptr params, i64 lo,
    i64 hi, i64 tid)`` for the samples [lo, hi); ``params`` holds the addresses of x, weight,
    bias and y (weight and bias read only where ``affine``)."""
    cg, vt = c // groups, f"<{c} x float>"
    lines = [f"declare float @llvm.vector.reduce.fadd.v{cg}f32(float, <{cg} x float>)",
             f"declare {vt} @llvm.sqrt.v{c}f32({vt})",
             f"define void @{name}(ptr noalias %pp, i64 %lo, i64 %hi, i64 %tid) nounwind {{", "entry:"]
    for i, p in enumerate(("x", "w", "b", "y")):
        lines += [f"  %{p}.a = getelementptr inbounds i64, ptr %pp, i64 {i}", f"  %{p} = load ptr, ptr %{p}.a, align 8"]
    if affine:
        lines += [f"  %wv = load {vt}, ptr %w, align 4", f"  %bv = load {vt}, ptr %b, align 4"]
    lines += ["  %empty = icmp sge i64 %lo, %hi", "  br i1 %empty, label %exit, label %smp", "smp:",
              "  %n = phi i64 [%lo, %entry], [%n.next, %p3.post]",
              f"  %base = mul i64 %n, {c * hw}",
              "  %xs = getelementptr inbounds float, ptr %x, i64 %base",
              "  %ys = getelementptr inbounds float, ptr %y, i64 %base",
              "  br label %p1.pre", "p1.pre:"]
    s1 = _pixel_loop(lines, "p1", hw, c, lambda v: [f"  %p1.new = fadd {vt} %p1.acc, {v}"], acc=True)
    mean = _group_means(lines, "mu", s1, c, groups, 1.0 / (cg * hw))
    lines += ["  br label %p2.pre", "p2.pre:"]
    s2 = _pixel_loop(lines, "p2", hw, c, lambda v: [f"  %p2.d = fsub {vt} {v}, {mean}",
                                                    f"  %p2.sq = fmul {vt} %p2.d, %p2.d",
                                                    f"  %p2.new = fadd {vt} %p2.acc, %p2.sq"], acc=True)
    var = _group_means(lines, "va", s2, c, groups, 1.0 / (cg * hw))
    eps_v = ", ".join([f"float {_hex(eps)}"] * c)
    lines += [f"  %ve = fadd {vt} {var}, <{eps_v}>",
              f"  %sd = call {vt} @llvm.sqrt.v{c}f32({vt} %ve)",
              f"  %rstd = fdiv {vt} <{', '.join(['float 1.0'] * c)}>, %sd",
              "  br label %p3.pre", "p3.pre:"]

    def store(v: str) -> list[str]:
        out = [f"  %p3.d = fsub {vt} {v}, {mean}", f"  %p3.n = fmul {vt} %p3.d, %rstd"]
        y = "%p3.n"
        if affine:
            out += [f"  %p3.w = fmul {vt} %p3.n, %wv", f"  %p3.b = fadd {vt} %p3.w, %bv"]
            y = "%p3.b"
        if relu:   # maximum(y, 0) as the reference: NaN stays NaN
            out += [f"  %p3.neg = fcmp olt {vt} {y}, zeroinitializer",
                    f"  %p3.r = select <{c} x i1> %p3.neg, {vt} zeroinitializer, {vt} {y}"]
            y = "%p3.r"
        out += ["  %p3.yp = getelementptr inbounds float, ptr %ys, i64 %p3.off", f"  store {vt} {y}, ptr %p3.yp, align 4"]
        return out

    _pixel_loop(lines, "p3", hw, c, store, acc=False)
    lines += ["  %n.next = add i64 %n, 1", "  %more = icmp slt i64 %n.next, %hi",
              "  br i1 %more, label %smp, label %exit", "exit:", "  ret void", "}"]
    return "\n".join(lines) + "\n"


def takes_channels_last(x: Any) -> bool:
    """Whether ``x`` is a 4-d f32 CPU tensor in channels-last memory (and not NCHW-contiguous
    as well, as a 1 x 1 map is), the memory the NHWC kernel reads."""
    return (x.dim() == 4 and x.dtype == torch.float32 and x.is_cpu
            and x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous())


class NhwcGroupNorm:
    """One group_norm node's NHWC kernel: ``__call__(x, w, b)`` takes x in channels-last memory
    and returns y in channels-last memory (a new tensor each call)."""

    def __init__(self, shape: tuple, groups: int, eps: float, affine: bool, relu: bool) -> None:
        from .jit import range_kernel

        n, c, h, w = shape
        self.shape, self.affine, self.n = tuple(shape), affine, n
        name = f"pt_group_norm_nhwc_c{c}_hw{h * w}_g{groups}{'_a' if affine else ''}{'_relu' if relu else ''}"
        self.fn = range_kernel(("group_norm_nhwc", c, h * w, groups, _hex(eps), affine, relu),
                               lambda: (name, group_norm_nhwc_ir(name, c, h * w, groups, eps, affine, relu)))
        self.params = (ctypes.c_int64 * 4)()
        self.addr = ctypes.addressof(self.params)
        self.parallel = n > 1 and math.prod(shape) >= PARALLEL_MIN_ELEMENTS
        self.kept: Any = None   # the memory plan's buffer (arena.declare_into)

    def write_into(self, out: Any) -> bool:
        """Keep ``out``'s bytes (the memory plan's) as the result buffer (arena.declare_into)."""
        from .arena import channels_last_over

        self.kept = channels_last_over(out)
        return True

    def __call__(self, x: Any, w: Any = None, b: Any = None) -> Any:
        y = self.kept
        if y is None:
            y = torch.empty(self.shape, dtype=torch.float32, memory_format=torch.channels_last)
        p = self.params
        p[0], p[3] = x.data_ptr(), y.data_ptr()
        if self.affine:
            w = w if w.dim() == 1 and w.is_contiguous() else w.reshape(-1).contiguous()
            b = b if b.dim() == 1 and b.is_contiguous() else b.reshape(-1).contiguous()
            p[1], p[2] = w.data_ptr(), b.data_ptr()
        nt = min(torch.get_num_threads(), self.n) if self.parallel else 1
        if nt <= 1:
            self.fn(self.addr, 0, self.n, 0)
        else:
            from .cpu import split_on_team

            split_on_team(self.fn, p, self.n, nt)
        return y


def nhwc_for(node: Node) -> NhwcGroupNorm | None:
    """The NHWC kernel for a ``group_norm`` node, or None where it takes no such node: not a 4-d
    f32 static shape, channels not a multiple of 8 or over ``MAX_CHANNELS``, a weight without a
    bias, an activation other than ReLU, or no code generated here."""
    x = node.operands[0].type
    if x.dtype is not f32 or x.rank != 4 or any(not isinstance(d, int) for d in x.shape) or x.numel == 0:
        return None
    c, groups = int(x.shape[1]), int(node.attrs["groups"])
    if c % 8 or c > MAX_CHANNELS or groups < 1 or c % groups:
        return None
    if node.attrs["unary"] not in ("none", "relu") or len(node.operands) == 2:
        return None
    try:
        return NhwcGroupNorm(tuple(int(d) for d in x.shape), groups, float(node.attrs["eps"]),
                             len(node.operands) == 3, node.attrs["unary"] == "relu")
    except Exception as e:  # no code generator here, or it failed: group_norm.py's step runs it
        import warnings

        warnings.warn(f"partita: the channels-last group_norm did not compile ({e}); the NCHW step runs it",
                      RuntimeWarning, stacklevel=2)
        return None


def preact_group_norm_kernel(node: Node, inplace: bool = False) -> Callable | None:
    """The executor's step for a ``group_norm`` node: on a channels-last input the NHWC kernel
    (``nhwc_for``) or group_norm.py's step, whichever measured faster at the first such call
    (the NHWC kernel where measuring is off); on any other input group_norm.py's step."""
    from .group_norm import group_norm_kernel

    inner = group_norm_kernel(node, inplace)
    if inner is None:
        return None
    gen = nhwc_for(node)
    if gen is None:
        return inner
    picked: list[str] = []

    def step(args: list, attrs: dict) -> Any:
        if not takes_channels_last(args[0]):
            return inner(args, attrs)
        if not picked:
            from .choose import choose

            key = (f"group_norm x {tuple(args[0].shape)} channels_last groups {node.attrs['groups']} "
                   f"{node.attrs['unary']} affine {len(args) > 1}")
            picked.append(choose(key, {"nhwc": lambda: gen(*args), "nchw": lambda: inner(args, attrs)},
                                 where=f"group_norm at {node.loc}", default="nhwc", node=node))
        return gen(*args) if picked[0] == "nhwc" else inner(args, attrs)
    from .arena import declare_into

    return declare_into(step, gen.write_into)
