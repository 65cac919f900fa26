"""Generated kernels for the small steps around a CNN's convolutions: the max pool and the global
average pool (docs/codegen.md, "The small steps around the convolutions").

- ``max_pool2d`` of an f32 [N, C, H, W] value in channels-last memory (what a library
  convolution hands on): per output pixel and vector of channels, the maximum over the window's
  taps inside the input (padding never wins, so the taps outside are skipped; each output row's
  and column's first and last tap are tables of the kernel). NaN propagates as in ATen's kernel:
  a tap is taken when it is greater than the maximum so far or NaN. Any kernel, stride,
  padding, dilation and ceil_mode torch takes. An NCHW input is converted to channels-last
  first (the result is channels-last memory either way: the same values).
- ``mean`` over the H and W axes of an f32 [N, C, H, W] value, keepdim or not: per image the
  sum of each channel over the pixels (channels-last memory: a vector of channels a step;
  NCHW memory: each plane's row) divided by H * W. The ``reshape`` that usually follows a
  global pool (to [N, C]) is folded into the mean by ``cnn_blocks.global_pools_flattened``.

Each step measures itself against ATen's op at its first call (``choose.py``; the rules' pick,
the default a candidate must beat: the generated kernel on channels-last memory, ATen's op on
NCHW memory) and runs the faster from then on; measuring off, the default runs.
"""

from __future__ import annotations

import ctypes
import math
import weakref
from typing import Any, Callable

from ..ir.dtypes import f32
from ..ops._lazy import torch
from .aten_fallback import op_on_aten
from .lowering import vector_width
from .norm import f32_hex

__all__ = ["max_pool_ir", "global_mean_ir", "max_pool_kernel", "mean_kernel", "pool_windows", "PreparedMaxPool",
           "PreparedMean", "kernel_source"]

_NEG_INF = "0xFFF0000000000000"
_SIG = "(ptr noalias %pp, i64 %lo, i64 %hi, i64 %tid) nounwind"


def _lanes(c: int, width: int) -> int:
    """The widest vector of at most ``width`` lanes that divides ``c`` (1 for odd counts)."""
    lanes = width
    while c % lanes:
        lanes //= 2
    return lanes


def pool_windows(size: int, out: int, k: int, s: int, p: int, d: int) -> list[tuple[int, int]]:
    """Per output position along one axis, the first and the end (exclusive) of the window's
    taps that fall inside the input: taps ``t`` with ``0 <= o * s - p + t * d < size``."""
    spans = []
    for o in range(out):
        start = o * s - p
        taps = [t for t in range(k) if 0 <= start + t * d < size]
        if not taps:
            raise ValueError(f"partita.codegen.pool: output position {o} of {out} has no tap inside the input "
                             f"(size {size}, kernel {k}, stride {s}, padding {p}, dilation {d})")
        spans.append((taps[0], taps[-1] + 1))
    return spans


def _table(name: str, values: list[int]) -> str:
    return f"@{name} = private unnamed_addr constant [{len(values)} x i64] [" + \
        ", ".join(f"i64 {v}" for v in values) + "]"


def _params(a: Callable[[str], None], names: list[str]) -> None:
    for i, p in enumerate(names):
        a(f"  %{p}.p = getelementptr inbounds i64, ptr %pp, i64 {i}")
        a(f"  %{p}.i = load i64, ptr %{p}.p, align 8")
        a(f"  %{p} = inttoptr i64 %{p}.i to ptr")


