"""Backward ops: the gradients of the heavy forward ops, each one fused op.

Reverse-mode autodiff emits these so that a training step on the torch executor runs the
same ATen backward kernels that ``torch.autograd`` runs (``threshold_backward``,
``convolution_backward``, ``native_layer_norm_backward``, ...), not chains of elementwise
ops. Each record takes its forward record's attributes (``nn.py``, ``shape.py``) with the
same names and meaning, and checks them with the forward's own type rule where it can, so
a vjp rule passes the forward node's attributes on unchanged. conv2d_grad and the pool
grads also serve the 3-d forward ops (the input's rank decides); their geometry attributes
default to "none" for any rank instead of the 2-d forward's [0, 0] / [1, 1]. Operand order is fixed: the upstream gradient first, then what the backward
kernel reads (the forward's input or output, as each op's doc says).

The NumPy references are the oracle: plain formulas (``np.add.at`` for the scatters),
f16/bf16 computed in f32 and rounded once by the interpreter, as in the forward families.
``scatter_add``, ``index_add`` and ``sign`` are ordinary ops that gradients need (of
``gather``, ``index_select`` and ``abs``).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from ..ir.diagnostics import ExecutionError, TypeRuleError
from ..ir.types import TensorType
from ._lazy import F, torch
from .elementwise import _unary, np_erf, np_sigmoid
from .nn import (attention_compute_dtype, attention_scale, flash_kernel_args, flash_kernel_applies, masked_attention_pairs,
                 np_attention_scores, torch_attention_scores, ce_padded_classes)
from .numeric import compute_np
from .registry import OPS, AttrSpec, Cost, OpDef, normalize_axes, normalize_axis, register


def _shape(s) -> str:
    return "[" + ",".join(map(str, s)) + "]"


def _require_float(op: str, t: TensorType, what: str) -> None:
    if not t.dtype.is_float:
        raise TypeRuleError(f"{op}: {what} must have a floating-point dtype, got {t}; cast it to f32 first")


def _require_like(op: str, ref: TensorType, ref_what: str, t: TensorType, what: str) -> None:
    """``t`` must have exactly ``ref``'s shape and dtype (gradients do not broadcast)."""
    if t.shape != ref.shape:
        raise TypeRuleError(f"{op}: {what} {t} must have the shape of {ref_what} {ref} "
                            f"(a gradient has the shape of the value it belongs to)")
    if t.dtype != ref.dtype:
        raise TypeRuleError(f"{op}: {what} has dtype {t.dtype} but {ref_what} has {ref.dtype}; "
                            f"cast {what} to {ref.dtype}")


def _io_cost(flops_per_elem: int):
    """``flops_per_elem`` per element of the first operand; operands read, results written once."""
    def cost(ins: list[TensorType], outs: list[TensorType], attrs: dict) -> Cost:
        return Cost(flops_per_elem * ins[0].numel, sum(t.nbytes for t in ins), sum(t.nbytes for t in outs))
    return cost


def _forward_result(op: str, forward: str, ts: list[TensorType], attrs: dict) -> tuple[TensorType, ...]:
    """The forward op's result types for ``ts``, with its type errors renamed to ``op``: the
    backward accepts exactly what the forward accepts."""
    fwd = OPS[forward]
    try:
        return fwd.infer_types(ts, fwd.normalize_attrs(attrs))
    except TypeRuleError as e:
        raise TypeRuleError(f"{op}: {str(e).removeprefix(forward + ': ')} (as for the forward {forward})") from None


# --- elementwise activation gradients ---------------------------------------------------------

def _act_grad(name: str, second: str, np_fn, torch_fn, doc: str, flops: int, attrs=()) -> OpDef:
    def infer(ts, a):
        dy, other = ts
        _require_float(name, dy, "dy")
        _require_like(name, dy, "dy", other, second)
        return dy

    def reference(args, a):
        return np_fn(compute_np(args[0]), compute_np(args[1]), a)

    def torch_impl(args, a):
        return torch_fn(args[0], args[1], a)

    return register(OpDef(name=name, operands=("dy", second), attrs=tuple(attrs), infer=infer,
                          reference=reference, torch=torch_impl, cost=_io_cost(flops), doc=doc,
                          elementwise=True))


def _np_silu_grad(dy, x, a):
    s = np_sigmoid(x)
    return dy * s * (1.0 + x * (1.0 - s))


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _np_gelu_grad(dy, x, a):
    if a["approximate"] == "tanh":
        inner = _SQRT_2_OVER_PI * (x + 0.044715 * x ** 3)
        t = np.tanh(inner)
        dinner = _SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * x * x)
        return dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * dinner)
    cdf = 0.5 * (1.0 + np_erf(x / np.asarray(math.sqrt(2.0), x.dtype)))
    pdf = np.exp(-0.5 * x * x) / np.asarray(math.sqrt(2.0 * math.pi), x.dtype)
    return dy * (cdf + x * pdf)


_act_grad("relu_grad", "y", lambda dy, y, a: np.where(y > 0, dy, np.zeros((), dy.dtype)),
          lambda dy, y, a: torch.ops.aten.threshold_backward(dy, y, 0),
          "dx of relu from dy and the forward output y (or input x: same sign): dy where y > 0, "
          "else 0 (aten.threshold_backward). Cost: 1 FLOP per element.", 1)
_act_grad("sigmoid_grad", "y", lambda dy, y, a: dy * y * (1.0 - y),
          lambda dy, y, a: torch.ops.aten.sigmoid_backward(dy, y),
          "dx of sigmoid from dy and the forward output y: dy * y * (1 - y) "
          "(aten.sigmoid_backward). Cost: 3 FLOPs per element.", 3)
_act_grad("tanh_grad", "y", lambda dy, y, a: dy * (1.0 - y * y),
          lambda dy, y, a: torch.ops.aten.tanh_backward(dy, y),
          "dx of tanh from dy and the forward output y: dy * (1 - y * y) (aten.tanh_backward). "
          "Cost: 3 FLOPs per element.", 3)
_act_grad("silu_grad", "x", _np_silu_grad,
          lambda dy, x, a: torch.ops.aten.silu_backward(dy, x),
          "dx of silu from dy and the forward input x: dy * s * (1 + x * (1 - s)) with "
          "s = sigmoid(x) (aten.silu_backward). Cost: 8 FLOPs per element.", 8)
_act_grad("gelu_grad", "x", _np_gelu_grad,
          lambda dy, x, a: torch.ops.aten.gelu_backward(dy, x, approximate=a["approximate"]),
          "dx of gelu from dy and the forward input x, for the exact (erf) form or "
          "approximate='tanh' as the forward gelu (aten.gelu_backward). Cost: 12 FLOPs per element.",
          12, attrs=(AttrSpec("approximate", "str", "none", choices=("none", "tanh")),))

def _np_sign(x, a):
    # PyTorch's sign (and so abs's gradient) maps NaN to 0; NumPy's keeps NaN.
    s = np.sign(x)
    return np.where(np.isnan(s), np.zeros((), s.dtype), s) if s.dtype.kind == "f" else s


_unary("sign", _np_sign, lambda x, a: torch.sign(x), "numeric",
       "-1, 0 or 1 by the sign of x; NaN gives 0, as in PyTorch. The gradient of abs is dy * sign(x)",
       idempotent=True)


# --- softmax and log_softmax -------------------------------------------------------------------

