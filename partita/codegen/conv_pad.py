"""A constant pad of H and W of a channels-last tensor as one generated copy.

BiT's stem is convolution -> ``pad`` (zeros, one pixel each side) -> max pool. The convolution
hands on channels-last memory, and the ``pad`` op's torch form (``F.pad``) took 70 to 90 us of
the 4 x 16 x 16 x 16 map in the program (one thread, the machine shared), against ONNX Runtime's
Pad at about a third of that: ATen's constant pad is a general strided fill and copy.

``pad_kernel`` (the executor's step for ``pad``) runs ``pad_nhwc_ir``'s kernel for an f32 4-d
input in channels-last memory padded on H and W only: per output row (a task), the rows of the
top and bottom border filled, the others as the left border, one copy of the input row (its W x
C floats are adjacent in NHWC) and the right border. The result is channels-last. Any other
input runs the op's own torch form. The kernel is measured against that at the first
channels-last call (codegen/choose.py, default the kernel).

Most of the 70 us was not the copy but a fresh 82 KiB result each call: the allocator gave the
pages back and each call faulted them in again (the kernel into a new tensor 65 to 75 us in the
program, into one kept 7 us). Where the result cannot outlive the call (not a program output,
read only by ops that make new tensors: ``NO_ALIAS_READERS``) the step writes into one buffer of
its own, the same at every call.
"""

from __future__ import annotations

import ctypes
import struct
from typing import Any, Callable

from ..ir.dtypes import f32
from ..ir.graph import Node
from ..ops._lazy import torch

__all__ = ["NO_ALIAS_READERS", "PreparedPad", "pad_kernel", "pad_nhwc_ir", "pads_hw", "result_dies_in_call"]

# Ops whose step reads its operand and returns a new tensor (never a view of it): a value read
# only by these, and not returned, is dead once the call ends, so its buffer can serve the next.
NO_ALIAS_READERS = frozenset({"max_pool2d", "avg_pool2d", "conv2d_pointwise", "fused", "group_norm"})


def _hex(x: float) -> str:
    """An f32 constant as LLVM writes it (the double of the same value, in hex)."""
    f = struct.unpack("<f", struct.pack("<f", x))[0]
    return "0x%016X" % struct.unpack("<Q", struct.pack("<d", f))[0]


def pads_hw(node: Node) -> tuple[int, int, int, int] | None:
    """(top, bottom, left, right) of a ``pad`` node of a static 4-d f32 value padded on H and W
    only (none of them negative), else None."""
    x = node.operands[0].type
    pads = [int(p) for p in node.attrs["pads"]]
    if x.dtype is not f32 or x.rank != 4 or any(not isinstance(d, int) for d in x.shape) or x.numel == 0:
        return None
    if len(pads) != 8 or any(pads[:4]) or min(pads) < 0:
        return None
    return pads[4], pads[5], pads[6], pads[7]


def result_dies_in_call(node: Node) -> bool:
    """Whether ``node``'s one result is not a program output and every reader makes a new
    tensor of it (``NO_ALIAS_READERS``): then nothing holds its memory after the call."""
    r = node.results[0]
    return len(node.results) == 1 and bool(r.users) and not r.is_output and \
        all(u.op in NO_ALIAS_READERS for u in r.users)


def _fill(lines: list[str], tag: str, ptr: str, count: int, value: float) -> None:
    """Lines storing ``value`` into ``count`` floats from ``ptr`` (nothing where count is 0)."""
    if count <= 0:
        return
    if struct.pack("<f", value) == b"\0\0\0\0":
        lines.append(f"  call void @llvm.memset.p0.i64(ptr align 4 {ptr}, i8 0, i64 {4 * count}, i1 false)")
        return
    lines += [f"  br label %{tag}", f"{tag}:", f"  %{tag}.i = phi i64 [0, %{tag}.pre], [%{tag}.n, %{tag}]",
              f"  %{tag}.p = getelementptr inbounds float, ptr {ptr}, i64 %{tag}.i",
              f"  store float {_hex(value)}, ptr %{tag}.p, align 4",
              f"  %{tag}.n = add i64 %{tag}.i, 1", f"  %{tag}.c = icmp ult i64 %{tag}.n, {count}",
              f"  br i1 %{tag}.c, label %{tag}, label %{tag}.post", f"{tag}.post:"]


