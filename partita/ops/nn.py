"""Neural-network ops: softmax, normalizations, embedding, convolution, pooling, dropout and
cross entropy, with PyTorch (``torch.nn.functional``) semantics.

The NumPy references compute f16/bf16 inputs in f32 and let the interpreter round once, as
PyTorch's CPU kernels do; f32 and f64 are computed in their own precision. Image ops take
NCHW tensors of rank 4 only (PyTorch also accepts unbatched CHW; here a batch dimension of
size 1 is added with ``reshape`` instead, so the type rules stay simple and explicit).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from ..ir.diagnostics import ExecutionError, TypeRuleError
from ..ir.dtypes import i64
from ..ir.types import TensorType
from ._lazy import F, torch
from .registry import AttrSpec, Cost, OpDef, normalize_axes, normalize_axis, register

_LOW_PRECISION = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


def _compute_np(a: np.ndarray) -> np.ndarray:
    """f16/bf16 arrays are computed in f32 (the interpreter rounds the result once)."""
    return a.astype(np.float32) if a.dtype in _LOW_PRECISION else a


def _shape(s) -> str:
    return "[" + ",".join(map(str, s)) + "]"


def _require_float(op: str, t: TensorType, what: str = "input") -> None:
    if not t.dtype.is_float:
        raise TypeRuleError(f"{op}: the {what} must have a floating-point dtype, got {t}; cast it to f32 first")


def _require_same_dtype(op: str, x: TensorType, other: TensorType, what: str) -> None:
    if other.dtype != x.dtype:
        raise TypeRuleError(f"{op}: {what} has dtype {other.dtype} but the input has {x.dtype}; "
                            f"cast {what} to {x.dtype}")


def _io_cost(flops_per_elem: int):
    """A cost of ``flops_per_elem`` per element of the first operand, data read and written once."""
    def cost(ins: list[TensorType], outs: list[TensorType], attrs: dict) -> Cost:
        return Cost(flops_per_elem * ins[0].numel, sum(t.nbytes for t in ins), sum(t.nbytes for t in outs))
    return cost


# --- softmax and log_softmax ----------------------------------------------------------------

def _softmax_infer(name: str):
    def infer(ts, attrs):
        (x,) = ts
        _require_float(name, x)
        # A scalar behaves as a rank-1 tensor of one element, as in PyTorch (axis 0 or -1).
        normalize_axis(attrs["axis"], max(x.rank, 1), name)
        return x
    return infer


def _np_shifted(x: np.ndarray, axis: int) -> np.ndarray:
    # initial=-inf keeps the max defined along an empty axis; a row that is all -inf gives NaN
    # (inf - inf), which is what PyTorch gives too.
    m = np.max(x, axis=axis, keepdims=True, initial=-np.inf)
    return x - m


def _np_softmax(args, attrs):
    x = _compute_np(args[0])
    if x.ndim == 0:
        return np.exp(x - x)  # 1, or NaN for a NaN/inf input as in PyTorch
    z = np.exp(_np_shifted(x, attrs["axis"]))
    return z / np.sum(z, axis=attrs["axis"], keepdims=True)


def _np_log_softmax(args, attrs):
    x = _compute_np(args[0])
    if x.ndim == 0:
        return x - x
    axis = attrs["axis"]
    s = _np_shifted(x, axis)
    return s - np.log(np.sum(np.exp(s), axis=axis, keepdims=True))


register(OpDef(
    name="softmax", operands=("x",), attrs=(AttrSpec("axis", "int", -1),),
    infer=_softmax_infer("softmax"), reference=_np_softmax,
    torch=lambda args, a: F.softmax(args[0], dim=a["axis"]),
    cost=_io_cost(5),
    doc="exp(x) / sum(exp(x)) along axis (default -1), computed stably (the max is subtracted "
        "first); floating-point inputs only. Cost: 5 FLOPs per element (max, sub, exp, sum, div).",
))

register(OpDef(
    name="log_softmax", operands=("x",), attrs=(AttrSpec("axis", "int", -1),),
    infer=_softmax_infer("log_softmax"), reference=_np_log_softmax,
    torch=lambda args, a: F.log_softmax(args[0], dim=a["axis"]),
    cost=_io_cost(5),
    doc="x - log(sum(exp(x))) along axis (default -1), computed stably; floating-point inputs "
        "only. Cost: 5 FLOPs per element.",
))


# --- layer_norm and rms_norm -----------------------------------------------------------------

def _trailing_axes(name: str, x: TensorType, axes) -> tuple[int, ...]:
    """The normalized axes, which must be the last k axes of ``x`` (k >= 1)."""
    if len(axes) == 0:
        raise TypeRuleError(f"{name}: attribute 'axes' must name at least one axis (e.g. [-1])")
    norm = normalize_axes(axes, x.rank, name)
    want = tuple(range(x.rank - len(norm), x.rank))
    if norm != want:
        raise TypeRuleError(
            f"{name}: axes {list(axes)} must be the trailing axes of the {x.rank}-d input {x} "
            f"(PyTorch normalizes over a trailing normalized_shape); expected e.g. {list(want)}; "
            f"move the axes last with transpose first")
    return norm


def _check_affine(name: str, x: TensorType, norm: tuple[int, ...], params: list[TensorType],
                  labels: tuple[str, ...]) -> None:
    nshape = tuple(x.shape[a] for a in norm)
    for t, what in zip(params, labels):
        if t.shape != nshape:
            raise TypeRuleError(f"{name}: {what} has shape {_shape(t.shape)} but must have the normalized "
                                f"shape {_shape(nshape)} (the input {x} over axes {list(norm)})")
        _require_same_dtype(name, x, t, what)


def _layer_norm_infer(ts, attrs):
    x = ts[0]
    _require_float("layer_norm", x)
    norm = _trailing_axes("layer_norm", x, attrs["axes"])
    _check_affine("layer_norm", x, norm, ts[1:], ("weight", "bias"))
    return x


def _np_layer_norm(args, attrs):
    x = _compute_np(args[0])
    axes = tuple(range(x.ndim - len(attrs["axes"]), x.ndim))
    mean = np.mean(x, axis=axes, keepdims=True)
    d = x - mean
    var = np.mean(d * d, axis=axes, keepdims=True)
    y = d / np.sqrt(var + np.asarray(attrs["eps"], x.dtype))
    if len(args) > 1:
        y = y * _compute_np(args[1])
    if len(args) > 2:
        y = y + _compute_np(args[2])
    return y


def _torch_layer_norm(args, attrs):
    x = args[0]
    k = len(attrs["axes"])
    w = args[1] if len(args) > 1 else None
    b = args[2] if len(args) > 2 else None
    return F.layer_norm(x, tuple(x.shape[x.dim() - k:]), w, b, attrs["eps"])


register(OpDef(
    name="layer_norm", operands=("x", "weight?", "bias?"),
    attrs=(AttrSpec("axes", "ints", (-1,)), AttrSpec("eps", "float", 1e-5)),
    infer=_layer_norm_infer, reference=_np_layer_norm, torch=_torch_layer_norm,
    cost=_io_cost(8),
    doc="(x - mean) / sqrt(var + eps) * weight + bias over the trailing axes (default [-1]); var "
        "is biased (divides by the count). weight and bias are optional trailing operands (bias "
        "needs weight) with the normalized shape and the input's dtype (mixed precision needs an "
        "explicit cast). Cost: 8 FLOPs per element.",
))


def _rms_norm_infer(ts, attrs):
    x = ts[0]
    _require_float("rms_norm", x)
    norm = _trailing_axes("rms_norm", x, attrs["axes"])
    _check_affine("rms_norm", x, norm, ts[1:], ("weight",))
    return x


def _np_rms_norm(args, attrs):
    x = _compute_np(args[0])
    axes = tuple(range(x.ndim - len(attrs["axes"]), x.ndim))
    eps = attrs["eps"]
    if eps is None:
        eps = np.finfo(x.dtype).eps  # x is already in the computation dtype (f32 or f64)
    y = x / np.sqrt(np.mean(x * x, axis=axes, keepdims=True) + np.asarray(eps, x.dtype))
    if len(args) > 1:
        y = y * _compute_np(args[1])
    return y


def _torch_rms_norm(args, attrs):
    x = args[0]
    k = len(attrs["axes"])
    w = args[1] if len(args) > 1 else None
    return F.rms_norm(x, tuple(x.shape[x.dim() - k:]), w, attrs["eps"])


register(OpDef(
    name="rms_norm", operands=("x", "weight?"),
    attrs=(AttrSpec("axes", "ints", (-1,)), AttrSpec("eps", "float", None)),
    infer=_rms_norm_infer, reference=_np_rms_norm, torch=_torch_rms_norm,
    cost=_io_cost(4),
    doc="x / sqrt(mean(x * x) + eps) * weight over the trailing axes (default [-1]). eps absent "
        "(the default) means PyTorch's default: the machine epsilon of the computation dtype, "
        "which is f32's for f16/bf16/f32 inputs and f64's for f64. weight is an optional "
        "operand with the normalized shape and the input's dtype. Cost: 4 FLOPs per element.",
))


# --- embedding ---------------------------------------------------------------------------------

def _embedding_infer(ts, attrs):
    table, idx = ts
    if table.rank != 2:
        raise TypeRuleError(f"embedding: the table must be 2-d [num_embeddings, dim], got {table}")
    if idx.dtype.name not in ("i32", "i64"):
        raise TypeRuleError(f"embedding: indices must be i32 or i64, got {idx}; cast them to i64")
    if table.dtype.is_bool:
        raise TypeRuleError(f"embedding: the table must be numeric, got {table}")
    return TensorType(idx.shape + (table.shape[1],), table.dtype)


def _np_embedding(args, attrs):
    table, idx = args
    if idx.size and (idx.min() < 0 or idx.max() >= table.shape[0]):
        bad = idx[(idx < 0) | (idx >= table.shape[0])].reshape(-1)[0]
        raise ExecutionError(f"embedding: index {bad} is out of range for a table of "
                             f"{table.shape[0]} rows (valid: 0..{table.shape[0] - 1})")
    return table[idx]


def _embedding_cost(ins, outs, attrs):
    # Only the gathered rows of the table are read, not the whole table.
    return Cost(0, ins[1].nbytes + outs[0].nbytes, outs[0].nbytes)


register(OpDef(
    name="embedding", operands=("table", "indices"),
    infer=_embedding_infer, reference=_np_embedding,
    torch=lambda args, a: F.embedding(args[1], args[0]),
    cost=_embedding_cost,
    doc="table[indices]: rows of a [V, D] table gathered by i32/i64 indices of any shape, giving "
        "indices.shape + [D]. An index outside 0..V-1 (negative ones included) is an error at run "
        "time. No padding_idx/max_norm (they only matter for training or mutate the table).",
))


# --- shared geometry of conv2d and the pools ----------------------------------------------------

def _pair(op: str, attrs: dict, name: str, lo: int) -> tuple[int, int]:
    v = attrs[name]
    if len(v) != 2:
        raise TypeRuleError(f"{op}: attribute '{name}' must be 2 integers [height, width], got {list(v)}")
    if min(v) < lo:
        raise TypeRuleError(f"{op}: attribute '{name}' must be >= {lo} in each dimension, got {list(v)}")
    return v[0], v[1]


def _require_nchw(op: str, x: TensorType) -> None:
    if x.rank != 4:
        raise TypeRuleError(f"{op}: the input must be 4-d [N, C, H, W], got {x}"
                            + ("; add a batch dimension of 1 with reshape" if x.rank == 3 else ""))


def _out_size(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """PyTorch's pooling/convolution output length along one dimension."""
    span = size + 2 * p - d * (k - 1) - 1
    if ceil_mode:
        out = -(-span // s) + 1
        # The last window must start inside the input or its left padding.
        if (out - 1) * s >= size + p:
            out -= 1
        return out
    return span // s + 1


def _window_index(out: int, k: int, s: int, d: int) -> np.ndarray:
    """[out, k] positions, in padded coordinates, of each window's taps."""
    return (np.arange(out) * s)[:, None] + (np.arange(k) * d)[None, :]


def _windows(xp: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Gather [N, C, Ho, kH, Wo, kW] patches of a padded [N, C, Hp, Wp] array (im2col)."""
    return xp[:, :, rows[:, :, None, None], cols[None, None, :, :]]


def _pad_hw(x: np.ndarray, top: int, bottom: int, left: int, right: int, value) -> np.ndarray:
    return np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)), constant_values=value)


# --- conv2d ------------------------------------------------------------------------------------------

def _conv2d_geometry(attrs):
    op = "conv2d"
    return (_pair(op, attrs, "stride", 1), _pair(op, attrs, "padding", 0), _pair(op, attrs, "dilation", 1))


def _conv2d_infer(ts, attrs):
    x, w = ts[0], ts[1]
    _require_nchw("conv2d", x)
    _require_float("conv2d", x)
    if w.rank != 4:
        raise TypeRuleError(f"conv2d: the weight must be 4-d [out_channels, in_channels/groups, kH, kW], got {w}")
    _require_same_dtype("conv2d", x, w, "the weight")
    (sh, sw), (ph, pw), (dh, dw) = _conv2d_geometry(attrs)
    g = attrs["groups"]
    if g < 1:
        raise TypeRuleError(f"conv2d: attribute 'groups' must be >= 1, got {g}")
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    if c % g:
        raise TypeRuleError(f"conv2d: the input's {c} channels are not divisible by groups={g}")
    if o % g:
        raise TypeRuleError(f"conv2d: the weight's {o} output channels are not divisible by groups={g}")
    if cg * g != c:
        raise TypeRuleError(
            f"conv2d: channel mismatch: the input {x} has {c} channels, so with groups={g} the weight "
            f"must have {c // g} input channels per group (dim 1), but the weight {w} has {cg}")
    if len(ts) > 2:
        b = ts[2]
        if b.shape != (o,):
            raise TypeRuleError(f"conv2d: the bias must have shape [{o}] (one per output channel), got {b}")
        _require_same_dtype("conv2d", x, b, "the bias")
    ho = _out_size(h, kh, sh, ph, dh, False)
    wo = _out_size(wd, kw, sw, pw, dw, False)
    if ho < 1 or wo < 1:
        raise TypeRuleError(
            f"conv2d: the kernel {kh}x{kw} (dilation {[dh, dw]}) is larger than the padded input "
            f"{h + 2 * ph}x{wd + 2 * pw}; the output would be {ho}x{wo}")
    return TensorType((n, o, ho, wo), x.dtype)


def _np_conv2d(args, attrs):
    x, w = _compute_np(args[0]), _compute_np(args[1])
    (sh, sw), (ph, pw), (dh, dw) = _conv2d_geometry(attrs)
    g = attrs["groups"]
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    ho, wo = _out_size(h, kh, sh, ph, dh, False), _out_size(wd, kw, sw, pw, dw, False)
    patches = _windows(_pad_hw(x, ph, ph, pw, pw, 0), _window_index(ho, kh, sh, dh), _window_index(wo, kw, sw, dw))
    patches = patches.reshape(n, g, cg, ho, kh, wo, kw)
    wg = w.reshape(g, o // g, cg, kh, kw)
    y = np.einsum("ngchiwj,gocij->ngohw", patches, wg, optimize=True).reshape(n, o, ho, wo)
    if len(args) > 2:
        y = y + _compute_np(args[2]).reshape(1, o, 1, 1)
    return y


def _torch_conv2d(args, attrs):
    b = args[2] if len(args) > 2 else None
    return F.conv2d(args[0], args[1], b, stride=attrs["stride"], padding=attrs["padding"],
                    dilation=attrs["dilation"], groups=attrs["groups"])


def _conv2d_cost(ins, outs, attrs):
    n, o, ho, wo = outs[0].shape
    _, cg, kh, kw = ins[1].shape
    return Cost(2 * n * o * ho * wo * cg * kh * kw, sum(t.nbytes for t in ins), outs[0].nbytes)


register(OpDef(
    name="conv2d", operands=("x", "weight", "bias?"),
    attrs=(AttrSpec("stride", "ints", (1, 1)), AttrSpec("padding", "ints", (0, 0)),
           AttrSpec("dilation", "ints", (1, 1)), AttrSpec("groups", "int", 1)),
    infer=_conv2d_infer, reference=_np_conv2d, torch=_torch_conv2d, cost=_conv2d_cost,
    doc="2-d cross-correlation of x [N, C, H, W] with weight [O, C/groups, kH, kW] plus an optional "
        "bias [O]; stride, padding (zeros, both sides) and dilation are [height, width] pairs. "
        "Output [N, O, Ho, Wo] with Ho = (H + 2*pH - dH*(kH-1) - 1) // sH + 1. Cost: "
        "2*N*O*Ho*Wo*(C/groups)*kH*kW FLOPs (the bias add is not counted).",
))


# --- max_pool2d and avg_pool2d ------------------------------------------------------------------

def _pool_geometry(op: str, shape: tuple[int, ...], attrs: dict, dilated: bool):
    """(kernel, stride, padding, dilation, output size) of a pool over an NCHW ``shape``,
    checked as PyTorch checks them."""
    k = _pair(op, attrs, "kernel", 1)
    s = k if attrs["stride"] is None else _pair(op, attrs, "stride", 1)
    p = _pair(op, attrs, "padding", 0)
    d = _pair(op, attrs, "dilation", 1) if dilated else (1, 1)
    for i, dim in enumerate(("height", "width")):
        # PyTorch's limit, as its CPU kernels check it: at most half the kernel, dilation
        # not counted (one internal path allows half the dilated window; we take the stricter).
        half = k[i] // 2
        if p[i] > half:
            raise TypeRuleError(f"{op}: padding {list(p)} is more than half the window in {dim} "
                                f"(kernel {list(k)}); at most {half} is allowed")
    h, w = shape[2], shape[3]
    ho = _out_size(h, k[0], s[0], p[0], d[0], attrs["ceil_mode"])
    wo = _out_size(w, k[1], s[1], p[1], d[1], attrs["ceil_mode"])
    if ho < 1 or wo < 1:
        raise TypeRuleError(f"{op}: the window {list(k)} does not fit in the padded input "
                            f"{h + 2 * p[0]}x{w + 2 * p[1]} of the input {_shape(shape)}; the output would be {ho}x{wo}")
    return k, s, p, d, (ho, wo)


def _max_pool2d_infer(ts, attrs):
    (x,) = ts
    _require_nchw("max_pool2d", x)
    if x.dtype.is_bool:
        raise TypeRuleError(f"max_pool2d: the input must be numeric, got {x}")
    *_, (ho, wo) = _pool_geometry("max_pool2d", x.shape, attrs, dilated=True)
    return TensorType(x.shape[:2] + (ho, wo), x.dtype)


def _ceil_overhang(size: int, out: int, k: int, s: int, p: int, d: int) -> int:
    """Extra right padding a ceil_mode window may reach past the input and its padding."""
    return max(0, (out - 1) * s + d * (k - 1) + 1 - (size + 2 * p))


def _np_max_pool2d(args, attrs):
    x = _compute_np(args[0])
    k, s, p, d, (ho, wo) = _pool_geometry("max_pool2d", x.shape, attrs, dilated=True)
    h, w = x.shape[2], x.shape[3]
    # Padding never wins a max: -inf for floats, the smallest value for integers.
    fill = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    xp = _pad_hw(x, p[0], p[0] + _ceil_overhang(h, ho, k[0], s[0], p[0], d[0]),
                 p[1], p[1] + _ceil_overhang(w, wo, k[1], s[1], p[1], d[1]), fill)
    win = _windows(xp, _window_index(ho, k[0], s[0], d[0]), _window_index(wo, k[1], s[1], d[1]))
    return np.max(win, axis=(3, 5))


def _torch_max_pool2d(args, attrs):
    k = attrs["kernel"]
    return F.max_pool2d(args[0], k, attrs["stride"] or k, attrs["padding"], attrs["dilation"],
                        ceil_mode=attrs["ceil_mode"])


def _pool_cost(ins, outs, attrs):
    return Cost(outs[0].numel * math.prod(attrs["kernel"]), ins[0].nbytes, outs[0].nbytes)


register(OpDef(
    name="max_pool2d", operands=("x",),
    attrs=(AttrSpec("kernel", "ints"), AttrSpec("stride", "ints", None), AttrSpec("padding", "ints", (0, 0)),
           AttrSpec("dilation", "ints", (1, 1)), AttrSpec("ceil_mode", "bool", False)),
    infer=_max_pool2d_infer, reference=_np_max_pool2d, torch=_torch_max_pool2d, cost=_pool_cost,
    doc="max over kernel windows of x [N, C, H, W]; stride defaults to the kernel; padding (which "
        "never wins the max) is at most half the kernel (dilation not counted); ceil_mode rounds the output size "
        "up, keeping only windows that start inside the input or its left padding. NaN "
        "propagates. Cost: one FLOP per window tap.",
))


def _avg_pool2d_infer(ts, attrs):
    (x,) = ts
    _require_nchw("avg_pool2d", x)
    _require_float("avg_pool2d", x)
    *_, (ho, wo) = _pool_geometry("avg_pool2d", x.shape, attrs, dilated=False)
    return TensorType(x.shape[:2] + (ho, wo), x.dtype)


def _avg_divisor(size: int, out: int, k: int, s: int, p: int, include_pad: bool) -> np.ndarray:
    """Per-output-position divisor along one dimension, as PyTorch's kernel computes it: the
    window clipped to input+padding (include_pad) or to the input alone."""
    start = np.arange(out) * s - p
    end = np.minimum(start + k, size + p)
    if include_pad:
        return end - start
    return np.maximum(np.minimum(end, size) - np.maximum(start, 0), 1)


def _np_avg_pool2d(args, attrs):
    x = _compute_np(args[0])
    k, s, p, _, (ho, wo) = _pool_geometry("avg_pool2d", x.shape, attrs, dilated=False)
    h, w = x.shape[2], x.shape[3]
    xp = _pad_hw(x, p[0], p[0] + _ceil_overhang(h, ho, k[0], s[0], p[0], 1),
                 p[1], p[1] + _ceil_overhang(w, wo, k[1], s[1], p[1], 1), 0)
    win = _windows(xp, _window_index(ho, k[0], s[0], 1), _window_index(wo, k[1], s[1], 1))
    inc = attrs["count_include_pad"]
    div = np.outer(_avg_divisor(h, ho, k[0], s[0], p[0], inc), _avg_divisor(w, wo, k[1], s[1], p[1], inc))
    return np.sum(win, axis=(3, 5)) / div.astype(x.dtype)


def _torch_avg_pool2d(args, attrs):
    k = attrs["kernel"]
    return F.avg_pool2d(args[0], k, attrs["stride"] or k, attrs["padding"], ceil_mode=attrs["ceil_mode"],
                        count_include_pad=attrs["count_include_pad"])


register(OpDef(
    name="avg_pool2d", operands=("x",),
    attrs=(AttrSpec("kernel", "ints"), AttrSpec("stride", "ints", None), AttrSpec("padding", "ints", (0, 0)),
           AttrSpec("ceil_mode", "bool", False), AttrSpec("count_include_pad", "bool", True)),
    infer=_avg_pool2d_infer, reference=_np_avg_pool2d, torch=_torch_avg_pool2d, cost=_pool_cost,
    doc="mean over kernel windows of x [N, C, H, W]; stride defaults to the kernel; zero padding "
        "at most half the kernel. The divisor is the window clipped to the padded input when "
        "count_include_pad (the part a ceil_mode window hangs past the padding is never "
        "counted), else to the input alone; PyTorch's divisor_override is not offered. Cost: one "
        "FLOP per window tap.",
))


# --- batch_norm ----------------------------------------------------------------------------

def _bn_count(shape: tuple[int, ...]) -> int:
    """Values per channel that batch statistics average over."""
    return math.prod(shape) // shape[1] if shape[1] else 0


def _batch_norm_infer(ts, attrs):
    x = ts[0]
    if x.rank < 2:
        raise TypeRuleError(f"batch_norm: the input must be at least 2-d [N, C, ...], got {x}")
    _require_float("batch_norm", x)
    c = x.shape[1]
    for t, what in zip(ts[1:], ("weight", "bias", "running_mean", "running_var")):
        if t.shape != (c,):
            raise TypeRuleError(f"batch_norm: {what} must have shape [{c}] (one per channel of {x}), got {t}")
        _require_same_dtype("batch_norm", x, t, what)
    if attrs["training"]:
        if _bn_count(x.shape) == 1:
            raise TypeRuleError(f"batch_norm: training needs more than 1 value per channel to compute "
                                f"batch statistics, but the input {x} has 1")
        stat = TensorType((c,), x.dtype)
        return [x, stat, stat]
    return x


def _np_batch_norm(args, attrs):
    x, w, b, rm, rv = (_compute_np(a) for a in args)
    eps, m = attrs["eps"], attrs["momentum"]
    bshape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    if not attrs["training"]:
        return (x - rm.reshape(bshape)) / np.sqrt(rv.reshape(bshape) + np.asarray(eps, x.dtype)) \
            * w.reshape(bshape) + b.reshape(bshape)
    axes = (0,) + tuple(range(2, x.ndim))
    count = _bn_count(x.shape)
    if count == 0:
        # PyTorch returns the empty result and leaves the running statistics untouched.
        return x, rm, rv
    mean = np.mean(x, axis=axes, keepdims=True)
    d = x - mean
    var = np.mean(d * d, axis=axes, keepdims=True)
    y = d / np.sqrt(var + np.asarray(eps, x.dtype)) * w.reshape(bshape) + b.reshape(bshape)
    unbiased = var.reshape(-1) * (count / (count - 1))
    return y, (1 - m) * rm + m * mean.reshape(-1), (1 - m) * rv + m * unbiased


def _torch_batch_norm(args, attrs):
    x, w, b, rm, rv = args
    if not attrs["training"]:
        return F.batch_norm(x, rm, rv, w, b, False, attrs["momentum"], attrs["eps"])
    # PyTorch updates the running statistics in place; SSA wants new versions instead.
    rm, rv = rm.clone(), rv.clone()
    y = F.batch_norm(x, rm, rv, w, b, True, attrs["momentum"], attrs["eps"])
    return y, rm, rv


register(OpDef(
    name="batch_norm", operands=("x", "weight", "bias", "running_mean", "running_var"),
    attrs=(AttrSpec("eps", "float", 1e-5), AttrSpec("momentum", "float", 0.1),
           AttrSpec("training", "bool", False)),
    infer=_batch_norm_infer, reference=_np_batch_norm, torch=_torch_batch_norm, cost=_io_cost(8),
    doc="per-channel normalization of x [N, C, ...] (channels on axis 1). training=false (the "
        "default): (x - running_mean) / sqrt(running_var + eps) * weight + bias, one result. "
        "training=true: normalizes with the batch mean and biased variance and has three "
        "results: y and the new versions of running_mean and running_var, "
        "(1 - momentum) * old + momentum * batch value (the variance unbiased), as PyTorch "
        "updates them in place; it needs more than one value per channel. Cost: 8 FLOPs per "
        "element.",
))


# --- dropout ---------------------------------------------------------------------------------

_M32 = 0xFFFFFFFF


def _mix32(h):
    """A 32-bit integer mixing function on int64 values in [0, 2**32): the same arithmetic on
    NumPy arrays, torch tensors and Python ints, which is what makes the masks identical."""
    h = h ^ (h >> 16)
    h = (h * 0x45D9F3B) & _M32
    h = h ^ (h >> 16)
    h = (h * 0x45D9F3B) & _M32
    return h ^ (h >> 16)


def _dropout_keys(seed: int) -> tuple[int, int]:
    # Both halves of a 64-bit seed matter; offsets are reduced mod 2**32 in Python so that the
    # int64 tensor arithmetic below can never overflow.
    return (seed & _M32) * 0x61C88647 & _M32, _mix32(((seed >> 32) & _M32) ^ 0x9E3779B9)


def _dropout_threshold(p: float) -> int:
    """Keep an element when its hash h satisfies h / 2**32 >= p, i.e. h >= ceil(p * 2**32)."""
    return min(math.ceil(p * 2 ** 32), 2 ** 32)


def _dropout_hash(idx, k0: int, k1: int):
    """Hash of the flat element index (int64 array or tensor), identical in NumPy and torch."""
    h = _mix32((idx + k0) & _M32)
    return _mix32(h ^ ((idx >> 32) & _M32) ^ k1)


def _dropout_infer(ts, attrs):
    (x,) = ts
    _require_float("dropout", x)
    p = attrs["p"]
    if not 0.0 <= p <= 1.0:
        raise TypeRuleError(f"dropout: probability p must be between 0 and 1, got {p}")
    return x


def _np_dropout(args, attrs):
    x = args[0]
    if not attrs["train"]:
        return x
    x = _compute_np(x)
    p = attrs["p"]
    k0, k1 = _dropout_keys(attrs["seed"])
    keep = _dropout_hash(np.arange(x.size, dtype=np.int64).reshape(x.shape), k0, k1) >= _dropout_threshold(p)
    scale = np.asarray(1.0 / (1.0 - p) if p < 1.0 else 0.0, x.dtype)
    return np.where(keep, x * scale, np.zeros((), x.dtype))


def _torch_dropout(args, attrs):
    x = args[0]
    if not attrs["train"]:
        return x
    p = attrs["p"]
    k0, k1 = _dropout_keys(attrs["seed"])
    idx = torch.arange(x.numel(), dtype=torch.int64, device=x.device).reshape(x.shape)
    keep = _dropout_hash(idx, k0, k1) >= _dropout_threshold(p)
    scale = 1.0 / (1.0 - p) if p < 1.0 else 0.0
    return torch.where(keep, x * scale, torch.zeros((), dtype=x.dtype, device=x.device))


register(OpDef(
    name="dropout", operands=("x",),
    attrs=(AttrSpec("p", "float", 0.5), AttrSpec("train", "bool", False), AttrSpec("seed", "int", 0)),
    infer=_dropout_infer, reference=_np_dropout, torch=_torch_dropout,
    effects=lambda attrs: frozenset({"rng"}) if attrs["train"] else frozenset(),
    cost=_io_cost(1),
    doc="train=false (the default: inference) is the identity and pure. train=true: zero each element with "
        "probability p and scale the others by 1/(1-p); p=1 gives zeros (NaN included). The mask "
        "is a counter-based hash of the flat element index and the seed, computed with the same "
        "int64 arithmetic by both executors, so one seed gives one mask everywhere (it is not "
        "torch's generator stream). A train dropout has the 'rng' effect.",
))


# --- cross_entropy ------------------------------------------------------------------------------

def _ce_infer(ts, attrs):
    logits, target = ts
    if logits.rank < 1:
        raise TypeRuleError(f"cross_entropy: logits must be [N, C] or [N, C, d1, ...] (or [C]), got {logits}")
    _require_float("cross_entropy", logits, "logits")
    if target.dtype != i64:
        raise TypeRuleError(f"cross_entropy: the target must hold class indices as i64, got {target}; "
                            f"cast it to i64 (probability targets are not supported)")
    cdim = 1 if logits.rank >= 2 else 0
    want = logits.shape[:cdim] + logits.shape[cdim + 1:]
    if target.shape != want:
        raise TypeRuleError(f"cross_entropy: the target {target} must have shape {_shape(want)} (the logits "
                            f"{logits} without the class dimension {cdim})")
    ls = attrs["label_smoothing"]
    if not 0.0 <= ls <= 1.0:
        raise TypeRuleError(f"cross_entropy: label_smoothing must be between 0 and 1, got {ls}")
    shape = want if attrs["reduction"] == "none" else ()
    return TensorType(shape, logits.dtype)


def _np_cross_entropy(args, attrs):
    logits, target = _compute_np(args[0]), args[1]
    cdim = 1 if logits.ndim >= 2 else 0
    ncls = logits.shape[cdim]
    logp = np.moveaxis(_np_log_softmax([logits], {"axis": cdim}), cdim, -1)  # [..., C]
    ignore = target == attrs["ignore_index"]
    bad = ~ignore & ((target < 0) | (target >= ncls))
    if bad.any():
        raise ExecutionError(f"cross_entropy: target {target[bad].reshape(-1)[0]} is out of range for "
                             f"{ncls} classes (valid: 0..{ncls - 1}, or ignore_index={attrs['ignore_index']})")
    safe = np.where(ignore, 0, target)
    zero = np.zeros((), logp.dtype)
    loss = np.where(ignore, zero, -np.take_along_axis(logp, safe[..., None], axis=-1)[..., 0])
    ls = attrs["label_smoothing"]
    if ls > 0.0:
        smooth = np.where(ignore, zero, -np.sum(logp, axis=-1) / np.asarray(ncls, logp.dtype))
        loss = (1.0 - ls) * loss + ls * smooth
    red = attrs["reduction"]
    if red == "none":
        return loss
    if red == "sum":
        return np.sum(loss)
    # Ignored targets count neither in the sum nor in the divisor (0/0 is NaN, as in PyTorch).
    return np.sum(loss) / np.asarray(np.count_nonzero(~ignore), logp.dtype)


def _torch_cross_entropy(args, attrs):
    return F.cross_entropy(args[0], args[1], ignore_index=attrs["ignore_index"], reduction=attrs["reduction"],
                           label_smoothing=attrs["label_smoothing"])


register(OpDef(
    name="cross_entropy", operands=("logits", "target"),
    attrs=(AttrSpec("reduction", "str", "mean", choices=("mean", "sum", "none")),
           AttrSpec("ignore_index", "int", -100), AttrSpec("label_smoothing", "float", 0.0)),
    infer=_ce_infer, reference=_np_cross_entropy, torch=_torch_cross_entropy, cost=_io_cost(6),
    doc="-log_softmax(logits)[target] with classes on axis 1 (axis 0 for [C] logits and a scalar "
        "target); target holds i64 class indices. Targets equal to ignore_index (default -100) "
        "give 0 and are left out of the mean's divisor; any other target outside 0..C-1 is an "
        "error at run time. label_smoothing e mixes in e times the mean of -log_softmax over "
        "classes. reduction 'mean' (default), 'sum' or 'none' (per-element loss). No class "
        "weights or probability targets. Cost: 6 FLOPs per logit.",
))