def _softmax_grad_infer(name: str):
    def infer(ts, a):
        dy, y = ts
        _require_float(name, dy, "dy")
        _require_like(name, dy, "dy", y, "y")
        normalize_axis(a["axis"], max(dy.rank, 1), name)
        return dy
    return infer


def _np_softmax_grad(args, a):
    dy, y = compute_np(args[0]), compute_np(args[1])
    if dy.ndim == 0:
        return dy * y * (1.0 - y)  # one class: y is 1 (or NaN), the gradient 0 (or NaN)
    return y * (dy - np.sum(dy * y, axis=a["axis"], keepdims=True))


def _np_log_softmax_grad(args, a):
    dy, y = compute_np(args[0]), compute_np(args[1])
    if dy.ndim == 0:
        return dy - np.exp(y) * dy
    return dy - np.exp(y) * np.sum(dy, axis=a["axis"], keepdims=True)


register(OpDef(
    name="softmax_grad", operands=("dy", "y"), attrs=(AttrSpec("axis", "int", -1),),
    infer=_softmax_grad_infer("softmax_grad"), reference=_np_softmax_grad,
    torch=lambda args, a: torch.ops.aten._softmax_backward_data(args[0], args[1], a["axis"], args[0].dtype),
    cost=_io_cost(4),
    doc="dx of softmax along axis from dy and the forward output y: y * (dy - sum(dy * y)) "
        "(aten._softmax_backward_data). Cost: 4 FLOPs per element.",
))

register(OpDef(
    name="log_softmax_grad", operands=("dy", "y"), attrs=(AttrSpec("axis", "int", -1),),
    infer=_softmax_grad_infer("log_softmax_grad"), reference=_np_log_softmax_grad,
    torch=lambda args, a: torch.ops.aten._log_softmax_backward_data(args[0], args[1], a["axis"], args[0].dtype),
    cost=_io_cost(4),
    doc="dx of log_softmax along axis from dy and the forward output y: dy - exp(y) * sum(dy) "
        "(aten._log_softmax_backward_data). Cost: 4 FLOPs per element.",
))


def _masked_softmax_grad_infer(ts, a):
    dy, y = ts
    _require_float("masked_softmax_grad", dy, "dy")
    _require_like("masked_softmax_grad", dy, "dy", y, "y")
    if dy.rank < 1:
        raise TypeRuleError(f"masked_softmax_grad: dy {dy} must have rank 1 or more ([..., Tk])")
    return dy


def _np_masked_softmax_grad(args, a):
    dy, y = compute_np(args[0]), compute_np(args[1])
    return a["scale"] * y * (dy - np.sum(dy * y, axis=-1, keepdims=True))


def _torch_masked_softmax_grad(args, a):
    dy, y = args
    ct = attention_compute_dtype(dy)
    dx = torch.ops.aten._softmax_backward_data(dy.to(ct), y.to(ct), -1, ct)
    return (dx * a["scale"]).to(dy.dtype)


register(OpDef(
    name="masked_softmax_grad", operands=("dy", "y"),
    attrs=(AttrSpec("scale", "float", 1.0), AttrSpec("causal", "bool", False)),
    infer=_masked_softmax_grad_infer, reference=_np_masked_softmax_grad, torch=_torch_masked_softmax_grad,
    cost=_io_cost(5),
    doc="dx of masked_softmax from dy and its output y: scale * y * (dy - sum(dy * y)) along "
        "the last axis, one pass (a dropped score has y = 0, so dx = 0 there; the mask is not "
        "read). causal is the forward's, kept for the record. f16/bf16 compute in f32. "
        "Cost: 5 FLOPs per element.",
))


# --- layer_norm and rms_norm --------------------------------------------------------------------

def _norm_axes(name: str, x: TensorType, axes) -> tuple[int, ...]:
    if len(axes) == 0:
        raise TypeRuleError(f"{name}: attribute 'axes' must name at least one axis (e.g. [-1])")
    return normalize_axes(axes, x.rank, name)


def _norm_grad_infer(name: str, n_results: int):
    def infer(ts, a):
        dy, x = ts[0], ts[1]
        _require_float(name, x, "the input x")
        _require_like(name, x, "the input x", dy, "dy")
        axes = _norm_axes(name, x, a["axes"])
        nshape = tuple(x.shape[i] for i in axes)
        if len(ts) > 2:
            w = ts[2]
            if w.shape != nshape:
                raise TypeRuleError(f"{name}: the weight {w} must have the normalized shape {_shape(nshape)} "
                                    f"(the input {x} over axes {list(axes)})")
            if w.dtype != x.dtype:
                raise TypeRuleError(f"{name}: the weight has dtype {w.dtype} but the input has {x.dtype}; "
                                    f"cast the weight to {x.dtype}")
        return [x] + [TensorType(nshape, x.dtype)] * (n_results - 1)
    return infer


def _param_view(x: np.ndarray, axes: tuple[int, ...], p: np.ndarray) -> np.ndarray:
    """A parameter of the normalized shape reshaped to broadcast against ``x``."""
    shape = [1] * x.ndim
    for i in axes:
        shape[i] = x.shape[i]
    return p.reshape(shape)


def _outer_axes(ndim: int, axes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(i for i in range(ndim) if i not in axes)


def _np_layer_norm_grad(args, a):
    dy, x = compute_np(args[0]), compute_np(args[1])
    axes = normalize_axes(a["axes"], x.ndim, "layer_norm_grad")
    mean = np.mean(x, axis=axes, keepdims=True)
    d = x - mean
    rstd = 1.0 / np.sqrt(np.mean(d * d, axis=axes, keepdims=True) + np.asarray(a["eps"], x.dtype))
    xhat = d * rstd
    g = dy * _param_view(x, axes, compute_np(args[2])) if len(args) > 2 else dy
    dx = rstd * (g - np.mean(g, axis=axes, keepdims=True) - xhat * np.mean(g * xhat, axis=axes, keepdims=True))
    outer = _outer_axes(x.ndim, axes)
    return dx, np.sum(dy * xhat, axis=outer), np.sum(dy, axis=outer)


def _move_last(t, axes: tuple[int, ...]):
    """``t`` with ``axes`` moved (in order) to the end, and the permutation that undoes it."""
    perm = _outer_axes(t.dim(), axes) + axes
    return t.permute(perm), tuple(sorted(range(len(perm)), key=perm.__getitem__))


def _torch_layer_norm_grad(args, a):
    dy, x = args[0], args[1]
    axes = normalize_axes(a["axes"], x.dim(), "layer_norm_grad")
    trailing = axes == tuple(range(x.dim() - len(axes), x.dim()))
    undo = None
    if not trailing:
        # The ATen kernel normalizes over trailing dims only; a permuted view feeds it the
        # same numbers (it makes its operands contiguous itself).
        dy, _ = _move_last(dy, axes)
        x, undo = _move_last(x, axes)
    k = len(axes)
    nshape = list(x.shape[x.dim() - k:])
    # The statistics the forward kernel saves for autograd, from that same kernel: one fused
    # pass, several times faster than var_mean and rsqrt, and the same numbers eager uses.
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, nshape, None, None, a["eps"])
    w = args[2] if len(args) > 2 else torch.ones(nshape, dtype=x.dtype, device=x.device)
    # The kernel reads the bias only to allocate dbias (it fails on None); the weight has
    # the same shape, dtype and device.
    dx, dw, db = torch.ops.aten.native_layer_norm_backward(dy, x, nshape, mean, rstd, w, w, [True, True, True])
    if undo is not None:
        dx = dx.permute(undo)
    return dx, dw, db