def pad_nhwc_ir(name: str, h: int, w: int, c: int, pads: tuple[int, int, int, int], value: float) -> str:
    """The LLVM IR of the pad of [N, H, W, C] f32 memory by ``pads`` (top, bottom, left, right)
    with ``value``: ``void NAME(ptr params, i64 lo, i64 hi, i64 tid)`` for the output rows [lo,
    hi) (N x padded H of them); ``params`` holds the addresses of x and y."""
    pt, pb, pl, pr = pads
    hp, wp = h + pt + pb, w + pl + pr
    lines = ["declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)",
             "declare void @llvm.memcpy.p0.p0.i64(ptr, ptr, i64, i1)",
             f"define void @{name}(ptr noalias %pp, i64 %lo, i64 %hi, i64 %tid) nounwind {{", "entry:",
             "  %x = load ptr, ptr %pp, align 8", "  %y.a = getelementptr inbounds i64, ptr %pp, i64 1",
             "  %y = load ptr, ptr %y.a, align 8",
             "  %empty = icmp sge i64 %lo, %hi", "  br i1 %empty, label %exit, label %row", "row:",
             "  %r = phi i64 [%lo, %entry], [%r.n, %rowend]",
             f"  %n = udiv i64 %r, {hp}", f"  %oh = urem i64 %r, {hp}", f"  %ih = sub i64 %oh, {pt}",
             f"  %inside = icmp ult i64 %ih, {h}",   # unsigned: a row of the top border wraps above H
             f"  %yo = mul i64 %r, {wp * c}", "  %yr = getelementptr inbounds float, ptr %y, i64 %yo",
             "  br i1 %inside, label %mid, label %full.pre", "full.pre:"]
    _fill(lines, "full", "%yr", wp * c, value)
    lines += ["  br label %rowend", "mid:", "  br label %left.pre", "left.pre:"]
    _fill(lines, "left", "%yr", pl * c, value)
    lines += [f"  %xo.n = mul i64 %n, {h}", "  %xo.r = add i64 %xo.n, %ih", f"  %xo = mul i64 %xo.r, {w * c}",
              "  %xr = getelementptr inbounds float, ptr %x, i64 %xo",
              f"  %ym = getelementptr inbounds float, ptr %yr, i64 {pl * c}",
              f"  call void @llvm.memcpy.p0.p0.i64(ptr align 4 %ym, ptr align 4 %xr, i64 {4 * w * c}, i1 false)",
              f"  %yright = getelementptr inbounds float, ptr %yr, i64 {(pl + w) * c}",
              "  br label %right.pre", "right.pre:"]
    _fill(lines, "right", "%yright", pr * c, value)
    lines += ["  br label %rowend", "rowend:", "  %r.n = add i64 %r, 1", "  %more = icmp slt i64 %r.n, %hi",
              "  br i1 %more, label %row, label %exit", "exit:", "  ret void", "}"]
    return "\n".join(lines) + "\n"


class PreparedPad:
    """One pad node's kernel: ``__call__(x)`` takes x [N, C, H, W] in channels-last memory and
    returns the padded value in channels-last memory (a new tensor each call)."""

    def __init__(self, shape: tuple, pads: tuple[int, int, int, int], value: float, keep: bool = False) -> None:
        from .jit import range_kernel

        n, c, h, w = (int(d) for d in shape)
        pt, pb, pl, pr = pads
        self.out = (n, c, h + pt + pb, w + pl + pr)
        self.rows = n * self.out[2]
        key = f"c{c}_h{h}_w{w}_p{pt}_{pb}_{pl}_{pr}_v{_hex(value)[2:]}"
        name = f"pt_pad_nhwc_{key}"
        self.fn = range_kernel(("pad_nhwc", c, h, w, pads, _hex(value)),
                               lambda: (name, pad_nhwc_ir(name, h, w, c, pads, value)))
        self.params = (ctypes.c_int64 * 2)()
        self.addr = ctypes.addressof(self.params)
        # ``keep``: one result buffer for every call (only where the result dies in the call)
        self.kept = torch.empty(self.out, dtype=torch.float32, memory_format=torch.channels_last) if keep else None

    def write_into(self, out: Any) -> bool:
        """Keep ``out``'s bytes (the memory plan's) as the result buffer (arena.declare_into)."""
        from .arena import channels_last_over

        self.kept = channels_last_over(out)
        return True

    def __call__(self, x: Any) -> Any:
        y = self.kept
        if y is None:
            y = torch.empty(self.out, dtype=torch.float32, memory_format=torch.channels_last)
        p = self.params
        p[0], p[1] = x.data_ptr(), y.data_ptr()
        self.fn(self.addr, 0, self.rows, 0)
        return y


def _channels_last(x: Any) -> bool:
    """Whether x is an f32 CPU tensor in channels-last memory (and not NCHW-contiguous too)."""
    return (x.dtype == torch.float32 and x.is_cpu and x.is_contiguous(memory_format=torch.channels_last)
            and not x.is_contiguous())


def pad_kernel(node: Node, inplace: bool = False) -> Callable | None:
    """The executor's step for a ``pad`` node that ``pads_hw`` takes: on a channels-last input
    the generated copy or the op's torch form, whichever measured faster at the first such call
    (the copy where measuring is off); the torch form on any other input. None (the op's own
    step) for any other pad."""
    del inplace
    pads = pads_hw(node)
    if pads is None:
        return None
    from .aten_fallback import op_on_aten

    aten = op_on_aten("pad")
    value = float(node.attrs["value"])
    try:
        gen = PreparedPad(tuple(node.operands[0].type.shape), pads, value, keep=result_dies_in_call(node))
    except Exception as e:  # no code generator here, or it failed: the torch form runs it
        import warnings

        warnings.warn(f"partita: the generated pad did not compile ({e}); ATen runs it", RuntimeWarning, stacklevel=2)
        return None
    picked: list[str] = []

    def step(args: list, attrs: dict) -> Any:
        x = args[0]
        if not _channels_last(x):
            return aten(args, attrs)
        if not picked:
            from .choose import choose

            key = f"pad x {tuple(x.shape)} channels_last pads {pads} value {value}"
            picked.append(choose(key, {"generated": lambda: gen(x), "aten": lambda: aten(args, attrs)},
                                 where=f"pad at {node.loc}", default="generated", node=node))
        return gen(x) if picked[0] == "generated" else aten(args, attrs)
    from .arena import declare_into

    return declare_into(step, gen.write_into)