def _max_taps(a: Callable[[str], None], L: int, dims: dict[str, int]) -> None:
    """The window loops of one output pixel and channel vector: ``%acc.next`` is the maximum."""
    vt = f"<{L} x float>"
    w, c, dh, dw = dims["w"], dims["c"], dims["dh"], dims["dw"]
    a("ty:")
    a("  %ky = phi i64 [ %khlo, %cv ], [ %ky.next, %ty.end ]")
    a(f"  %accy = phi {vt} [ %neg, %cv ], [ %acc.next, %ty.end ]")
    a(f"  %kyd = mul i64 %ky, {dh}")
    a("  %ih = add i64 %ih0, %kyd")
    a(f"  %iho = mul i64 %ih, {w * c}")
    a("  %rowo = add i64 %xn, %iho")
    a("  %rowj = add i64 %rowo, %j")
    a("  br label %tx")
    a("tx:")
    a("  %kx = phi i64 [ %kwlo, %ty ], [ %kx.next, %tx ]")
    a(f"  %acc = phi {vt} [ %accy, %ty ], [ %acc.next, %tx ]")
    a(f"  %kxd = mul i64 %kx, {dw}")
    a("  %iw = add i64 %iw0, %kxd")
    a(f"  %iwo = mul i64 %iw, {c}")
    a("  %off = add i64 %rowj, %iwo")
    a("  %xp = getelementptr inbounds float, ptr %x, i64 %off")
    a(f"  %v = load {vt}, ptr %xp, align 4")
    a(f"  %gt = fcmp ogt {vt} %v, %acc")
    a(f"  %nan = fcmp uno {vt} %v, %v")
    a(f"  %take = or <{L} x i1> %gt, %nan")
    a(f"  %acc.next = select <{L} x i1> %take, {vt} %v, {vt} %acc")
    a("  %kx.next = add i64 %kx, 1")
    a("  %kx.more = icmp slt i64 %kx.next, %kwhi")
    a("  br i1 %kx.more, label %tx, label %ty.end")
    a("ty.end:")
    a("  %ky.next = add i64 %ky, 1")
    a("  %ky.more = icmp slt i64 %ky.next, %khhi")
    a("  br i1 %ky.more, label %ty, label %cv.end")


def max_pool_ir(name: str, dims: dict[str, int], lanes: int | None = None) -> str:
    """The LLVM IR of one channels-last max pool (module doc):

        void NAME(ptr params, i64 lo, i64 hi, i64 tid)

    for output rows [lo, hi) of the N * Ho rows; ``params`` holds the i64 addresses of x and y.
    ``dims``: n, c, h, w, ho, wo, kh, kw, sh, sw, ph, pw, dh, dw."""
    d = dims
    L = _lanes(d["c"], lanes or vector_width())
    vt = f"<{L} x float>"
    hs = pool_windows(d["h"], d["ho"], d["kh"], d["sh"], d["ph"], d["dh"])
    ws = pool_windows(d["w"], d["wo"], d["kw"], d["sw"], d["pw"], d["dw"])
    out: list[str] = []
    a = out.append
    for tag, spans in (("h", hs), ("w", ws)):
        a(_table(f"{name}.k{tag}lo", [s[0] for s in spans]))
        a(_table(f"{name}.k{tag}hi", [s[1] for s in spans]))
    a(f"define void @{name}{_SIG} {{")
    a("entry:")
    _params(a, ["x", "y"])
    a(f"  %neg1 = insertelement <1 x float> poison, float {_NEG_INF}, i64 0")
    a(f"  %neg = shufflevector <1 x float> %neg1, <1 x float> poison, <{L} x i32> zeroinitializer")
    a("  %empty = icmp sge i64 %lo, %hi")
    a("  br i1 %empty, label %exit, label %row")
    a("row:")
    a("  %r = phi i64 [ %lo, %entry ], [ %r.next, %row.end ]")
    a(f"  %n = udiv i64 %r, {d['ho']}")
    a(f"  %oh = urem i64 %r, {d['ho']}")
    for t in ("khlo", "khhi"):
        a(f"  %{t}.p = getelementptr inbounds [{d['ho']} x i64], ptr @{name}.{t}, i64 0, i64 %oh")
        a(f"  %{t} = load i64, ptr %{t}.p, align 8")
    a(f"  %ohs = mul i64 %oh, {d['sh']}")
    a(f"  %ih0 = sub i64 %ohs, {d['ph']}")
    a(f"  %xn = mul i64 %n, {d['h'] * d['w'] * d['c']}")
    a(f"  %yrow = mul i64 %r, {d['wo'] * d['c']}")
    a("  br label %col")
    a("col:")
    a("  %ow = phi i64 [ 0, %row ], [ %ow.next, %col.end ]")
    for t in ("kwlo", "kwhi"):
        a(f"  %{t}.p = getelementptr inbounds [{d['wo']} x i64], ptr @{name}.{t}, i64 0, i64 %ow")
        a(f"  %{t} = load i64, ptr %{t}.p, align 8")
    a(f"  %ows = mul i64 %ow, {d['sw']}")
    a(f"  %iw0 = sub i64 %ows, {d['pw']}")
    a(f"  %owc = mul i64 %ow, {d['c']}")
    a("  %yo = add i64 %yrow, %owc")
    a("  br label %cv")
    a("cv:")
    a("  %j = phi i64 [ 0, %col ], [ %j.next, %cv.end ]")
    a("  br label %ty")
    _max_taps(a, L, d)
    a("cv.end:")
    a("  %yoj = add i64 %yo, %j")
    a("  %yp = getelementptr inbounds float, ptr %y, i64 %yoj")
    a(f"  store {vt} %acc.next, ptr %yp, align 4")
    a(f"  %j.next = add i64 %j, {L}")
    a(f"  %j.more = icmp ult i64 %j.next, {d['c']}")
    a("  br i1 %j.more, label %cv, label %col.end")
    a("col.end:")
    a("  %ow.next = add i64 %ow, 1")
    a(f"  %ow.more = icmp ult i64 %ow.next, {d['wo']}")
    a("  br i1 %ow.more, label %col, label %row.end")
    a("row.end:")
    a("  %r.next = add i64 %r, 1")
    a("  %r.more = icmp slt i64 %r.next, %hi")
    a("  br i1 %r.more, label %row, label %exit")
    a("exit:")
    a("  ret void")
    a("}")
    return "\n".join(out) + "\n"


