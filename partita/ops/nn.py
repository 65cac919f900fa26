"""Neural-network ops: softmax, normalizations, embedding, convolution, pooling, dropout and
cross entropy, with PyTorch (``torch.nn.functional``) semantics.

The NumPy references compute f16/bf16 inputs in f32 and let the interpreter round once, as
PyTorch's CPU kernels do; f32 and f64 are computed in their own precision. Convolution
and pooling come in 2-d (NCHW, rank 4) and 3-d (NCDHW, rank 5) records and take batched
inputs only (PyTorch also accepts unbatched ones; here a batch dimension of size 1 is added
with ``reshape`` instead, so the type rules stay simple and explicit).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ..ir.diagnostics import ExecutionError, TypeRuleError
from ..ir.dtypes import f32, f64, i64
from ..ir.types import TensorType
from ._lazy import F, torch
from .numeric import compute_np
from .registry import AttrSpec, Cost, OpDef, normalize_axes, normalize_axis, register


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
    x = compute_np(args[0])
    if x.ndim == 0:
        return np.exp(x - x)  # 1, or NaN for a NaN/inf input as in PyTorch
    z = np.exp(_np_shifted(x, attrs["axis"]))
    return z / np.sum(z, axis=attrs["axis"], keepdims=True)


def _np_log_softmax(args, attrs):
    x = compute_np(args[0])
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
    x = compute_np(args[0])
    axes = tuple(range(x.ndim - len(attrs["axes"]), x.ndim))
    mean = np.mean(x, axis=axes, keepdims=True)
    d = x - mean
    var = np.mean(d * d, axis=axes, keepdims=True)
    y = d / np.sqrt(var + np.asarray(attrs["eps"], x.dtype))
    if len(args) > 1:
        y = y * compute_np(args[1])
    if len(args) > 2:
        y = y + compute_np(args[2])
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
    x = compute_np(args[0])
    axes = tuple(range(x.ndim - len(attrs["axes"]), x.ndim))
    eps = attrs["eps"]
    if eps is None:
        eps = np.finfo(x.dtype).eps  # x is already in the computation dtype (f32 or f64)
    y = x / np.sqrt(np.mean(x * x, axis=axes, keepdims=True) + np.asarray(eps, x.dtype))
    if len(args) > 1:
        y = y * compute_np(args[1])
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
    # Ids below the table's real size never read a padded row (checked at run time).
    pad_ranged=lambda attrs: None,
    doc="table[indices]: rows of a [V, D] table gathered by i32/i64 indices of any shape, giving "
        "indices.shape + [D]. An index outside 0..V-1 (negative ones included) is an error at run "
        "time. No padding_idx/max_norm (they only matter for training or mutate the table).",
))


# --- shared geometry of convolution and pooling ----------------------------------------------------
#
# One record per spatial rank (conv2d, conv3d, max_pool2d, max_pool3d, ...), all built by the
# factories below from the same N-d code. The rank fixes the input rank and the length of every
# window attribute, so a type rule can check "'stride' must be 3 integers" without guessing the
# rank from the operands, and each name matches the torch function and ATen op it lowers to.
# 1-D ops are not records: importers run them as 2-D ones over a unit height.

_SPATIAL = {2: ("height", "width"), 3: ("depth", "height", "width")}
_LAYOUT = {2: "[N, C, H, W]", 3: "[N, C, D, H, W]"}
_KERNEL_LAYOUT = {2: "kH, kW", 3: "kD, kH, kW"}


def _x(sizes) -> str:
    return "x".join(map(str, sizes))


def _window_attr(op: str, attrs: dict, name: str, nd: int, lo: int) -> tuple[int, ...]:
    """Attribute ``name`` as ``nd`` integers, each at least ``lo``."""
    v = attrs[name]
    if len(v) != nd:
        raise TypeRuleError(f"{op}: attribute '{name}' must be {nd} integers [{', '.join(_SPATIAL[nd])}], "
                            f"got {list(v)}")
    if min(v) < lo:
        raise TypeRuleError(f"{op}: attribute '{name}' must be >= {lo} in each dimension, got {list(v)}")
    return tuple(v)


def _require_spatial(op: str, x: TensorType, nd: int) -> None:
    if x.rank != nd + 2:
        raise TypeRuleError(f"{op}: the input must be {nd + 2}-d {_LAYOUT[nd]}, got {x}"
                            + ("; add a batch dimension of 1 with reshape" if x.rank == nd + 1 else ""))


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


def _ceil_overhang(size: int, out: int, k: int, s: int, p: int, d: int) -> int:
    """Extra right padding a ceil_mode window may reach past the input and its padding."""
    return max(0, (out - 1) * s + d * (k - 1) + 1 - (size + 2 * p))


def _pad_spatial(x: np.ndarray, before, after, value) -> np.ndarray:
    return np.pad(x, ((0, 0), (0, 0)) + tuple(zip(before, after)), constant_values=value)


def _window_view(xp: np.ndarray, k, s, d, out) -> np.ndarray:
    """[N, C, *out, *k] taps of each window of a padded [N, C, *spatial] array (im2col as a
    strided view); ``xp`` must reach the last window's last tap."""
    nd = len(k)
    span = tuple(di * (ki - 1) + 1 for ki, di in zip(k, d))
    v = np.lib.stride_tricks.sliding_window_view(xp, span, axis=tuple(range(2, 2 + nd)))
    sel = ((slice(None), slice(None)) + tuple(slice(0, (o - 1) * si + 1, si) for o, si in zip(out, s))
           + tuple(slice(None, None, di) for di in d))
    return v[sel]


# Einsum subscripts for up to 3 spatial dims: output positions and kernel taps.
_OUT_IDX, _TAP_IDX = "uvw", "ijl"


# --- conv2d and conv3d -------------------------------------------------------------------------------

def _conv_geometry(op: str, nd: int, attrs: dict):
    return (_window_attr(op, attrs, "stride", nd, 1), _window_attr(op, attrs, "padding", nd, 0),
            _window_attr(op, attrs, "dilation", nd, 1))


def _check_groups(op: str, g: int) -> None:
    if g < 1:
        raise TypeRuleError(f"{op}: attribute 'groups' must be >= 1, got {g}")


def _check_bias(op: str, x: TensorType, ts: list[TensorType], o: int) -> None:
    if len(ts) > 2:
        b = ts[2]
        if b.shape != (o,):
            raise TypeRuleError(f"{op}: the bias must have shape [{o}] (one per output channel), got {b}")
        _require_same_dtype(op, x, b, "the bias")