register(OpDef(
    name="layer_norm_grad", operands=("dy", "x", "weight?"),
    attrs=(AttrSpec("axes", "ints", (-1,)), AttrSpec("eps", "float", 1e-5)),
    infer=_norm_grad_infer("layer_norm_grad", 3), reference=_np_layer_norm_grad, torch=_torch_layer_norm_grad,
    cost=_io_cost(10),
    doc="gradients of layer_norm (axes, eps as the forward) from dy and the forward input x: "
        "three results dx, dweight, dbias; dweight and dbias have the normalized shape (x's "
        "sizes at axes, in axis order) and are computed even without a weight operand (as if "
        "it were ones). The axes need not be trailing. Torch: aten.native_layer_norm_backward "
        "with the mean and rstd recomputed from x (non-trailing axes are permuted last). "
        "Cost: 10 FLOPs per element.",
))


def _np_rms_norm_grad(args, a):
    dy, x = compute_np(args[0]), compute_np(args[1])
    axes = normalize_axes(a["axes"], x.ndim, "rms_norm_grad")
    eps = np.finfo(x.dtype).eps if a["eps"] is None else a["eps"]  # x is f32 or f64 here
    rstd = 1.0 / np.sqrt(np.mean(x * x, axis=axes, keepdims=True) + np.asarray(eps, x.dtype))
    xhat = x * rstd
    g = dy * _param_view(x, axes, compute_np(args[2])) if len(args) > 2 else dy
    dx = rstd * (g - xhat * np.mean(g * xhat, axis=axes, keepdims=True))
    return dx, np.sum(dy * xhat, axis=_outer_axes(x.ndim, axes))


def _torch_rms_norm_grad(args, a):
    # aten._fused_rms_norm_backward has no CPU kernel in the torch this runs on, and eager
    # autograd of F.rms_norm on CPU is itself this elementwise composition.
    dy, x = args[0], args[1]
    axes = list(normalize_axes(a["axes"], x.dim(), "rms_norm_grad"))
    out_dtype = x.dtype
    if x.dtype in (torch.float16, torch.bfloat16):
        dy, x = dy.float(), x.float()
    eps = torch.finfo(x.dtype).eps if a["eps"] is None else a["eps"]
    rstd = torch.rsqrt(torch.mean(x * x, dim=axes, keepdim=True) + eps)
    xhat = x * rstd
    g = dy
    if len(args) > 2:
        shape = [1] * x.dim()
        for i in axes:
            shape[i] = x.shape[i]
        g = dy * args[2].to(x.dtype).reshape(shape)
    dx = rstd * (g - xhat * torch.mean(g * xhat, dim=axes, keepdim=True))
    outer = [i for i in range(x.dim()) if i not in axes]
    dw = torch.sum(dy * xhat, dim=outer) if outer else dy * xhat
    return dx.to(out_dtype), dw.to(out_dtype)


register(OpDef(
    name="rms_norm_grad", operands=("dy", "x", "weight?"),
    attrs=(AttrSpec("axes", "ints", (-1,)), AttrSpec("eps", "float", None)),
    infer=_norm_grad_infer("rms_norm_grad", 2), reference=_np_rms_norm_grad, torch=_torch_rms_norm_grad,
    cost=_io_cost(8),
    doc="gradients of rms_norm (axes, eps as the forward; eps absent is the machine epsilon of "
        "the computation dtype) from dy and the forward input x: two results dx and dweight "
        "(the normalized shape, computed even without a weight operand). The axes need not "
        "be trailing. Torch: one formula with rstd recomputed (no CPU backward kernel exists). "
        "Cost: 8 FLOPs per element.",
))


# --- batch_norm (training) -------------------------------------------------------------------------

def _batch_norm_grad_infer(ts, a):
    dy, x, w, *stats = ts
    op = "batch_norm_grad"
    if a["training"] == bool(stats):
        raise TypeRuleError(f"{op}: training={str(a['training']).lower()} "
                            + ("takes no running statistics (it uses the batch's)" if stats else
                               "needs running_mean and running_var operands"))
    for name, t in zip(("running_mean", "running_var"), stats):
        if t != TensorType((x.shape[1],), x.dtype):
            raise TypeRuleError(f"{op}: {name} must be {x.dtype}[{x.shape[1]}], got {t}")
    if x.rank < 2:
        raise TypeRuleError(f"{op}: the input must be at least 2-d [N, C, ...], got {x}")
    _require_float(op, x, "the input x")
    _require_like(op, x, "the input x", dy, "dy")
    c = x.shape[1]
    if w.shape != (c,):
        raise TypeRuleError(f"{op}: the weight must have shape [{c}] (one per channel of {x}), got {w}")
    if w.dtype != x.dtype:
        raise TypeRuleError(f"{op}: the weight has dtype {w.dtype} but the input has {x.dtype}; "
                            f"cast the weight to {x.dtype}")
    if a["training"] and c and math.prod(x.shape) // c == 1:
        raise TypeRuleError(f"{op}: training needs more than 1 value per channel to compute batch "
                            f"statistics, but the input {x} has 1")
    stat = TensorType((c,), x.dtype)
    return [x, stat, stat]