def global_mean_ir(name: str, hw: int, c: int, channels_last: bool, lanes: int | None = None) -> str:
    """The LLVM IR of one global average pool over ``hw`` pixels of ``c`` channels (module doc):

        void NAME(ptr params, i64 lo, i64 hi, i64 tid)

    for images [lo, hi); ``params`` holds the i64 addresses of x and y ([N, C]). The input is
    [N, H, W, C] memory (``channels_last``) or [N, C, H, W]."""
    L = _lanes(c, lanes or vector_width()) if channels_last else 1
    vt = f"<{L} x float>"
    step, inner = (c, L) if channels_last else (1, hw)   # between pixels; between channels
    out: list[str] = []
    a = out.append
    a(f"define void @{name}{_SIG} {{")
    a("entry:")
    _params(a, ["x", "y"])
    a(f"  %cnt1 = insertelement <1 x float> poison, float {f32_hex(float(hw))}, i64 0")
    a(f"  %cnt = shufflevector <1 x float> %cnt1, <1 x float> poison, <{L} x i32> zeroinitializer")
    a("  %empty = icmp sge i64 %lo, %hi")
    a("  br i1 %empty, label %exit, label %img")
    a("img:")
    a("  %n = phi i64 [ %lo, %entry ], [ %n.next, %cv.end ]")
    a(f"  %xo = mul i64 %n, {hw * c}")
    a("  %xb = getelementptr inbounds float, ptr %x, i64 %xo")
    a(f"  %yo = mul i64 %n, {c}")
    a("  %yb = getelementptr inbounds float, ptr %y, i64 %yo")
    a("  br label %cv")
    a("cv:")
    a("  %j = phi i64 [ 0, %img ], [ %j.next, %cv.sum ]")
    a(f"  %jo = mul i64 %j, {inner if not channels_last else 1}")
    a("  br label %px")
    a("px:")
    a("  %p = phi i64 [ 0, %cv ], [ %p.next, %px ]")
    a(f"  %acc = phi {vt} [ zeroinitializer, %cv ], [ %acc.next, %px ]")
    a(f"  %po = mul i64 %p, {step}")
    a("  %off = add i64 %po, %jo")
    a("  %xp = getelementptr inbounds float, ptr %xb, i64 %off")
    a(f"  %v = load {vt}, ptr %xp, align 4")
    a(f"  %acc.next = fadd {'reassoc ' if not channels_last else ''}{vt} %acc, %v")
    a("  %p.next = add i64 %p, 1")
    a(f"  %p.more = icmp ult i64 %p.next, {hw}")
    a("  br i1 %p.more, label %px, label %cv.sum")
    a("cv.sum:")
    a(f"  %m = fdiv {vt} %acc.next, %cnt")
    a("  %yp = getelementptr inbounds float, ptr %yb, i64 %j")
    a(f"  store {vt} %m, ptr %yp, align 4")
    a(f"  %j.next = add i64 %j, {L}")
    a(f"  %j.more = icmp ult i64 %j.next, {c}")
    a("  br i1 %j.more, label %cv, label %cv.end")
    a("cv.end:")
    a("  %n.next = add i64 %n, 1")
    a("  %n.more = icmp slt i64 %n.next, %hi")
    a("  br i1 %n.more, label %img, label %exit")
    a("exit:")
    a("  ret void")
    a("}")
    return "\n".join(out) + "\n"