def _conv_infer(op: str, nd: int):
    def infer(ts, attrs):
        x, w = ts[0], ts[1]
        _require_spatial(op, x, nd)
        _require_float(op, x)
        if w.rank != nd + 2:
            raise TypeRuleError(f"{op}: the weight must be {nd + 2}-d [out_channels, in_channels/groups, "
                                f"{_KERNEL_LAYOUT[nd]}], got {w}")
        _require_same_dtype(op, x, w, "the weight")
        s, p, d = _conv_geometry(op, nd, attrs)
        g = attrs["groups"]
        _check_groups(op, g)
        n, c, size = x.shape[0], x.shape[1], x.shape[2:]
        o, cg, k = w.shape[0], w.shape[1], w.shape[2:]
        if c % g:
            raise TypeRuleError(f"{op}: the input's {c} channels are not divisible by groups={g}")
        if o % g:
            raise TypeRuleError(f"{op}: the weight's {o} output channels are not divisible by groups={g}")
        if cg * g != c:
            raise TypeRuleError(
                f"{op}: channel mismatch: the input {x} has {c} channels, so with groups={g} the weight "
                f"must have {c // g} input channels per group (dim 1), but the weight {w} has {cg}")
        _check_bias(op, x, ts, o)
        out = tuple(_out_size(*a, False) for a in zip(size, k, s, p, d))
        if min(out) < 1:
            raise TypeRuleError(
                f"{op}: the kernel {_x(k)} (dilation {list(d)}) is larger than the padded input "
                f"{_x(si + 2 * pi for si, pi in zip(size, p))}; the output would be {_x(out)}")
        return TensorType((n, o) + out, x.dtype)
    return infer