def _np_batch_norm_grad(args, a):
    dy, x, w, *stats = (compute_np(t) for t in args)
    axes = (0,) + tuple(range(2, x.ndim))
    bshape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    if not a["training"]:
        # Inference form: a fixed affine map per channel.
        rm, rv = stats
        inv = (1.0 / np.sqrt(rv + np.asarray(a["eps"], x.dtype))).reshape(bshape)
        xhat = (x - rm.reshape(bshape)) * inv
        return dy * w.reshape(bshape) * inv, np.sum(dy * xhat, axis=axes), np.sum(dy, axis=axes)
    mean = np.mean(x, axis=axes, keepdims=True)
    d = x - mean
    invstd = 1.0 / np.sqrt(np.mean(d * d, axis=axes, keepdims=True) + np.asarray(a["eps"], x.dtype))
    xhat = d * invstd
    dbias = np.sum(dy, axis=axes)
    dweight = np.sum(dy * xhat, axis=axes)
    count = np.asarray(max(x.size // max(x.shape[1], 1), 1), x.dtype)
    dx = w.reshape(bshape) * invstd * (dy - dbias.reshape(bshape) / count - xhat * dweight.reshape(bshape) / count)
    return dx, dweight, dbias


def _torch_batch_norm_grad(args, a):
    dy, x, w, *stats = args
    if not a["training"]:
        return torch.ops.aten.native_batch_norm_backward(dy, x, w, stats[0], stats[1], None, None, False,
                                                         a["eps"], [True, True, True])
    dims = [0] + list(range(2, x.dim()))
    var, mean = torch.var_mean(x, dim=dims, unbiased=False)
    invstd = torch.rsqrt(var + a["eps"])
    return torch.ops.aten.native_batch_norm_backward(dy, x, w, None, None, mean, invstd, True, a["eps"],
                                                     [True, True, True])


register(OpDef(
    name="batch_norm_grad", operands=("dy", "x", "weight", "running_mean?", "running_var?"),
    attrs=(AttrSpec("eps", "float", 1e-5), AttrSpec("training", "bool", True)),
    infer=_batch_norm_grad_infer, reference=_np_batch_norm_grad, torch=_torch_batch_norm_grad,
    cost=_io_cost(8),
    doc="gradients of a training batch_norm (batch statistics, channels on axis 1) from dy, "
        "the forward input x and the weight: three results dx, dweight [C], dbias [C] "
        "(aten.native_batch_norm_backward with train=true and the batch mean and invstd "
        "recomputed). training=false: the gradients of the inference form, which normalizes "
        "with the running_mean and running_var operands. Cost: 8 FLOPs per element.",
))


# --- convolution -------------------------------------------------------------------------------------

def _conv_params(op: str, a: dict, nsp: int) -> tuple[tuple[int, ...], ...]:
    """stride, padding, dilation, each with one value per spatial dim: omitted means no
    striding, padding or dilation whatever the rank, and one value applies to every dim."""
    out = []
    for name, lo in (("stride", 1), ("padding", 0), ("dilation", 1)):
        v = a[name]
        if v is None:
            v = (lo,)
        if len(v) == 1:
            v = v * nsp
        if len(v) != nsp:
            raise TypeRuleError(f"{op}: attribute '{name}' must have {nsp} integer(s) (one per spatial dim of "
                                f"a {nsp}-d convolution) or 1, got {list(v)}")
        if min(v) < lo:
            raise TypeRuleError(f"{op}: attribute '{name}' must be >= {lo} in each dimension, got {list(v)}")
        out.append(tuple(v))
    return tuple(out)


def _conv_grad_infer(ts, a):
    op = "conv2d_grad"
    dy, x, w = ts
    if w.rank not in (3, 4, 5):
        raise TypeRuleError(f"{op}: the weight must be 3-d, 4-d or 5-d [out_channels, in_channels/groups, "
                            f"k...] (a 1-, 2- or 3-d convolution), got {w}")
    nsp = w.rank - 2
    if x.rank != w.rank:
        raise TypeRuleError(f"{op}: the input {x} must have rank {w.rank} [N, C, {nsp} spatial dims] to "
                            f"match the weight {w}")
    _require_float(op, x, "the input x")
    if w.dtype != x.dtype:
        raise TypeRuleError(f"{op}: the weight has dtype {w.dtype} but the input has {x.dtype}; "
                            f"cast the weight to {x.dtype}")
    (s, p, d) = _conv_params(op, a, nsp)
    if len(a["mask"]) != 3 or any(m not in (0, 1) for m in a["mask"]):
        raise TypeRuleError(f"{op}: mask must be three 0/1 flags for dx, dweight, dbias, got {list(a['mask'])}")
    g = a["groups"]
    if g < 1:
        raise TypeRuleError(f"{op}: attribute 'groups' must be >= 1, got {g}")
    n, c = x.shape[:2]
    o, cg = w.shape[:2]
    if o % g:
        raise TypeRuleError(f"{op}: the weight's {o} output channels are not divisible by groups={g}")
    if cg * g != c:
        raise TypeRuleError(f"{op}: channel mismatch: the input {x} has {c} channels, so with groups={g} the "
                            f"weight must have {c // g if c % g == 0 else c / g} input channels per group "
                            f"(dim 1), but the weight {w} has {cg}")
    out = tuple((x.shape[2 + i] + 2 * p[i] - d[i] * (w.shape[2 + i] - 1) - 1) // s[i] + 1 for i in range(nsp))
    if min(out) < 1:
        raise TypeRuleError(f"{op}: the kernel {_shape(w.shape[2:])} (dilation {list(d)}) is larger than the "
                            f"padded input of {x}; the output would be {_shape(out)}")
    want = TensorType((n, o) + out, x.dtype)
    _require_like(op, want, "the convolution's output", dy, "dy")
    return [x, w, TensorType((o,), x.dtype)]


def _tap_slices(tap, s, d, out) -> tuple[slice, ...]:
    """For one kernel tap, the strided slice of the padded input that each output reads."""
    return tuple(slice(t * di, t * di + si * (oi - 1) + 1, si) for t, si, di, oi in zip(tap, s, d, out))


def _np_conv_grad(args, a):
    dy, x, w = (compute_np(t) for t in args)
    nsp = w.ndim - 2
    s, p, d = _conv_params("conv2d_grad", a, nsp)
    g = a["groups"]
    n, c = x.shape[:2]
    o, cg = w.shape[:2]
    out = dy.shape[2:]
    xp = np.pad(x, ((0, 0), (0, 0)) + tuple((pi, pi) for pi in p))
    dxp = np.zeros_like(xp)
    dw = np.zeros_like(w).reshape((g, o // g, cg) + w.shape[2:])
    dyg = dy.reshape((n, g, o // g) + out)
    wg = w.reshape((g, o // g, cg) + w.shape[2:])
    sp = "".join("hwd"[:nsp])
    # One pass per kernel tap: each tap is a strided window of the padded input.
    for tap in itertools.product(*(range(k) for k in w.shape[2:])):
        sl = (slice(None), slice(None)) + _tap_slices(tap, s, d, out)
        xs = xp[sl].reshape((n, g, cg) + out)
        dw[(slice(None),) * 3 + tap] = np.einsum(f"ngo{sp},ngc{sp}->goc", dyg, xs)
        dxp[sl] += np.einsum(f"ngo{sp},goc->ngc{sp}", dyg, wg[(slice(None),) * 3 + tap]).reshape((n, c) + out)
    crop = (slice(None), slice(None)) + tuple(slice(pi, pi + xi) for pi, xi in zip(p, x.shape[2:]))
    res = (dxp[crop], dw.reshape(w.shape), np.sum(dy, axis=(0,) + tuple(range(2, dy.ndim))))
    return tuple(r if m else np.zeros_like(r) for r, m in zip(res, a["mask"]))


def _torch_conv_grad(args, a):
    dy, x, w = args
    nsp = w.dim() - 2
    s, p, d = _conv_params("conv2d_grad", a, nsp)
    mask = [bool(m) for m in a["mask"]]
    res = torch.ops.aten.convolution_backward(dy, x, w, [w.shape[0]], list(s), list(p), list(d), False,
                                              [0] * nsp, a["groups"], mask)
    # A result left out by the mask is zeros: a broadcast view, so nothing is allocated.
    shapes = (x.shape, w.shape, (w.shape[0],))
    return tuple(r if m else dy.new_zeros(()).expand(shape) for r, m, shape in zip(res, mask, shapes))


def _conv_grad_cost(ins, outs, attrs):
    dy, _, w = ins
    # dx and dweight each cost as much as the forward convolution.
    fwd = 2 * dy.numel * math.prod(w.shape[1:])
    return Cost(2 * fwd + dy.numel, sum(t.nbytes for t in ins), sum(t.nbytes for t in outs))


register(OpDef(
    name="conv2d_grad", operands=("dy", "x", "weight"),
    # Omitted geometry defaults to the identity for any rank, so one record serves the 1-,
    # 2- and 3-d forward convolutions.
    attrs=(AttrSpec("stride", "ints", None), AttrSpec("padding", "ints", None),
           AttrSpec("dilation", "ints", None), AttrSpec("groups", "int", 1),
           AttrSpec("mask", "ints", (1, 1, 1))),
    infer=_conv_grad_infer, reference=_np_conv_grad, torch=_torch_conv_grad, cost=_conv_grad_cost,
    doc="gradients of conv2d (stride, padding, dilation, groups as the forward) from dy, the "
        "forward input x and the weight: three results dx, dweight and dbias [O] (the "
        "gradient of the bias whether or not the forward had one). The weight's rank picks "
        "a 1-, 2- or 3-d convolution (weight [O, C/groups, k...]); stride, padding and "
        "dilation then take one value per spatial dim or one for all (omitted: 1, 0 and 1 in "
        "every dim). mask (default [1, 1, 1]) says which of dx, dweight, dbias to compute; the "
        "others are zeros (the gradient of a network's first convolution needs no dx). Torch: "
        "aten.convolution_backward. Cost: twice the forward convolution's FLOPs plus the bias sum.",
))


# --- pooling ------------------------------------------------------------------------------------------
#
# One record per pool kind serves 2-d and 3-d pools: the input's rank picks the forward
# record (max_pool2d or max_pool3d, ...), whose type rule the backward reuses, so the two
# accept exactly the same attributes. Omitted padding and dilation mean none in every dim.

def _pool_forward(name: str, kind: str, x: TensorType) -> str:
    if x.rank not in (4, 5):
        raise TypeRuleError(f"{name}: the input x must be 4-d [N, C, H, W] (a 2-d pool) or 5-d "
                            f"[N, C, D, H, W] (a 3-d pool), got {x}")
    return f"{kind}{x.rank - 2}d"


def _pool_params(x_shape, a: dict):
    """Kernel, stride, padding and dilation of a pool over ``x_shape``, one value per spatial dim."""
    nd = len(x_shape) - 2
    k = tuple(a["kernel"])
    s = k if a["stride"] is None else tuple(a["stride"])
    p = (0,) * nd if a["padding"] is None else tuple(a["padding"])
    d = (1,) * nd if a["dilation"] is None else tuple(a["dilation"])
    return k, s, p, d


def _pool_grad_infer(name: str, kind: str):
    def infer(ts, a):
        dy, x, *indices = ts
        _require_float(name, x, "the input x")
        if indices and (indices[0].shape != dy.shape or not indices[0].dtype.is_int):
            raise TypeRuleError(f"{name}: the indices must be integers shaped like dy {dy} (the forward's "
                                f"max_pool*_with_indices result), got {indices[0]}")
        forward = _pool_forward(name, kind, x)
        nd = x.rank - 2
        fwd = dict(a, padding=(0,) * nd if a["padding"] is None else a["padding"],
                   dilation=(1,) * nd if a["dilation"] is None else a["dilation"])
        (want,) = _forward_result(name, forward, [x], fwd)
        _require_like(name, want, f"the {forward} output", dy, "dy")
        return x
    return infer


def _tap_coords(out, k, s, p, d):
    """Per spatial dim, broadcastable to [*out, *k]: each window tap's input coordinate."""
    nd = len(out)
    coords = []
    for i in range(nd):
        c = (np.arange(out[i]) * s[i] - p[i])[:, None] + (np.arange(k[i]) * d[i])[None, :]
        shape = [1] * (2 * nd)
        shape[i], shape[nd + i] = c.shape
        coords.append(c.reshape(shape))
    return coords


def _np_max_pool_grad(args, a):
    dy, x = compute_np(args[0]), compute_np(args[1])
    if len(args) > 2:
        # The forward's own argmax per window (flat within each N, C plane).
        nc = x.shape[0] * x.shape[1]
        dx = np.zeros((nc, math.prod(x.shape[2:])), dy.dtype)
        np.add.at(dx, (np.arange(nc)[:, None], args[2].reshape(nc, -1).astype(np.int64)), dy.reshape(nc, -1))
        return dx.reshape(x.shape)
    k, s, p, d = _pool_params(x.shape, a)
    size, out = x.shape[2:], dy.shape[2:]
    valid = np.ones((), bool)
    flat = np.zeros((), np.int64)
    for i, c in enumerate(_tap_coords(out, k, s, p, d)):
        valid = valid & (c >= 0) & (c < size[i])
        flat = flat * size[i] + np.clip(c, 0, size[i] - 1)
    valid = np.broadcast_to(valid, out + k).reshape(out + (-1,))
    flat = np.broadcast_to(flat, out + k).reshape(out + (-1,))  # [*out, taps]
    nc, plane = x.shape[0] * x.shape[1], math.prod(size)
    vals = np.where(valid, x.reshape(nc, plane)[:, flat], -np.inf)  # [NC, *out, taps]
    # As the ATen kernel: the first tap above the running max wins (the first maximum in
    # row-major window order), a NaN always takes over (so the last NaN wins), and a window
    # of -inf keeps its first in-bounds tap.
    pick = np.argmax(vals, axis=-1)
    first_valid = np.broadcast_to(np.argmax(valid, axis=-1), pick.shape)
    pick = np.where(np.max(vals, axis=-1) == -np.inf, first_valid, pick)
    nan = np.isnan(vals)
    last_nan = vals.shape[-1] - 1 - np.argmax(nan[..., ::-1], axis=-1)
    pick = np.where(nan.any(axis=-1), last_nan, pick)
    target = np.take_along_axis(np.broadcast_to(flat, vals.shape), pick[..., None], axis=-1)[..., 0]
    dx = np.zeros((nc, plane), dy.dtype)
    np.add.at(dx, (np.arange(nc)[:, None], target.reshape(nc, -1)), dy.reshape(nc, -1))
    return dx.reshape(x.shape)


def _torch_max_pool_grad(args, a):
    dy, x, *given = args
    nd = x.dim() - 2
    k, s, p, d = (list(v) for v in _pool_params(tuple(x.shape), a))
    aten = torch.ops.aten
    pool, back = ((aten.max_pool2d_with_indices, aten.max_pool2d_with_indices_backward) if nd == 2 else
                  (aten.max_pool3d_with_indices, aten.max_pool3d_with_indices_backward))
    idx = given[0] if given else pool(x, k, s, p, d, a["ceil_mode"])[1]
    return back(dy, x, k, s, p, d, a["ceil_mode"], idx)


def _pool_grad_cost(ins, outs, attrs):
    return Cost(ins[0].numel * math.prod(attrs["kernel"]), sum(t.nbytes for t in ins), outs[0].nbytes)


_POOL_ATTRS = (AttrSpec("kernel", "ints"), AttrSpec("stride", "ints", None), AttrSpec("padding", "ints", None),
               AttrSpec("dilation", "ints", None), AttrSpec("ceil_mode", "bool", False))

register(OpDef(
    name="max_pool2d_grad", operands=("dy", "x", "indices?"), attrs=_POOL_ATTRS,
    infer=_pool_grad_infer("max_pool2d_grad", "max_pool"), reference=_np_max_pool_grad,
    torch=_torch_max_pool_grad, cost=_pool_grad_cost,
    doc="dx of max_pool2d, or of max_pool3d for a 5-d x (attributes as the forward; padding "
        "and dilation omitted mean none), from dy and the forward input x: each window's dy "
        "goes to its argmax (the first maximum in row-major window order, as PyTorch picks "
        "it; the last NaN), accumulated where windows overlap. With the forward's indices (from "
        "max_pool*_with_indices) those are used; without, they are recomputed. Torch: "
        "aten.max_pool{2,3}d_with_indices_backward. "
        "Cost: one FLOP per window tap.",
))


def _pool_divisor(size, out, k, s, p, d, include_pad: bool) -> np.ndarray:
    """The forward avg pool's divisor per output position: the window's taps inside the
    padded input (include_pad) or inside the input alone, never fewer than 1."""
    count = np.ones((), np.int64)
    for i, c in enumerate(_tap_coords(out, k, s, p, d)):
        lo, hi = (-p[i], size[i] + p[i]) if include_pad else (0, size[i])
        count = count * ((c >= lo) & (c < hi))
    count = np.broadcast_to(count, tuple(out) + tuple(k)).reshape(tuple(out) + (-1,))
    return np.maximum(np.sum(count, axis=-1), 1)


def _np_avg_pool_grad(args, a):
    dy, x = compute_np(args[0]), compute_np(args[1])
    k, s, p, d = _pool_params(x.shape, a)
    size, out = x.shape[2:], dy.shape[2:]
    g = dy / _pool_divisor(size, out, k, s, p, d, a["count_include_pad"]).astype(dy.dtype)
    # Spread each window's share over its taps in padded coordinates; the padding (and any
    # ceil_mode overhang) is cropped away afterwards, so it receives nothing.
    padded = tuple(si + 2 * pi + (ki - 1) * di + oi * st for si, pi, ki, di, oi, st in zip(size, p, k, d, out, s))
    dxp = np.zeros(x.shape[:2] + padded, dy.dtype)
    for tap in itertools.product(*(range(ki) for ki in k)):
        dxp[(slice(None), slice(None)) + _tap_slices(tap, s, d, out)] += g
    return dxp[(slice(None), slice(None)) + tuple(slice(pi, pi + si) for pi, si in zip(p, size))]


def _torch_avg_pool_grad(args, a):
    dy, x = args
    nd = x.dim() - 2
    size, out = tuple(x.shape[2:]), tuple(dy.shape[2:])
    k, s, p, d = _pool_params(tuple(x.shape), a)
    if all(di == 1 for di in d):
        back = torch.ops.aten.avg_pool2d_backward if nd == 2 else torch.ops.aten.avg_pool3d_backward
        return back(dy, x, list(k), list(s), list(p), a["ceil_mode"], a["count_include_pad"], None)
    # PyTorch's pools have no dilation (the forward sums dilated windows with a depthwise
    # convolution of ones); its adjoint is the transposed convolution of the scaled dy.
    div = torch.as_tensor(_pool_divisor(size, out, k, s, p, d, a["count_include_pad"]), dtype=dy.dtype,
                          device=dy.device)
    n, c = x.shape[0], x.shape[1]
    g = (dy / div).reshape((n * c, 1) + out)
    ones = torch.ones((1, 1) + k, dtype=dy.dtype, device=dy.device)
    full = getattr(F, f"conv_transpose{nd}d")(g, ones, stride=s, dilation=d)
    pads: list[int] = []
    for si, pi, fi in reversed(list(zip(size, p, full.shape[2:]))):
        pads += [0, max(0, pi + si - fi)]
    full = F.pad(full, pads)
    crop = (slice(None), slice(None)) + tuple(slice(pi, pi + si) for pi, si in zip(p, size))
    return full[crop].reshape(x.shape)


register(OpDef(
    name="avg_pool2d_grad", operands=("dy", "x"),
    attrs=_POOL_ATTRS + (AttrSpec("count_include_pad", "bool", True),),
    infer=_pool_grad_infer("avg_pool2d_grad", "avg_pool"), reference=_np_avg_pool_grad,
    torch=_torch_avg_pool_grad, cost=_pool_grad_cost,
    doc="dx of avg_pool2d, or of avg_pool3d for a 5-d x (attributes as the forward; padding "
        "and dilation omitted mean none), from dy and the forward input x: each window's dy "
        "divided by the forward's divisor, spread over the window's taps inside the input. "
        "Torch: aten.avg_pool{2,3}d_backward; with dilation (which PyTorch's pools lack) a "
        "transposed convolution of ones, the adjoint of the forward's. Cost: one FLOP per "
        "window tap.",
))


# --- embedding, scatter_add, index_add ----------------------------------------------------------------

def _check_index(op: str, t: TensorType, what: str = "the index") -> None:
    if t.dtype.name not in ("i32", "i64"):
        raise TypeRuleError(f"{op}: {what} is {t}; it must be i32 or i64 (cast it to i64)")


def _check_range(op: str, idx: np.ndarray, size: int, what: str) -> None:
    if idx.size and (idx.min() < 0 or idx.max() >= size):
        bad = idx.min() if idx.min() < 0 else idx.max()
        raise ExecutionError(f"{op}: index {int(bad)} is out of range for {what} of size {size} "
                             f"(valid: 0..{size - 1})")


def _embedding_grad_infer(ts, a):
    op = "embedding_grad"
    dy, idx = ts
    _check_index(op, idx, "indices")
    _require_float(op, dy, "dy")
    v = a["num_embeddings"]
    if v < 0:
        raise TypeRuleError(f"{op}: num_embeddings must be >= 0, got {v}")
    if dy.rank != idx.rank + 1 or dy.shape[:-1] != idx.shape:
        raise TypeRuleError(f"{op}: dy {dy} must have shape indices.shape + [dim] (the embedding's output "
                            f"for the indices {idx})")
    return TensorType((v, dy.shape[-1]), dy.dtype)


def _np_embedding_grad(args, a):
    dy, idx = compute_np(args[0]), args[1]
    v = a["num_embeddings"]
    _check_range("embedding_grad", idx, v, "a table")
    out = np.zeros((v, dy.shape[-1]), dy.dtype)
    np.add.at(out, idx.reshape(-1).astype(np.int64), dy.reshape(-1, dy.shape[-1]))
    return out


register(OpDef(
    name="embedding_grad", operands=("dy", "indices"), attrs=(AttrSpec("num_embeddings", "int"),),
    infer=_embedding_grad_infer, reference=_np_embedding_grad,
    torch=lambda args, a: torch.ops.aten.embedding_dense_backward(args[0], args[1], a["num_embeddings"], -1, False),
    cost=lambda ins, outs, a: Cost(ins[0].numel, sum(t.nbytes for t in ins), outs[0].nbytes),
    pad_zeros="always", size_attrs=lambda a, outs: {**a, "num_embeddings": outs[0].shape[0]},
    doc="dtable of embedding: a [num_embeddings, dim] table of zeros with each row of dy "
        "(shape indices.shape + [dim]) added at its index (aten.embedding_dense_backward, no "
        "padding_idx). Cost: one FLOP per element of dy.",
))


def check_scatter_operands(op: str, ts, a, semantics: str) -> int:
    """The checks every torch.scatter-like op makes of (x, index, src): an integer index, x of
    rank 1 or more, all three of one rank, src of x's dtype, the index within src everywhere
    and within x outside the axis; returns the axis."""
    x, idx, src = ts
    _check_index(op, idx)
    if x.rank == 0:
        raise TypeRuleError(f"{op}: input is rank 0 ({x}); there is nothing to index")
    axis = normalize_axis(a["axis"], x.rank, op)
    if idx.rank != x.rank or src.rank != x.rank:
        raise TypeRuleError(f"{op}: the index {idx} and src {src} must have the rank of the input {x} "
                            f"({semantics} semantics)")
    if src.dtype != x.dtype:
        raise TypeRuleError(f"{op}: src has dtype {src.dtype} but the input has {x.dtype}; cast src to {x.dtype}")
    for dim in range(x.rank):
        if idx.shape[dim] > src.shape[dim]:
            raise TypeRuleError(f"{op}: the index {idx} is larger than src {src} in dim {dim}; it must not exceed src")
        if dim != axis and idx.shape[dim] > x.shape[dim]:
            raise TypeRuleError(f"{op}: the index {idx} is larger than the input {x} in dim {dim}; outside axis "
                                f"{axis} it must not exceed the input")
    return axis


def _scatter_add_infer(ts, a):
    op = "scatter_add"
    x = ts[0]
    check_scatter_operands(op, ts, a, "torch.scatter_add")
    if x.dtype.is_bool:
        raise TypeRuleError(f"{op}: the input must be numeric, got {x}")
    return x


def _np_scatter_add(args, a):
    x, idx, src = args
    axis = normalize_axis(a["axis"], x.ndim, "scatter_add")
    _check_range("scatter_add", idx, x.shape[axis], f"axis {axis}")
    out = compute_np(x).copy()
    where = list(np.indices(idx.shape, sparse=True))
    where[axis] = idx.astype(np.int64)
    crop = tuple(slice(0, n) for n in idx.shape)
    np.add.at(out, tuple(where), compute_np(src)[crop])
    return out


register(OpDef(
    name="scatter_add", operands=("x", "index", "src"), attrs=(AttrSpec("axis", "int"),),
    infer=_scatter_add_infer, reference=_np_scatter_add,
    torch=lambda args, a: torch.scatter_add(args[0], a["axis"], args[1].to(torch.int64), args[2]),
    cost=lambda ins, outs, a: Cost(ins[1].numel, sum(t.nbytes for t in ins), outs[0].nbytes),
    doc="x with src[i][j][k] added at [index[i][j][k]][j][k] for axis 0 (torch.scatter_add; the "
        "gradient of gather): index i32/i64 of the input's rank, no larger than src anywhere "
        "nor than x outside axis; out-of-range indices are run-time errors. Cost: one FLOP per "
        "index element.",
))


def _index_add_infer(ts, a):
    op = "index_add"
    x, idx, src = ts
    _check_index(op, idx)
    if idx.rank != 1:
        raise TypeRuleError(f"{op}: the index {idx} must be 1-D (use scatter_add for an index of the input's rank)")
    if x.rank == 0:
        raise TypeRuleError(f"{op}: input is rank 0 ({x}); there is nothing to index")
    axis = normalize_axis(a["axis"], x.rank, op)
    want = x.shape[:axis] + idx.shape + x.shape[axis + 1:]
    if src.shape != want:
        raise TypeRuleError(f"{op}: src {src} must have shape {_shape(want)} (the input {x} with axis {axis} "
                            f"sized by the index {idx})")
    if src.dtype != x.dtype:
        raise TypeRuleError(f"{op}: src has dtype {src.dtype} but the input has {x.dtype}; cast src to {x.dtype}")
    if x.dtype.is_bool:
        raise TypeRuleError(f"{op}: the input must be numeric, got {x}")
    return x


def _np_index_add(args, a):
    x, idx, src = args
    axis = normalize_axis(a["axis"], x.ndim, "index_add")
    _check_range("index_add", idx, x.shape[axis], f"axis {axis}")
    out = compute_np(x).copy()
    np.add.at(out, (slice(None),) * axis + (idx.astype(np.int64),), compute_np(src))
    return out


register(OpDef(
    name="index_add", operands=("x", "index", "src"), attrs=(AttrSpec("axis", "int"),),
    infer=_index_add_infer, reference=_np_index_add,
    torch=lambda args, a: torch.index_add(args[0], a["axis"], args[1], args[2]),
    cost=lambda ins, outs, a: Cost(ins[2].numel, sum(t.nbytes for t in ins), outs[0].nbytes),
    doc="x with the slices of src along axis added at the positions a 1-D i32/i64 index names "
        "(torch.index_add; the gradient of index_select); repeated indices accumulate, "
        "out-of-range ones are run-time errors. Cost: one FLOP per element of src.",
))


# --- slice_grad ----------------------------------------------------------------------------------------

def _slice_grad_infer(ts, a):
    op = "slice_grad"
    (dy,) = ts
    shape = a["shape"]
    if any(n < 0 for n in shape):
        raise TypeRuleError(f"{op}: 'shape' {list(shape)} has a negative size")
    x = TensorType(tuple(shape), dy.dtype)
    fwd = {k: a[k] for k in ("axis", "start", "end", "step")}
    (want,) = _forward_result(op, "slice", [x], fwd)
    _require_like(op, want, f"the slice of {_shape(shape)}", dy, "dy")
    return x


def _slice_index(shape, a) -> tuple[int, slice]:
    axis = normalize_axis(a["axis"], len(shape), "slice_grad")
    start, stop, step = slice(a["start"], a["end"], a["step"]).indices(shape[axis])
    return axis, slice(start, max(stop, start), step)


def _np_slice_grad(args, a):
    dy = args[0]
    shape = a["shape"]
    out = np.zeros(shape, dy.dtype)
    axis, s = _slice_index(shape, a)
    out[(slice(None),) * axis + (s,)] = dy
    return out


def _torch_slice_grad(args, a):
    shape = list(a["shape"])
    axis, s = _slice_index(shape, a)
    return torch.ops.aten.slice_backward(args[0], shape, axis, s.start, s.stop, s.step)


register(OpDef(
    name="slice_grad", operands=("dy",),
    attrs=(AttrSpec("shape", "ints"), AttrSpec("axis", "int"), AttrSpec("start", "int", 0),
           AttrSpec("end", "int", None), AttrSpec("step", "int", 1)),
    infer=_slice_grad_infer, reference=_np_slice_grad, torch=_torch_slice_grad,
    cost=lambda ins, outs, a: Cost(0, ins[0].nbytes, outs[0].nbytes),
    doc="dx of slice: zeros of 'shape' (the forward input's shape) with dy placed at "
        "x[start:end:step] along axis; axis, start, end and step as the forward slice, with "
        "its clamping and negative indices (aten.slice_backward).",
))


# --- cross_entropy_grad --------------------------------------------------------------------------------

def _ce_grad_infer(ts, a):
    op = "cross_entropy_grad"
    dloss, logits, target = ts
    (loss,) = _forward_result(op, "cross_entropy", [logits, target], a)
    _require_like(op, loss, f"the loss (reduction '{a['reduction']}')", dloss, "dloss")
    return logits


def _ce_scale(dloss, ignore, reduction: str, dtype):
    """Per-element factor of the gradient: dloss spread by the reduction, 0 where ignored."""
    if reduction == "none":
        scale = dloss
    elif reduction == "sum":
        scale = np.broadcast_to(dloss, ignore.shape)
    else:
        scale = np.broadcast_to(dloss / np.asarray(np.count_nonzero(~ignore), dtype), ignore.shape)
    return np.where(ignore, np.zeros((), dtype), scale)


def _np_cross_entropy_grad(args, a):
    dloss, logits, target = compute_np(args[0]), compute_np(args[1]), args[2]
    cdim = 1 if logits.ndim >= 2 else 0
    ncls = logits.shape[cdim]
    ignore = target == a["ignore_index"]
    bad = ~ignore & ((target < 0) | (target >= ncls))
    if bad.any():
        raise ExecutionError(f"cross_entropy_grad: target {target[bad].reshape(-1)[0]} is out of range for "
                             f"{ncls} classes (valid: 0..{ncls - 1}, or ignore_index={a['ignore_index']})")
    z = np.moveaxis(logits, cdim, -1)
    e = np.exp(z - np.max(z, axis=-1, keepdims=True))
    p = e / np.sum(e, axis=-1, keepdims=True)
    ls = a["label_smoothing"]
    onehot = np.arange(ncls) == np.where(ignore, 0, target)[..., None]
    g = p - (1.0 - ls) * onehot - ls / ncls
    g = g * _ce_scale(dloss, ignore, a["reduction"], logits.dtype)[..., None]
    return np.moveaxis(g, -1, cdim)


def _torch_cross_entropy_grad(args, a):
    dloss, logits, target = args
    cdim = 1 if logits.dim() >= 2 else 0
    ncls = logits.shape[cdim]
    ls = a["label_smoothing"]
    ignore = target == a["ignore_index"]
    # softmax makes a fresh tensor, updated in place from here on: the logits can be large
    # (tokens x vocabulary), and each extra pass or copy over them is what this op costs.
    g = torch.softmax(logits, cdim)
    if ls > 0.0:
        g.sub_(ls / ncls)
    red = a["reduction"]
    if red != "none" and dloss.dim() == 0 and g.device.type == "cpu" and not bool(ignore.any()):
        # The common case: no ignored target, one scale for every row (a Python float is
        # the cheapest multiplier there is).
        scale_f = float(dloss) / (target.numel() if red == "mean" else 1)
        g.mul_(scale_f)
        idx = target.unsqueeze(cdim)
        return g.scatter_add_(cdim, idx, torch.full(idx.shape, (ls - 1.0) * scale_f, dtype=g.dtype))
    safe = torch.where(ignore, 0, target).unsqueeze(cdim)
    if red == "mean":
        dloss = dloss / (~ignore).sum().to(dloss.dtype)
    scale = torch.where(ignore, torch.zeros((), dtype=dloss.dtype, device=dloss.device), dloss)
    scale = scale.expand(target.shape).unsqueeze(cdim).to(g.dtype)
    g.mul_(scale)
    return g.scatter_add_(cdim, safe, scale * (ls - 1.0))


register(OpDef(
    name="cross_entropy_grad", operands=("dloss", "logits", "target"),
    attrs=(AttrSpec("reduction", "str", "mean", choices=("mean", "sum", "none")),
           AttrSpec("ignore_index", "int", -100), AttrSpec("label_smoothing", "float", 0.0)),
    infer=_ce_grad_infer, reference=_np_cross_entropy_grad, torch=_torch_cross_entropy_grad,
    cost=_io_cost(6), pad_ranged=ce_padded_classes, pad_logits=1, pad_zeros="always",
    doc="dlogits of cross_entropy (attributes as the forward; classes on axis 1, or 0 for [C] "
        "logits) from dloss (a scalar for 'mean'/'sum', the target's shape for 'none'), the "
        "logits and the target: (softmax - (1 - e) * onehot - e / C) * dloss, divided by the "
        "number of targets not ignored for 'mean'; ignored targets get 0. Torch: that formula, "
        "vectorized in place on the softmax (one multiply, one scatter_add). Cost: 6 FLOPs per logit.",
))


# --- attention_grad ------------------------------------------------------------------------------------
#
# The torch side routes exactly as the forward attention does (same kernel test, same 4-d
# reshapes), so the kernel's backward only ever sees an out and lse of the kind its forward
# makes.

def _attention_grad_infer(ts, a):
    dout, q, k, v, out, lse = ts[:6]
    out_t, lse_t = _forward_result("attention_grad", "attention", [q, k, v, *ts[6:]], a)
    _require_like("attention_grad", out_t, "the forward's out", out, "out")
    _require_like("attention_grad", lse_t, "the forward's lse", lse, "lse")
    _require_like("attention_grad", out_t, "the forward's out", dout, "dout")
    return [q, k, v]


def _np_attention_grad(args, a):
    dout, q, k, v, out, lse = (x.astype(np.float64) for x in args[:6])
    s = np_attention_scores(q, k, args[6] if len(args) > 6 else None, a)
    p = np.exp(s - lse[..., None])
    dv = np.matmul(np.swapaxes(p, -1, -2), dout)
    dp = np.matmul(dout, np.swapaxes(v, -1, -2))
    ds = p * (dp - np.sum(dout * out, axis=-1, keepdims=True))
    scale = attention_scale(a, q.shape[-1])
    return np.matmul(ds, k) * scale, np.matmul(np.swapaxes(ds, -1, -2), q) * scale, dv


def _torch_attention_grad_math(dout, q, k, v, out, lse, mask, a):
    ct = attention_compute_dtype(q)
    dout, out, v = dout.to(ct), out.to(ct), v.to(ct)
    p = torch.exp(torch_attention_scores(q, k, mask, a, ct) - lse.to(ct).unsqueeze(-1))
    dv = torch.matmul(p.transpose(-2, -1), dout)
    ds = p * (torch.matmul(dout, v.transpose(-2, -1)) - (dout * out).sum(-1, keepdim=True))
    scale = attention_scale(a, q.shape[-1])
    dq = torch.matmul(ds, k.to(ct)) * scale
    dk = torch.matmul(ds.transpose(-2, -1), q.to(ct)) * scale
    return dq.to(q.dtype), dk.to(q.dtype), dv.to(q.dtype)


def _torch_attention_grad(args, a):
    dout, q, k, v, out, lse = args[:6]
    mask = args[6] if len(args) > 6 else None
    if not flash_kernel_applies(q, v):
        return _torch_attention_grad_math(dout, q, k, v, out, lse, mask, a)
    q4, k4, v4, m4, lead = flash_kernel_args(q, k, v, mask)
    n = math.prod(lead)
    if q.dim() != 4:
        dout, out = dout.reshape(n, 1, *dout.shape[-2:]), out.reshape(n, 1, *out.shape[-2:])
        lse = lse.reshape(n, 1, lse.shape[-1])
    dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        dout, q4, k4, v4, out, lse, 0.0, a["causal"], attn_mask=m4, scale=a["scale"])
    return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)


def _attention_grad_cost(ins, outs, attrs):
    q, k, v = ins[1:4]
    pairs = masked_attention_pairs(q, k, attrs)     # causal (or causal_cp): the tiles the forward scored
    # Scores recomputed (E), dv and dp (Ev each), dq and dk (E each), plus the softmax terms.
    return Cost(2 * pairs * (3 * q.shape[-1] + 2 * v.shape[-1]) + 6 * pairs,
                sum(t.nbytes for t in ins), sum(t.nbytes for t in outs))


register(OpDef(
    name="attention_grad", operands=("dout", "q", "k", "v", "out", "lse", "mask?"),
    attrs=(AttrSpec("scale", "float", None), AttrSpec("causal", "bool", False), AttrSpec("causal_cp", "int", None)),
    infer=_attention_grad_infer, reference=_np_attention_grad, torch=_torch_attention_grad,
    cost=_attention_grad_cost,
    doc="gradients dq, dk, dv of attention (scale, causal and the optional mask as the "
        "forward; the mask gets none) from dout and the forward's q, k, v and both its "
        "results out and lse: p = exp(scores - lse), dv = p^T dout, ds = p * (dout v^T - "
        "rowsum(dout * out)), dq = ds k * scale, dk = ds^T q * scale. Torch: "
        "aten._scaled_dot_product_flash_attention_for_cpu_backward where the forward used the "
        "flash kernel (the same test), else that formula in torch ops (f16/bf16 in f32). "
        "Cost: 2 * P * (3E + 2Ev) + 6 * P FLOPs, P the (query, key) pairs the forward scores "
        "(attention's cost: about half of B*Tq*Tk with causal=true; causal_cp as the forward's).",
))