def kernel_source(kind: str, **dims: int) -> tuple[str, str]:
    """(name, LLVM IR) of a pool kernel: ``kind`` "max" (``max_pool_ir``'s dims) or "mean_cl" /
    "mean_nchw" (hw, c)."""
    lanes = vector_width()
    tag = "".join(f"_{k}{v}" for k, v in sorted(dims.items()))
    name = f"pt_{kind}pool_l{lanes}{tag}"
    if kind == "max":
        return name, max_pool_ir(name, dims, lanes)
    if kind in ("mean_cl", "mean_nchw"):
        return name, global_mean_ir(name, dims["hw"], dims["c"], kind == "mean_cl", lanes)
    raise ValueError(f"partita.codegen.pool: no kernel kind {kind!r} (max, mean_cl, mean_nchw)")


def _kernel(kind: str, **dims: int) -> Any:
    from .jit import range_kernel

    return range_kernel(("pool", kind, vector_width(), tuple(sorted(dims.items()))),
                        lambda: kernel_source(kind, **dims))


def _run(fn: Any, params: Any, n: int) -> None:
    """``fn`` over [0, n) on this call's threads (one where the work is small)."""
    nt = min(torch.get_num_threads(), n)
    if nt > 1 and n >= 64:
        from .cpu import split_on_team

        split_on_team(fn, params, n, nt)
    else:
        fn(params, 0, n, 0)


class PreparedMaxPool:
    """One node's max pool over x of ``shape`` [N, C, H, W]: ``__call__(x)`` returns the
    channels-last result (x in other memory is converted first)."""

    def __init__(self, shape: tuple, out: tuple, kernel: tuple, stride: tuple, padding: tuple,
                 dilation: tuple, keep: bool = False) -> None:
        n, c, h, w = (int(v) for v in shape)
        ho, wo = int(out[0]), int(out[1])
        dims = dict(n=n, c=c, h=h, w=w, ho=ho, wo=wo, kh=kernel[0], kw=kernel[1], sh=stride[0], sw=stride[1],
                    ph=padding[0], pw=padding[1], dh=dilation[0], dw=dilation[1])
        self.fn = _kernel("max", **{k: int(v) for k, v in dims.items()})
        self.shape = (n, c, ho, wo)
        self.rows = n * ho
        self.params = (ctypes.c_int64 * 2)()
        # one result buffer for every call where the result dies in the call (conv_pad.py)
        self.kept = torch.empty(self.shape, dtype=torch.float32, memory_format=torch.channels_last) if keep else None

    def write_into(self, out: Any) -> bool:
        """Keep ``out``'s bytes (the memory plan's) as the result buffer (arena.declare_into)."""
        from .arena import channels_last_over

        self.kept = channels_last_over(out)
        return True

    def __call__(self, x: Any) -> Any:
        cl = torch.channels_last
        if not x.is_contiguous(memory_format=cl):
            x = x.contiguous(memory_format=cl)
        y = self.kept if self.kept is not None else torch.empty(self.shape, dtype=torch.float32, memory_format=cl)
        p = self.params
        p[0], p[1] = x.data_ptr(), y.data_ptr()
        _run(self.fn, p, self.rows)
        return y