def _np_conv(args, attrs):
    x, w = compute_np(args[0]), compute_np(args[1])
    nd = x.ndim - 2
    s, p, d, g = attrs["stride"], attrs["padding"], attrs["dilation"], attrs["groups"]
    n, c = x.shape[:2]
    o, cg, k = w.shape[0], w.shape[1], w.shape[2:]
    out = tuple(_out_size(*a, False) for a in zip(x.shape[2:], k, s, p, d))
    patches = _window_view(_pad_spatial(x, p, p, 0), k, s, d, out).reshape((n, g, cg) + out + k)
    wg = w.reshape((g, o // g, cg) + k)
    oi, ti = _OUT_IDX[:nd], _TAP_IDX[:nd]
    y = np.einsum(f"ngc{oi}{ti},goc{ti}->ngo{oi}", patches, wg, optimize=True).reshape((n, o) + out)
    if len(args) > 2:
        y = y + compute_np(args[2]).reshape((1, o) + (1,) * nd)
    return y


def _torch_conv(nd: int):
    def run(args, attrs):
        b = args[2] if len(args) > 2 else None
        return getattr(F, f"conv{nd}d")(args[0], args[1], b, stride=attrs["stride"], padding=attrs["padding"],
                                        dilation=attrs["dilation"], groups=attrs["groups"])
    return run


def _conv_cost(ins, outs, attrs):
    cg, k = ins[1].shape[1], ins[1].shape[2:]
    return Cost(2 * outs[0].numel * cg * math.prod(k), sum(t.nbytes for t in ins), outs[0].nbytes)


for _nd in (2, 3):
    register(OpDef(
        name=f"conv{_nd}d", operands=("x", "weight", "bias?"),
        attrs=(AttrSpec("stride", "ints", (1,) * _nd), AttrSpec("padding", "ints", (0,) * _nd),
               AttrSpec("dilation", "ints", (1,) * _nd), AttrSpec("groups", "int", 1)),
        infer=_conv_infer(f"conv{_nd}d", _nd), reference=_np_conv, torch=_torch_conv(_nd), cost=_conv_cost,
        doc=f"{_nd}-d cross-correlation of x {_LAYOUT[_nd]} with weight [O, C/groups, {_KERNEL_LAYOUT[_nd]}] "
            f"plus an optional bias [O]; stride, padding (zeros, both sides) and dilation have one entry "
            f"per spatial dim ({', '.join(_SPATIAL[_nd])}). Each output size is "
            f"(size + 2*p - d*(k-1) - 1) // s + 1. Cost: 2 * output elements * (C/groups) * kernel "
            f"taps FLOPs (the bias add is not counted).",
    ))


# --- conv_transpose2d and conv_transpose3d -----------------------------------------------------------

def _conv_transpose_infer(op: str, nd: int):
    def infer(ts, attrs):
        x, w = ts[0], ts[1]
        _require_spatial(op, x, nd)
        _require_float(op, x)
        if w.rank != nd + 2:
            raise TypeRuleError(f"{op}: the weight must be {nd + 2}-d [in_channels, out_channels/groups, "
                                f"{_KERNEL_LAYOUT[nd]}], got {w}")
        _require_same_dtype(op, x, w, "the weight")
        s, p, d = _conv_geometry(op, nd, attrs)
        op_ = _window_attr(op, attrs, "output_padding", nd, 0)
        g = attrs["groups"]
        _check_groups(op, g)
        n, c, size = x.shape[0], x.shape[1], x.shape[2:]
        if c % g:
            raise TypeRuleError(f"{op}: the input's {c} channels are not divisible by groups={g}")
        if w.shape[0] != c:
            raise TypeRuleError(f"{op}: channel mismatch: the input {x} has {c} channels but the weight {w} "
                                f"has {w.shape[0]} in dim 0 (a transposed convolution's weight is "
                                f"[in_channels, out_channels/groups, ...])")
        o, k = w.shape[1] * g, w.shape[2:]
        _check_bias(op, x, ts, o)
        for i, dim in enumerate(_SPATIAL[nd]):
            if op_[i] >= s[i] and op_[i] >= d[i]:
                raise TypeRuleError(f"{op}: output_padding {list(op_)} must be smaller than the stride "
                                    f"{list(s)} or the dilation {list(d)} in {dim}; pad the result "
                                    f"explicitly instead")
        out = tuple((i - 1) * si - 2 * pi + di * (ki - 1) + opi + 1
                    for i, ki, si, pi, di, opi in zip(size, k, s, p, d, op_))
        if min(out) < 1:
            raise TypeRuleError(f"{op}: padding {list(p)} crops the whole output of the input {x}; the "
                                f"output would be {_x(out)}")
        return TensorType((n, o) + out, x.dtype)
    return infer


def _np_conv_transpose(args, attrs):
    x, w = compute_np(args[0]), compute_np(args[1])
    nd = x.ndim - 2
    s, p, d, op_, g = (attrs["stride"], attrs["padding"], attrs["dilation"], attrs["output_padding"],
                       attrs["groups"])
    n, c, size = x.shape[0], x.shape[1], x.shape[2:]
    og, k = w.shape[1], w.shape[2:]
    # Every input position scatters its kernel-weighted values to (position * s + tap * d); the
    # full result, extended by output_padding zeros at the end, is then cropped by p each side.
    full = tuple((i - 1) * si + di * (ki - 1) + 1 + opi for i, ki, si, di, opi in zip(size, k, s, d, op_))
    y = np.zeros((n, g, og) + full, dtype=np.result_type(x, w))
    xg = x.reshape((n, g, c // g) + size)
    wg = w.reshape((g, c // g, og) + k)
    oi = _OUT_IDX[:nd]
    for tap in np.ndindex(*k):
        part = np.einsum(f"ngc{oi},gco->ngo{oi}", xg, wg[(slice(None),) * 3 + tap], optimize=True)
        y[(slice(None),) * 3 + tuple(slice(t * di, t * di + (i - 1) * si + 1, si)
                                     for t, di, i, si in zip(tap, d, size, s))] += part
    out = tuple(f - 2 * pi for f, pi in zip(full, p))
    y = y.reshape((n, g * og) + full)[(slice(None),) * 2 + tuple(slice(pi, pi + oo) for pi, oo in zip(p, out))]
    if len(args) > 2:
        y = y + compute_np(args[2]).reshape((1, g * og) + (1,) * nd)
    return y


def _torch_conv_transpose(nd: int):
    def run(args, attrs):
        b = args[2] if len(args) > 2 else None
        return getattr(F, f"conv_transpose{nd}d")(args[0], args[1], b, stride=attrs["stride"],
                                                  padding=attrs["padding"], output_padding=attrs["output_padding"],
                                                  groups=attrs["groups"], dilation=attrs["dilation"])
    return run


def _conv_transpose_cost(ins, outs, attrs):
    og, k = ins[1].shape[1], ins[1].shape[2:]
    return Cost(2 * ins[0].numel * og * math.prod(k), sum(t.nbytes for t in ins), outs[0].nbytes)


for _nd in (2, 3):
    register(OpDef(
        name=f"conv_transpose{_nd}d", operands=("x", "weight", "bias?"),
        attrs=(AttrSpec("stride", "ints", (1,) * _nd), AttrSpec("padding", "ints", (0,) * _nd),
               AttrSpec("output_padding", "ints", (0,) * _nd), AttrSpec("dilation", "ints", (1,) * _nd),
               AttrSpec("groups", "int", 1)),
        infer=_conv_transpose_infer(f"conv_transpose{_nd}d", _nd), reference=_np_conv_transpose,
        torch=_torch_conv_transpose(_nd), cost=_conv_transpose_cost,
        doc=f"{_nd}-d transposed convolution (the gradient of conv{_nd}d with respect to its input) of x "
            f"{_LAYOUT[_nd]} with weight [C, O/groups, {_KERNEL_LAYOUT[_nd]}] plus an optional bias [O]. "
            f"Each output size is (size - 1)*s - 2*p + d*(k-1) + output_padding + 1: padding crops "
            f"both ends, output_padding (smaller than the stride or the dilation, as in PyTorch) "
            f"extends the end. Cost: 2 * input elements * (O/groups) * kernel taps FLOPs.",
    ))


# --- max_pool2d/3d (with and without indices) and avg_pool2d/3d ------------------------------------

def _pool_geometry(op: str, nd: int, shape: tuple[int, ...], attrs: dict):
    """(kernel, stride, padding, dilation, output size) of a pool over ``shape``, checked as
    PyTorch checks them."""
    k = _window_attr(op, attrs, "kernel", nd, 1)
    s = k if attrs["stride"] is None else _window_attr(op, attrs, "stride", nd, 1)
    p = _window_attr(op, attrs, "padding", nd, 0)
    d = _window_attr(op, attrs, "dilation", nd, 1)
    for i, dim in enumerate(_SPATIAL[nd]):
        # PyTorch's limit, as its CPU kernels check it: at most half the kernel, dilation
        # not counted (one internal path allows half the dilated window; we take the stricter).
        half = k[i] // 2
        if p[i] > half:
            raise TypeRuleError(f"{op}: padding {list(p)} is more than half the window in {dim} "
                                f"(kernel {list(k)}); at most {half} is allowed")
    size = shape[2:]
    out = tuple(_out_size(*a, attrs["ceil_mode"]) for a in zip(size, k, s, p, d))
    if min(out) < 1:
        raise TypeRuleError(f"{op}: the window {list(k)} does not fit in the padded input "
                            f"{_x(si + 2 * pi for si, pi in zip(size, p))} of the input {_shape(shape)}; "
                            f"the output would be {_x(out)}")
    return k, s, p, d, out


def _max_pool_infer(op: str, nd: int, with_indices: bool):
    def infer(ts, attrs):
        (x,) = ts
        _require_spatial(op, x, nd)
        if x.dtype.is_bool:
            raise TypeRuleError(f"{op}: the input must be numeric, got {x}")
        *_, out = _pool_geometry(op, nd, x.shape, attrs)
        y = TensorType(x.shape[:2] + out, x.dtype)
        return [y, TensorType(y.shape, i64)] if with_indices else y
    return infer


def _max_pool_windows(x: np.ndarray, attrs: dict):
    """(padded windows [N, C, *out, taps], geometry) of a max pool; padding never wins."""
    nd = x.ndim - 2
    k, s, p, d, out = _pool_geometry("max_pool", nd, x.shape, attrs)
    fill = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    after = [pi + _ceil_overhang(*a) for pi, a in zip(p, zip(x.shape[2:], out, k, s, p, d))]
    win = _window_view(_pad_spatial(x, p, after, fill), k, s, d, out)
    return win.reshape(win.shape[:2 + nd] + (math.prod(k),)), (k, s, p, d, out)


def _np_max_pool(args, attrs):
    win, _ = _max_pool_windows(compute_np(args[0]), attrs)
    return np.max(win, axis=-1)


def _np_max_pool_with_indices(args, attrs):
    x = compute_np(args[0])
    win, (k, s, p, d, out) = _max_pool_windows(x, attrs)
    size = x.shape[2:]
    # Per dim, each (output position, tap) as an input coordinate; padding taps are invalid.
    coords = [(np.arange(o) * si - pi)[:, None] + (np.arange(ki) * di)[None, :]
              for o, ki, si, pi, di in zip(out, k, s, p, d)]
    valid = np.ones((), bool)
    flat = np.zeros((), np.int64)
    for i, cd in enumerate(coords):
        # Broadcast dim i's [out_i, k_i] into the [*out, *k] layout of the windows.
        shape = [1] * (2 * len(size))
        shape[i], shape[len(size) + i] = cd.shape
        cd = cd.reshape(shape)
        valid = valid & (cd >= 0) & (cd < size[i])
        flat = flat * size[i] + cd
    valid = np.broadcast_to(valid, out + k).reshape(out + (-1,))
    flat = np.broadcast_to(flat, out + k).reshape(out + (-1,))
    y = np.max(win, axis=-1)
    # PyTorch's kernel scans taps in order and takes a value that is greater than the best so
    # far, or NaN: the first maximum, or the last NaN; all -inf (or all the integer minimum)
    # gives the first tap inside the input.
    tap = np.argmax(valid & (win == y[..., None]), axis=-1)
    if x.dtype.kind == "f":
        nan = np.isnan(win)
        last_nan = win.shape[-1] - 1 - np.argmax(nan[..., ::-1], axis=-1)
        tap = np.where(nan.any(axis=-1), last_nan, tap)
    idx = np.take_along_axis(np.broadcast_to(flat, win.shape), tap[..., None], axis=-1)[..., 0]
    return y, idx.astype(np.int64)


def _torch_max_pool(nd: int, with_indices: bool):
    def run(args, attrs):
        k = attrs["kernel"]
        return getattr(F, f"max_pool{nd}d")(args[0], k, attrs["stride"] or k, attrs["padding"], attrs["dilation"],
                                            ceil_mode=attrs["ceil_mode"], return_indices=with_indices)
    return run


def _pool_cost(ins, outs, attrs):
    return Cost(outs[0].numel * math.prod(attrs["kernel"]), ins[0].nbytes, sum(t.nbytes for t in outs))


def _pool_attrs(nd: int, extra: tuple[AttrSpec, ...]) -> tuple[AttrSpec, ...]:
    return (AttrSpec("kernel", "ints"), AttrSpec("stride", "ints", None), AttrSpec("padding", "ints", (0,) * nd),
            AttrSpec("dilation", "ints", (1,) * nd), AttrSpec("ceil_mode", "bool", False)) + extra


for _nd in (2, 3):
    for _with in (False, True):
        _name = f"max_pool{_nd}d" + ("_with_indices" if _with else "")
        register(OpDef(
            name=_name, operands=("x",), attrs=_pool_attrs(_nd, ()),
            infer=_max_pool_infer(_name, _nd, _with),
            reference=_np_max_pool_with_indices if _with else _np_max_pool,
            torch=_torch_max_pool(_nd, _with), cost=_pool_cost,
            doc=f"max over kernel windows of x {_LAYOUT[_nd]}; stride defaults to the kernel; padding "
                "(which never wins the max) is at most half the kernel (dilation not counted); "
                "ceil_mode rounds the output size up, keeping only windows that start inside the input "
                "or its left padding. NaN propagates. "
                + ("Two results: the values and i64 indices of each maximum, flattened (row-major) "
                   "within its own [N, C] plane of the unpadded input, as PyTorch returns them; ties "
                   "give the first maximum. " if _with else "")
                + "Cost: one FLOP per window tap.",
        ))


def _avg_pool_infer(op: str, nd: int):
    def infer(ts, attrs):
        (x,) = ts
        _require_spatial(op, x, nd)
        _require_float(op, x)
        *_, out = _pool_geometry(op, nd, x.shape, attrs)
        return TensorType(x.shape[:2] + out, x.dtype)
    return infer


def _avg_divisor(size: int, out: int, k: int, s: int, p: int, d: int, include_pad: bool) -> np.ndarray:
    """Per-output-position divisor along one dimension: the window's taps inside input+padding
    (include_pad) or inside the input alone; taps of a ceil_mode window that hang past the
    padding never count. With dilation 1 this is PyTorch's clipped window length."""
    pos = (np.arange(out) * s - p)[:, None] + (np.arange(k) * d)[None, :]
    lo, hi = (-p, size + p) if include_pad else (0, size)
    return np.maximum(np.count_nonzero((pos >= lo) & (pos < hi), axis=1), 1)


def _avg_pool_divisor(shape, k, s, p, d, out, include_pad: bool) -> np.ndarray:
    divs = [_avg_divisor(size, o, ki, si, pi, di, include_pad)
            for size, o, ki, si, pi, di in zip(shape[2:], out, k, s, p, d)]
    return functools.reduce(np.multiply.outer, divs)


def avg_pool_mean_axes(shape: tuple[int, ...], attrs: dict) -> tuple[int, ...] | None:
    """The spatial axes an ``avg_pool`` over ``shape`` averages whole, when it is a mean over
    them (each window of such an axis takes every element once, divided by the axis's size)
    and the identity along the others (each window takes its own element alone, divided by
    1); ``()`` for a pool that is the identity (a 1 x 1 window, or any window on a 1 x 1 map
    that counts no padding); None for any other pool."""
    nd = len(shape) - 2
    k, s, p, d, out = _pool_geometry("avg_pool", nd, shape, attrs)
    axes = []
    for i, (size, o, ki, si, pi, di) in enumerate(zip(shape[2:], out, k, s, p, d)):
        pos = (np.arange(o) * si - pi)[:, None] + (np.arange(ki) * di)[None, :]
        inside = [sorted(row[(row >= 0) & (row < size)].tolist()) for row in pos]
        div = _avg_divisor(size, o, ki, si, pi, di, attrs["count_include_pad"])
        if o == size and all(r == [j] for j, r in enumerate(inside)) and (div == 1).all():
            continue
        if o == 1 and inside[0] == list(range(size)) and int(div[0]) == size:
            axes.append(2 + i)
            continue
        return None
    return tuple(axes)


def _np_avg_pool(args, attrs):
    x = compute_np(args[0])
    nd = x.ndim - 2
    k, s, p, d, out = _pool_geometry("avg_pool", nd, x.shape, attrs)
    after = [pi + _ceil_overhang(*a) for pi, a in zip(p, zip(x.shape[2:], out, k, s, p, d))]
    win = _window_view(_pad_spatial(x, p, after, 0), k, s, d, out)
    div = _avg_pool_divisor(x.shape, k, s, p, d, out, attrs["count_include_pad"])
    return np.sum(win, axis=tuple(range(2 + nd, 2 + 2 * nd))) / div.astype(x.dtype)


def _torch_avg_pool(nd: int):
    def run(args, attrs):
        x = args[0]
        k, s, p, d, out = _pool_geometry("avg_pool", nd, tuple(x.shape), attrs)
        if all(di == 1 for di in d):
            return getattr(F, f"avg_pool{nd}d")(x, k, s, p, ceil_mode=attrs["ceil_mode"],
                                                count_include_pad=attrs["count_include_pad"])
        # PyTorch's pools have no dilation: sum the dilated windows with a depthwise conv of
        # ones over the zero-padded input, then divide by the same counts as the reference.
        n, c, size = x.shape[0], x.shape[1], tuple(x.shape[2:])
        pads: list[int] = []
        for a in reversed(list(zip(size, out, k, s, p, d))):
            pads += [a[4], a[4] + _ceil_overhang(*a)]
        xp = F.pad(x.reshape((n * c, 1) + size), pads)
        ones = torch.ones((1, 1) + k, dtype=x.dtype, device=x.device)
        sums = getattr(F, f"conv{nd}d")(xp, ones, stride=s, dilation=d)
        sums = sums[(slice(None), slice(None)) + tuple(slice(0, o) for o in out)]
        div = torch.as_tensor(_avg_pool_divisor(tuple(x.shape), k, s, p, d, out, attrs["count_include_pad"]),
                              dtype=x.dtype, device=x.device)
        return (sums / div).reshape((n, c) + out)
    return run


for _nd in (2, 3):
    register(OpDef(
        name=f"avg_pool{_nd}d", operands=("x",),
        attrs=_pool_attrs(_nd, (AttrSpec("count_include_pad", "bool", True),)),
        infer=_avg_pool_infer(f"avg_pool{_nd}d", _nd), reference=_np_avg_pool, torch=_torch_avg_pool(_nd),
        cost=_pool_cost,
        doc=f"mean over kernel windows of x {_LAYOUT[_nd]}; stride defaults to the kernel; zero padding "
            "at most half the kernel; dilation spaces the taps (PyTorch's pools have none; ONNX's "
            "AveragePool does). The divisor counts the window's taps inside the padded input when "
            "count_include_pad (taps of a ceil_mode window past the padding never count), else "
            "inside the input alone; PyTorch's divisor_override is not offered. Cost: one FLOP per "
            "window tap.",
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
    x, w, b, rm, rv = (compute_np(a) for a in args)
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
    x = ts[0]
    _require_float("dropout", x)
    p = attrs["p"]
    if not 0.0 <= p <= 1.0:
        raise TypeRuleError(f"dropout: probability p must be between 0 and 1, got {p}")
    whole = attrs["whole"]
    if len(ts) > 1:
        o = ts[1]
        if o.dtype != i64 or o.shape != (x.rank,):
            raise TypeRuleError(f"dropout: origin {o} must be i64 [{x.rank}] (the global index of x's first "
                                "element along each dim)")
        if whole is None or len(whole) != x.rank or any(w < n for w, n in zip(whole, x.shape)):
            raise TypeRuleError(f"dropout: with an origin, whole={whole} must give the global shape that x "
                                f"{x} is a piece of (one size per dim, each at least x's)")
    elif whole is not None:
        raise TypeRuleError("dropout: whole= (a global shape) needs the origin operand")
    return x


def _global_index(lib, shape, origin, whole, device=None):
    """The flat index in a tensor of shape ``whole`` of every element of a ``shape`` piece
    whose first element sits at ``origin`` (None: the piece is the whole tensor)."""
    n = math.prod(shape)
    if origin is None:
        idx = lib.arange(n, dtype=lib.int64) if device is None else lib.arange(n, dtype=lib.int64, device=device)
        return idx.reshape(tuple(shape))
    stride = 1
    idx = None
    for d in reversed(range(len(shape))):
        ar = lib.arange(shape[d], dtype=lib.int64) if device is None else \
            lib.arange(shape[d], dtype=lib.int64, device=device)
        term = ((ar + origin[d]) * stride).reshape(tuple(-1 if k == d else 1 for k in range(len(shape))))
        idx = term if idx is None else idx + term
        stride *= int(whole[d])
    if idx is None:      # a scalar: its index is 0
        return lib.zeros((), dtype=lib.int64) if device is None else lib.zeros((), dtype=lib.int64, device=device)
    return idx           # the terms broadcast to the piece's full shape


def _np_dropout(args, attrs):
    x = args[0]
    if not attrs["train"]:
        return x
    x = compute_np(x)
    p = attrs["p"]
    k0, k1 = _dropout_keys(attrs["seed"])
    origin = [int(o) for o in np.asarray(args[1]).reshape(-1)] if len(args) > 1 else None
    idx = _global_index(np, x.shape, origin, attrs["whole"])
    keep = _dropout_hash(idx, k0, k1) >= _dropout_threshold(p)
    scale = np.asarray(1.0 / (1.0 - p) if p < 1.0 else 0.0, x.dtype)
    return np.where(keep, x * scale, np.zeros((), x.dtype))


def _torch_dropout(args, attrs):
    x = args[0]
    if not attrs["train"]:
        return x
    p = attrs["p"]
    k0, k1 = _dropout_keys(attrs["seed"])
    origin = args[1].to(torch.int64) if len(args) > 1 else None
    idx = _global_index(torch, tuple(x.shape), origin, attrs["whole"], x.device)
    keep = _dropout_hash(idx, k0, k1) >= _dropout_threshold(p)
    scale = 1.0 / (1.0 - p) if p < 1.0 else 0.0
    return torch.where(keep, x * scale, torch.zeros((), dtype=x.dtype, device=x.device))


register(OpDef(
    name="dropout", operands=("x", "origin?"),
    attrs=(AttrSpec("p", "float", 0.5), AttrSpec("train", "bool", False), AttrSpec("seed", "int", 0),
           AttrSpec("whole", "ints", None)),
    infer=_dropout_infer, reference=_np_dropout, torch=_torch_dropout,
    effects=lambda attrs: frozenset({"rng"}) if attrs["train"] else frozenset(),
    cost=_io_cost(1),
    doc="train=false (the default: inference) is the identity and pure. train=true: zero each element with "
        "probability p and scale the others by 1/(1-p); p=1 gives zeros (NaN included). The mask "
        "is a counter-based hash of the flat element index and the seed, computed with the same "
        "int64 arithmetic by both executors, so one seed gives one mask everywhere (it is not "
        "torch's generator stream). A train dropout has the 'rng' effect. With the optional "
        "origin (i64 [rank]) and whole (a shape), x is the piece at origin of a tensor of shape "
        "whole and the mask is that tensor's: a rank's dropout of its shard equals its piece of "
        "the unsplit dropout (how a split dropout runs; partita.parallel.local_forms.dropout).",
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
    logits, target = compute_np(args[0]), args[1]
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


def ce_padded_classes(attrs: dict) -> str | None:
    """Padded classes, masked to -inf logits, drop out of the softmax; label smoothing would
    still spread over them."""
    return "smooths the labels over every class" if attrs["label_smoothing"] > 0.0 else None


register(OpDef(
    name="cross_entropy", operands=("logits", "target"),
    attrs=(AttrSpec("reduction", "str", "mean", choices=("mean", "sum", "none")),
           AttrSpec("ignore_index", "int", -100), AttrSpec("label_smoothing", "float", 0.0)),
    infer=_ce_infer, reference=_np_cross_entropy, torch=_torch_cross_entropy, cost=_io_cost(6),
    pad_ranged=ce_padded_classes, pad_logits=0,
    doc="-log_softmax(logits)[target] with classes on axis 1 (axis 0 for [C] logits and a scalar "
        "target); target holds i64 class indices. Targets equal to ignore_index (default -100) "
        "give 0 and are left out of the mean's divisor; any other target outside 0..C-1 is an "
        "error at run time. label_smoothing e mixes in e times the mean of -log_softmax over "
        "classes. reduction 'mean' (default), 'sum' or 'none' (per-element loss). No class "
        "weights or probability targets. Cost: 6 FLOPs per logit.",
))


# --- attention ---------------------------------------------------------------------------------
#
# One fused record for scaled dot-product attention, so that the torch executor runs PyTorch's
# CPU flash kernel (the one eager SDPA runs) forward and backward instead of a chain of
# matmul/mask/softmax/matmul. Its second result, the logsumexp of each query row, is what
# the kernel's backward reads (autograd saves it the same way); attention_grad in
# backward.py takes it back.

def attention_infer(ts, attrs):
    """The type rule of attention: out like q with v's head size, and the log-sum-exp per query."""
    q, k, v = ts[:3]
    _require_float("attention", q, "query q")
    for t, what in ((k, "the key k"), (v, "the value v")):
        _require_same_dtype("attention", q, t, what)
    if q.rank < 2:
        raise TypeRuleError(f"attention: q must be [..., Tq, E] (rank 2 or more), got {q}")
    if k.rank != q.rank or v.rank != q.rank:
        raise TypeRuleError(f"attention: q {q}, k {k} and v {v} must have the same rank "
                            f"([..., Tq, E], [..., Tk, E], [..., Tk, Ev]); reshape or broadcast_to them first")
    lead = q.shape[:-2]
    for t, what in ((k, "k"), (v, "v")):
        if t.shape[:-2] != lead:
            raise TypeRuleError(f"attention: the batch/head dims of {what} {t} are {_shape(t.shape[:-2])} but "
                                f"those of q {q} are {_shape(lead)}; they must be equal (broadcast_to them first)")
    if k.shape[-1] != q.shape[-1]:
        raise TypeRuleError(f"attention: k {k} has head size {k.shape[-1]} but q {q} has {q.shape[-1]}; "
                            f"the last dims of q and k must be equal")
    if q.shape[-1] == 0:
        raise TypeRuleError(f"attention: q {q} has head size 0 (the default scale 1/sqrt(E) is undefined)")
    if v.shape[-2] != k.shape[-2]:
        raise TypeRuleError(f"attention: v {v} has {v.shape[-2]} keys (dim -2) but k {k} has {k.shape[-2]}; "
                            f"they must be equal")
    tq, tk = q.shape[-2], k.shape[-2]
    if len(ts) > 3:
        m = ts[3]
        if not (m.dtype.is_bool or m.dtype == q.dtype):
            raise TypeRuleError(f"attention: the mask {m} must be bool (true keeps a score) or have q's dtype "
                                f"{q.dtype} (added to the scores); cast it")
        scores = lead + (tq, tk)
        ok = m.rank <= len(scores) and all(a in (1, b) for a, b in zip(reversed(m.shape), reversed(scores)))
        if not ok:
            raise TypeRuleError(f"attention: the mask {m} does not broadcast to the scores' shape "
                                f"{_shape(scores)} ([..., Tq, Tk]); each dim must be 1 or equal")
    check_causal_cp("attention", tq, tk, attrs)
    lse_dtype = f64 if q.dtype == f64 else f32
    return [TensorType(q.shape[:-1] + (v.shape[-1],), q.dtype), TensorType(q.shape[:-1], lse_dtype)]


def check_causal_cp(op: str, tq: int, tk: int, attrs) -> None:
    """The ``causal_cp`` hint fits the shapes: Tk = cp * Tq keys, cut into 2 * cp equal chunks."""
    cp = attrs.get("causal_cp")
    if cp is None:
        return
    if cp < 1 or tk != cp * tq or tk % (2 * cp):
        raise TypeRuleError(f"{op}: causal_cp={cp} says the mask is context parallelism's balanced causal mask "
                            f"(Tk = cp x Tq keys in 2 x cp equal chunks) but Tq is {tq} and Tk {tk}; drop the "
                            f"attribute or give the cp the keys were gathered over")


def attention_scale(attrs, e: int) -> float:
    """The ``scale`` attribute, or 1/sqrt(head size ``e``) when it is None."""
    s = attrs["scale"]
    return 1.0 / math.sqrt(e) if s is None else s


def np_attention_scores(q, k, mask, attrs) -> np.ndarray:
    """scale * q k^T with the causal and mask conditions applied (-inf where a score is dropped)."""
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * attention_scale(attrs, q.shape[-1])
    tq, tk = s.shape[-2:]
    if attrs["causal"]:
        s = np.where(np.tril(np.ones((tq, tk), dtype=bool)), s, -np.inf)
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == np.bool_ else s + mask.astype(np.float64)
    return s


def np_attention(args, attrs):
    """The NumPy reference of attention: (out, lse)."""
    # f64 throughout: the interpreter rounds out and lse once to their dtypes.
    q, k, v = (a.astype(np.float64) for a in args[:3])
    s = np_attention_scores(q, k, args[3] if len(args) > 3 else None, attrs)
    if s.shape[-1] == 0:
        return np.zeros(q.shape[:-1] + (v.shape[-1],)), np.zeros(q.shape[:-1])
    m = np.max(s, axis=-1, keepdims=True)
    m = np.where(m == -np.inf, 0.0, m)  # a row with every score dropped
    e = np.exp(s - m)
    total = np.sum(e, axis=-1, keepdims=True)
    safe = np.where(total == 0.0, 1.0, total)
    return np.matmul(e, v) / safe, (m + np.log(safe))[..., 0]


_FLASH_DTYPES = ("float32", "float64", "bfloat16", "float16")


def flash_kernel_applies(q, v) -> bool:
    """Whether PyTorch's CPU flash kernel computes this attention: one of its dtypes, the same
    head size for q and v, and no empty dim (an empty one crashes the kernel)."""
    return (str(q.dtype).removeprefix("torch.") in _FLASH_DTYPES and q.shape[-1] == v.shape[-1]
            and q.numel() > 0 and v.numel() > 0)


def _float_mask(mask, dtype):
    """The mask as the kernel takes it: additive, in q's dtype (a bool mask becomes 0 / -inf)."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


def _to_4d(x, lead_n: int):
    """[..., T, E] -> [N, 1, T, E] (the kernel takes 4-d [B, H, T, E] only)."""
    return x if x.dim() == 4 else x.reshape(lead_n, 1, *x.shape[-2:])


def _mask_4d(mask, lead: tuple, lead_n: int):
    """A mask broadcastable to [*lead, Tq, Tk] as a 4-d mask broadcastable to the 4-d scores
    (the kernel takes 2-d and 4-d masks, broadcast in every dim)."""
    if mask is None:
        return None
    r = len(lead) + 2
    mask = mask.reshape((1,) * (r - mask.dim()) + tuple(mask.shape))
    if r == 4:
        return mask
    t, s = mask.shape[-2:]
    if all(d == 1 for d in mask.shape[:-2]):
        return mask.reshape(1, 1, t, s)
    return mask.expand(*lead, t, s).reshape(lead_n, 1, t, s)


def flash_kernel_args(q, k, v, mask):
    """q, k, v and the mask in the kernel's 4-d form, and q's batch/head dims to restore."""
    lead = tuple(q.shape[:-2])
    n = math.prod(lead)
    m = _mask_4d(_float_mask(mask, q.dtype), lead, n)
    return _to_4d(q, n), _to_4d(k, n), _to_4d(v, n), m, lead


def torch_attention_scores(q, k, mask, attrs, ct):
    """``np_attention_scores`` in PyTorch, computed in the dtype ``ct``."""
    s = torch.matmul(q.to(ct), k.to(ct).transpose(-2, -1)) * attention_scale(attrs, q.shape[-1])
    tq, tk = s.shape[-2:]
    if attrs["causal"]:
        keep = torch.ones(tq, tk, dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.to(ct)
    return s


def attention_compute_dtype(q):
    """The dtype attention computes in for q's dtype: f32 for f16/bf16."""
    return torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype


def _torch_attention_math(q, k, v, mask, attrs):
    """The fallback for what the kernel does not take, same results (f16/bf16 in f32)."""
    ct = attention_compute_dtype(q)
    if k.shape[-2] == 0:
        out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)
        return out, torch.zeros(q.shape[:-1], dtype=ct, device=q.device)
    s = torch_attention_scores(q, k, mask, attrs, ct)
    m = s.amax(-1, keepdim=True)
    m = m.masked_fill(m == float("-inf"), 0.0)  # a row with every score dropped gives out 0, lse 0
    e = torch.exp(s - m)
    total = e.sum(-1, keepdim=True)
    safe = total.masked_fill(total == 0, 1.0)
    out = torch.matmul(e, v.to(ct)) / safe
    return out.to(q.dtype), (m + torch.log(safe)).squeeze(-1)


def torch_attention(args, attrs):
    """The PyTorch implementation of attention: (out, lse), by the CPU flash kernel where it applies."""
    q, k, v = args[:3]
    mask = args[3] if len(args) > 3 else None
    # The flash kernel has no gradient for its mask: a mask that needs one (a learned bias,
    # under torch autograd) takes the math form.
    if not flash_kernel_applies(q, v) or (mask is not None and mask.requires_grad):
        return _torch_attention_math(q, k, v, mask, attrs)
    q4, k4, v4, m4, lead = flash_kernel_args(q, k, v, mask)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q4, k4, v4, 0.0, attrs["causal"], attn_mask=m4, scale=attrs["scale"])
    return out.reshape(*lead, *out.shape[-2:]), lse.reshape(*lead, lse.shape[-1])


# A flash kernel (FlashAttention's; partita's own, codegen/attention.py) with a causal mask
# skips every tile of (query, key) pairs above the diagonal and scores the tiles the diagonal
# crosses whole: about half the pairs of the full Tq x Tk scores, in the forward and in the
# backward. FLASH_TILE is the tile's side (FlashAttention-2's 128 x 128 blocks).
FLASH_TILE = 128


def attention_pairs(q: TensorType, k: TensorType, causal: bool) -> int:
    """The (query, key) pairs a flash kernel scores for q [..., Tq, E] against k [..., Tk, E]:
    all Tq x Tk of them per batch-and-head, or with ``causal`` (key j for query i only where
    j <= i, top-left aligned) the FLASH_TILE-square tiles on and below the diagonal."""
    tq, tk = q.shape[-2], k.shape[-2]
    heads = q.numel // (q.shape[-1] * tq) if q.numel else 0     # batch x heads
    if not causal:
        return heads * tq * tk
    b = FLASH_TILE
    n = tq // b                              # whole query tiles
    m = min(n, tk // b)                      # of them, those whose keys end inside Tk
    pairs = b * b * m * (m + 1) // 2 + (n - m) * b * tk
    rest = tq - n * b                        # the last, partial query tile
    if rest:
        pairs += rest * min(tk, (n + 1) * b)
    return heads * pairs


@functools.lru_cache(maxsize=4096)
def chunk_causal_pairs(offset: int, rows: int, tk: int) -> int:
    """The pairs a flash kernel scores for the query rows at positions ``[offset, offset +
    rows)`` against keys at positions ``[0, tk)``, each query keeping the keys at or before its
    position: per FLASH_TILE-row query tile (tiles from ``offset``), its rows times the keys up
    to its last row rounded up to whole FLASH_TILE key tiles (tiles from 0), at most ``tk``."""
    b = FLASH_TILE
    pairs = 0
    for start in range(0, rows, b):
        end = min(start + b, rows)
        last = offset + end                  # keys 0 .. last - 1 are kept by the tile's last row
        pairs += (end - start) * min(tk, -(-last // b) * b)
    return pairs


def balanced_causal_pairs(tq: int, tk: int, cp: int, rank: int) -> int:
    """The pairs cp rank ``rank`` scores (per batch-and-head) under context parallelism's
    balanced causal mask: its queries are chunks ``rank`` and ``2*cp-1-rank`` of ``2*cp``
    equal chunks of the ``tk`` gathered keys, each chunk run against the keys up to it."""
    c = tk // (2 * cp)
    return sum(chunk_causal_pairs(j * c, c, tk) for j in (rank, 2 * cp - 1 - rank)) if tq == 2 * c else tq * tk


def masked_attention_pairs(q: TensorType, k: TensorType, attrs) -> int:
    """The pairs an attention (or its backward) scores: ``attention_pairs`` by its causal
    flag, or with ``causal_cp`` the slowest cp rank's pairs under the balanced causal mask."""
    cp = attrs.get("causal_cp")
    if cp is None:
        return attention_pairs(q, k, bool(attrs.get("causal")))
    tq, tk = q.shape[-2], k.shape[-2]
    heads = q.numel // (q.shape[-1] * tq) if q.numel else 0
    return heads * max(balanced_causal_pairs(tq, tk, cp, r) for r in range(cp))


def _attention_cost(ins, outs, attrs):
    q, k, v = ins[:3]
    pairs = masked_attention_pairs(q, k, attrs)
    # Bytes: q, k, v (and a mask) read and out, lse written once each, causal or not; no scores.
    return Cost(2 * pairs * (q.shape[-1] + v.shape[-1]) + 5 * pairs,
                sum(t.nbytes for t in ins), sum(t.nbytes for t in outs))


register(OpDef(
    name="attention", operands=("q", "k", "v", "mask?"),
    attrs=(AttrSpec("scale", "float", None), AttrSpec("causal", "bool", False), AttrSpec("causal_cp", "int", None)),
    infer=attention_infer, reference=np_attention, torch=torch_attention, cost=_attention_cost,
    doc="Scaled dot-product attention as torch.nn.functional.scaled_dot_product_attention "
        "(no dropout): softmax(q k^T * scale + mask) v for q [..., Tq, E], k [..., Tk, E], "
        "v [..., Tk, Ev] with equal batch/head dims (rank 2 or more; GQA repeats k/v heads "
        "first). scale absent means 1/sqrt(E). causal=true keeps key j for query i only where "
        "j <= i (top-left aligned, as is_causal). The optional mask broadcasts to [..., Tq, Tk]: "
        "bool keeps true scores, a float one (q's dtype) is added; with causal=true both apply "
        "(as SDPA's CPU kernel does). Two results: out [..., Tq, Ev] and lse [..., Tq], the "
        "natural-log logsumexp of each row's scaled, masked scores (f32 for f16/bf16/f32 "
        "inputs, f64 for f64), which attention_grad reads. A row whose scores are all dropped "
        "gives out 0 (as SDPA) and lse 0 (as the flash kernel). Torch: "
        "aten._scaled_dot_product_flash_attention_for_cpu for q and v of one head size (other "
        "ranks reshaped to 4-d, a bool mask made additive), else the same formula in torch ops. "
        "Cost: 2 * P * (E + Ev) + 5 * P FLOPs, P = B*Tq*Tk (B: batch x heads) the (query, key) "
        "pairs, or with causal=true those of the 128-square tiles on and below the diagonal (a "
        "flash kernel skips the tiles above it: about half). causal_cp (absent by default) prices "
        "the mask as context parallelism's balanced causal mask over that many ranks (queries: "
        "chunks r and 2*cp-1-r of 2*cp equal chunks of the Tk = cp*Tq keys): P is then the "
        "slowest rank's pairs, each query chunk against the keys up to it in 128-square tiles; "
        "the semantics ignore it (the mask says what is kept).",
))


# --- masked_softmax ----------------------------------------------------------------------------
#
# The softmax of attention scores with their scale and mask in one pass, as Megatron-LM's
# fused scale-mask-softmax kernels compute it: the scores are read once and the probabilities
# written once, where scale, mask and softmax as separate ops read and write the [.., Tq, Tk]
# scores three times. Its backward (masked_softmax_grad in backward.py) needs only dy and the
# probabilities: a dropped score has probability 0 and so gradient 0.

def _masked_softmax_infer(ts, attrs):
    x = ts[0]
    _require_float("masked_softmax", x, "scores x")
    need = 2 if attrs["causal"] else 1
    if x.rank < need:
        raise TypeRuleError(f"masked_softmax: the scores x {x} must have rank {need} or more "
                            f"({'[..., Tq, Tk] with causal=true' if need == 2 else '[..., Tk]'})")
    if len(ts) > 1:
        m = ts[1]
        if not (m.dtype.is_bool or m.dtype == x.dtype):
            raise TypeRuleError(f"masked_softmax: the mask {m} must be bool (true keeps a score) or have the "
                                f"scores' dtype {x.dtype} (added to the scaled scores); cast it")
        ok = m.rank <= x.rank and all(a in (1, b) for a, b in zip(reversed(m.shape), reversed(x.shape)))
        if not ok:
            raise TypeRuleError(f"masked_softmax: the mask {m} does not broadcast to the scores {x}; each "
                                f"dim must be 1 or equal")
    return x


def _np_masked_softmax(args, attrs):
    x = args[0].astype(np.float64)
    s = x * attrs["scale"]
    if attrs["causal"]:
        s = np.where(np.tril(np.ones(s.shape[-2:], dtype=bool)), s, -np.inf)
    if len(args) > 1:
        m = args[1]
        s = np.where(m, s, -np.inf) if m.dtype == np.bool_ else s + m.astype(np.float64)
    if s.shape[-1] == 0:
        return s
    top = np.max(s, axis=-1, keepdims=True)
    top = np.where(top == -np.inf, 0.0, top)  # a row with every score dropped gives 0
    e = np.exp(s - top)
    total = np.sum(e, axis=-1, keepdims=True)
    return e / np.where(total == 0.0, 1.0, total)


def _torch_masked_softmax(args, attrs):
    x = args[0]
    if x.shape[-1] == 0 or x.numel() == 0:
        return x.clone()
    ct = attention_compute_dtype(x)
    s = x.to(ct) * attrs["scale"]
    if attrs["causal"]:
        keep = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    if len(args) > 1:
        m = args[1]
        s = s.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else s + m.to(ct)
    top = s.amax(-1, keepdim=True)
    top = top.masked_fill(top == float("-inf"), 0.0)
    e = torch.exp(s - top)
    total = e.sum(-1, keepdim=True)
    return (e / total.masked_fill(total == 0, 1.0)).to(x.dtype)


register(OpDef(
    name="masked_softmax", operands=("x", "mask?"),
    attrs=(AttrSpec("scale", "float", 1.0), AttrSpec("causal", "bool", False)),
    infer=_masked_softmax_infer, reference=_np_masked_softmax, torch=_torch_masked_softmax,
    cost=_io_cost(6),
    doc="softmax(x * scale + mask) along the last axis, in one pass over the scores, as "
        "Megatron-LM's fused scale-mask-softmax kernels: causal=true drops key j for query i "
        "where j > i (top-left aligned over the last two dims, as attention's causal); the "
        "optional mask broadcasts to x: bool keeps true scores, a float one (x's dtype) is "
        "added. A row whose scores are all dropped gives 0 (as attention). f16/bf16 compute "
        "in f32 and round once. Cost: 6 FLOPs per element (scale, max, sub, exp, sum, div), "
        "the scores read once and the probabilities written once.",
))