class PreparedMean:
    """One node's mean over H and W of x [N, C, H, W] in channels-last memory (``channels_last``)
    or NCHW memory: ``__call__(x)`` returns the [N, C] means shaped ``out`` (x in other memory
    is converted first)."""

    def __init__(self, shape: tuple, out: tuple, channels_last: bool) -> None:
        n, c, h, w = (int(v) for v in shape)
        self.fn = _kernel("mean_cl" if channels_last else "mean_nchw", hw=h * w, c=c)
        self.n = n
        self.out = tuple(int(v) for v in out)
        self.fmt = torch.channels_last if channels_last else torch.contiguous_format
        self.params = (ctypes.c_int64 * 2)()
        self.kept: Any = None   # the memory plan's buffer (arena.declare_into)

    def write_into(self, out: Any) -> bool:
        """Keep ``out`` (the memory plan's) as the result buffer (arena.declare_into)."""
        self.kept = out
        return True

    def __call__(self, x: Any) -> Any:
        if not x.is_contiguous(memory_format=self.fmt):
            x = x.contiguous(memory_format=self.fmt)
        y = self.kept if self.kept is not None else torch.empty(self.out, dtype=torch.float32)
        p = self.params
        p[0], p[1] = x.data_ptr(), y.data_ptr()
        _run(self.fn, p, self.n)
        return y


class PreparedMeanNHWC(PreparedMean):
    """A mean over the H and W axes (1, 2) of x [N, H, W, C] in row-major memory (the value
    assign-layout made channels-last for a squeeze-excitation's pool): the channels-last kernel
    over the same memory; ``__call__(x)`` returns the [N, C] means shaped ``out``."""

    def __init__(self, shape: tuple, out: tuple) -> None:
        n, h, w, c = (int(v) for v in shape)
        super().__init__((n, c, h, w), out, True)
        self.fmt = torch.contiguous_format


def _static_f32(node: Any) -> bool:
    """A node of one f32 4-d operand and one f32 result, every size known and nonzero."""
    if len(node.operands) != 1 or len(node.results) != 1:
        return False
    x, r = node.operands[0].type, node.results[0].type
    return (x.rank == 4 and x.dtype is f32 and r.dtype is f32 and x.numel > 0
            and all(isinstance(d, int) for d in (*x.shape, *r.shape)))


def _chosen_step(node: Any, key: str, make: Callable[[bool], Callable[[Any], Any]], aten: Callable) -> Callable:
    """A step running ``node`` by the generated kernel (``make(channels_last)``) or by ATen's op
    ``aten``, measured at the first call per input layout (``choose.py``): the generated kernel
    is the default on channels-last memory, ATen's on NCHW memory."""
    from . import choose
    from ..backend.common import describe_node

    picked: dict[bool, Callable[[Any], Any]] = {}
    ref = weakref.ref(node)
    where = describe_node(node)

    def step(args: list, attrs: dict) -> Any:
        x = args[0]
        if not x.is_cpu or x.dtype is not torch.float32:
            return aten(args, attrs)
        cl = x.is_contiguous(memory_format=torch.channels_last)
        run = picked.get(cl)
        if run is None:
            gen = make(cl)
            cands = {"generated": lambda: gen(x), "aten": lambda: aten(args, attrs)}
            name = choose.choose(f"{key} layout={'nhwc' if cl else 'nchw'}", cands, where=where,
                                 default="generated" if cl else "aten", node=ref())
            run = picked[cl] = gen if name == "generated" else (lambda t: aten([t], attrs))
        return run(x)
    return step


def max_pool_kernel(node: Any, inplace: bool = False) -> Callable | None:
    """The step running a ``max_pool2d`` node by the generated kernel or ATen's pool, whichever
    measured faster; None (the op's own ATen step) where no kernel is made here."""
    del inplace
    if node.op != "max_pool2d" or not _static_f32(node):
        return None
    a = node.attrs
    k = tuple(a["kernel"])
    s = k if a["stride"] is None else tuple(a["stride"])
    shape, out = tuple(node.operands[0].type.shape), tuple(node.results[0].type.shape)
    try:
        from .conv_pad import result_dies_in_call   # a fresh result each call faulted its pages in

        prepared = PreparedMaxPool(shape, out[2:], k, s, tuple(a["padding"]), tuple(a["dilation"]),
                                   keep=result_dies_in_call(node))
    except Exception as e:  # no code generator here, or CodegenError: ATen runs it
        import warnings

        warnings.warn(f"partita: the generated max pool did not compile ({e}); ATen runs it", RuntimeWarning,
                      stacklevel=2)
        return None
    key = (f"max_pool2d x={'x'.join(map(str, shape))} k={k} s={s} p={tuple(a['padding'])} "
           f"d={tuple(a['dilation'])} ceil={bool(a['ceil_mode'])}")
    from .arena import declare_into

    return declare_into(_chosen_step(node, key, lambda cl: prepared, op_on_aten("max_pool2d")), prepared.write_into)


def global_mean_axes(node: Any) -> bool:
    """Whether ``node`` is a mean over exactly the H and W axes of a 4-d value."""
    axes = node.attrs.get("axes")
    return node.op == "mean" and axes is not None and sorted(int(v) % 4 for v in axes) == [2, 3]


def mean_kernel(node: Any, inplace: bool = False) -> Callable | None:
    """The step running a global average pool (``mean`` over H and W) by the generated kernel
    or ATen's mean, whichever measured faster; None (ATen's mean) for other means."""
    del inplace
    if _static_f32(node) and nhwc_mean_axes(node):
        return _nhwc_mean_step(node)
    if not _static_f32(node) or not global_mean_axes(node):
        return None
    shape, out = tuple(node.operands[0].type.shape), tuple(node.results[0].type.shape)
    if math.prod(out) != shape[0] * shape[1]:
        return None
    try:
        made = {cl: PreparedMean(shape, out, cl) for cl in (True, False)}
    except Exception as e:  # no code generator here, or CodegenError: ATen runs it
        import warnings

        warnings.warn(f"partita: the generated global mean did not compile ({e}); ATen runs it", RuntimeWarning,
                      stacklevel=2)
        return None
    key = f"mean x={'x'.join(map(str, shape))} out={'x'.join(map(str, out))}"
    from .arena import declare_into

    return declare_into(_chosen_step(node, key, made.__getitem__, op_on_aten("mean")),
                        lambda out: all([m.write_into(out) for m in made.values()]))


def nhwc_mean_axes(node: Any) -> bool:
    """Whether ``node`` is a mean over exactly axes 1 and 2 of a 4-d value ([N, H, W, C])."""
    axes = node.attrs.get("axes")
    return node.op == "mean" and axes is not None and sorted(int(v) % 4 for v in axes) == [1, 2]


def _nhwc_mean_step(node: Any) -> Callable | None:
    """The step of a mean over H and W of [N, H, W, C]: the generated kernel on row-major memory
    (the default), measured against ATen's mean at the first call; ATen's for other memory."""
    from . import choose
    from ..backend.common import describe_node

    shape, out = tuple(node.operands[0].type.shape), tuple(node.results[0].type.shape)
    if math.prod(out) != shape[0] * shape[3]:
        return None
    try:
        gen = PreparedMeanNHWC(shape, out)
    except Exception as e:  # no code generator here, or CodegenError: ATen runs it
        import warnings

        warnings.warn(f"partita: the generated global mean did not compile ({e}); ATen runs it", RuntimeWarning,
                      stacklevel=2)
        return None
    aten = op_on_aten("mean")
    key = f"mean nhwc x={'x'.join(map(str, shape))} out={'x'.join(map(str, out))}"
    ref = weakref.ref(node)
    where = describe_node(node)
    picked: list[Callable[[Any], Any]] = []

    def step(args: list, attrs: dict) -> Any:
        x = args[0]
        if not x.is_cpu or x.dtype is not torch.float32 or not x.is_contiguous():
            return aten(args, attrs)
        if not picked:
            name = choose.choose(key, {"generated": lambda: gen(x), "aten": lambda: aten(args, attrs)}, where=where,
                                 default="generated", node=ref())
            picked.append(gen if name == "generated" else (lambda t: aten([t], attrs)))
        return picked[0](x)
    from .arena import declare_into

    return declare_into(step, gen.write_into)
