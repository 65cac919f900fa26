"""Tests of the backward op family: both executors against ``torch.autograd.grad`` of the
forward torch function on the same inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import partita
from optest import build, check_op, expect_error, rand
from partita.ir import TensorType
from partita.ir.diagnostics import ExecutionError
from partita.ir.dtypes import DTYPES as DTYPES_BY_NAME
from partita.ops.registry import get_op

DTYPES = ["f32", "f64"]


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.array(a, copy=True))


def vjp(fn, inputs, dy):
    """Gradients of ``fn(*inputs)`` for the cotangent ``dy``, one per input."""
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    return torch.autograd.grad(fn(*leaves), leaves, dy)


def _as(shape, dt: str = "f32") -> TensorType:
    return TensorType(tuple(shape), DTYPES_BY_NAME[dt])


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy().copy()


# --- elementwise activations ---------------------------------------------------------------------

ACTIVATIONS = [
    # op, forward, second operand is the forward output (y) or input (x), attrs
    ("relu_grad", torch.relu, "y", {}),
    ("sigmoid_grad", torch.sigmoid, "y", {}),
    ("tanh_grad", torch.tanh, "y", {}),
    ("silu_grad", F.silu, "x", {}),
    ("gelu_grad", F.gelu, "x", {}),
    ("gelu_grad", lambda t: F.gelu(t, approximate="tanh"), "x", {"approximate": "tanh"}),
]


@pytest.mark.parametrize("op,fwd,second,attrs", ACTIVATIONS)
@pytest.mark.parametrize("shape", [(2, 3, 5), (7,), ()])
@pytest.mark.parametrize("dt", DTYPES)
def test_activation_grads(op, fwd, second, attrs, shape, dt):
    x, dy = rand(shape, dt, -4, 4), rand(shape, dt)
    other = _np(fwd(_t(x))) if second == "y" else x
    check_op(op, [dy, other], attrs, lambda g, _: vjp(fwd, [_t(x)], g)[0])


def test_relu_grad_passes_nothing_where_the_output_is_zero():
    y = np.array([0.0, 2.0, 0.0, 1.0], np.float32)
    dy = np.array([5.0, 6.0, 7.0, 8.0], np.float32)
    out = check_op("relu_grad", [dy, y], {}, lambda g, t: torch.where(t > 0, g, 0.0))[0]
    assert out.tolist() == [0.0, 6.0, 0.0, 8.0]


@pytest.mark.parametrize("dt", ["f32", "f64", "i64", "i32"])
def test_sign(dt):
    x = rand((3, 5), dt, -3, 3)
    x.reshape(-1)[:2] = 0
    if dt.startswith("f"):
        x.reshape(-1)[2:5] = [np.nan, -np.inf, -0.0]
    check_op("sign", [x], {}, torch.sign)
    # What abs's gradient is made of.
    if dt.startswith("f"):
        assert np.array_equal(partita.run(build("sign", [_as(x.shape, dt)]), [x])[0],
                              _np(vjp(torch.abs, [_t(x)], torch.ones(x.shape, dtype=_t(x).dtype))[0]))


def test_activation_grad_errors():
    expect_error("relu_grad", [("f32", (2, 3)), ("f32", (3,))], {}, "shape of dy", "f32[3]")
    expect_error("tanh_grad", [("f32", (2,)), ("f64", (2,))], {}, "dtype f64", "cast y to f32")
    expect_error("silu_grad", [("i64", (2,)), ("i64", (2,))], {}, "dy must have a floating-point dtype")
    expect_error("gelu_grad", [("f32", (2,)), ("f32", (2,))], {"approximate": "fast"}, "'none', 'tanh'")
    expect_error("sign", [("bool", (2,))], {}, "not defined on bool")


# --- softmax / log_softmax ---------------------------------------------------------------------

@pytest.mark.parametrize("op,fwd", [("softmax_grad", F.softmax), ("log_softmax_grad", F.log_softmax)])
@pytest.mark.parametrize("shape,axis", [((4, 7), -1), ((2, 3, 5), 1), ((2, 3, 5), 0), ((6,), 0), ((), -1)])
@pytest.mark.parametrize("dt", DTYPES)
def test_softmax_grads(op, fwd, shape, axis, dt):
    x, dy = rand(shape, dt, -5, 5), rand(shape, dt)
    y = _np(fwd(_t(x), dim=axis))
    check_op(op, [dy, y], {"axis": axis}, lambda g, _: vjp(lambda t: fwd(t, dim=axis), [_t(x)], g)[0])


def test_softmax_grad_errors():
    expect_error("softmax_grad", [("f32", (2, 3)), ("f32", (2, 3))], {"axis": 2}, "axis 2", "rank 2")
    expect_error("log_softmax_grad", [("f32", (2, 3)), ("f32", (3, 2))], {}, "y f32[3,2]", "shape of dy")


@pytest.mark.parametrize("shape", [(2, 3, 5, 5), (4, 7), (3, 1)])
@pytest.mark.parametrize("dt", DTYPES)
def test_masked_softmax_grad(shape, dt):
    x, dy = rand(shape, dt, -5, 5), rand(shape, dt)

    def fwd(t):
        s = t * 0.7
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
        return F.softmax(s, dim=-1)
    y = _np(fwd(_t(x)))
    check_op("masked_softmax_grad", [dy, y], {"scale": 0.7, "causal": True},
             lambda g, _: vjp(fwd, [_t(x)], g)[0])


def test_masked_softmax_grad_errors():
    expect_error("masked_softmax_grad", [("f32", (2, 3)), ("f32", (3, 2))], {}, "y f32[3,2]", "shape of dy")
    expect_error("masked_softmax_grad", [("i64", (2, 3)), ("i64", (2, 3))], {}, "floating-point")


# --- layer_norm / rms_norm ---------------------------------------------------------------------------

def _nshape(shape, axes):
    return tuple(shape[a] for a in sorted(a % len(shape) for a in axes))


def _param(t, shape, axes):
    view = [1] * len(shape)
    for a in axes:
        view[a % len(shape)] = shape[a % len(shape)]
    return t.reshape(view)


def _layer_norm_any(x, w, b, axes, eps):
    """layer_norm over any axes, by formula (F.layer_norm takes trailing ones only)."""
    dims = [a % x.dim() for a in axes]
    var, mean = torch.var_mean(x, dim=dims, unbiased=False, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * _param(w, x.shape, axes) + _param(b, x.shape, axes)


def _rms_norm_any(x, w, axes, eps):
    dims = [a % x.dim() for a in axes]
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    return x * torch.rsqrt(torch.mean(x * x, dim=dims, keepdim=True) + eps) * _param(w, x.shape, axes)


NORM_CASES = [((4, 8), (-1,)), ((2, 3, 5), (-2, -1)), ((3, 4, 5), (1,)), ((3, 4, 5), (0, 2)), ((5, 1), (0,))]


@pytest.mark.parametrize("shape,axes", NORM_CASES)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("dt", DTYPES)
def test_layer_norm_grad(shape, axes, weighted, dt):
    eps = 1e-5
    x, dy = rand(shape, dt), rand(shape, dt)
    ns = _nshape(shape, axes)
    w = rand(ns, dt, 0.5, 2) if weighted else np.ones(ns, x.dtype)
    b = np.zeros(ns, x.dtype)
    k = len(axes)
    trailing = sorted(a % len(shape) for a in axes) == list(range(len(shape) - k, len(shape)))

    def fwd(xt, wt, bt):
        if trailing:
            return F.layer_norm(xt, ns, wt, bt, eps)
        return _layer_norm_any(xt, wt, bt, axes, eps)

    operands = [dy, x] + ([w] if weighted else [])
    check_op("layer_norm_grad", operands, {"axes": list(axes), "eps": eps},
             lambda g, *_: vjp(fwd, [_t(x), _t(w), _t(b)], g), atol=5e-5 if dt == "f32" else None)


@pytest.mark.parametrize("shape,axes", NORM_CASES)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("eps", [None, 1e-3])
@pytest.mark.parametrize("dt", DTYPES)
def test_rms_norm_grad(shape, axes, weighted, eps, dt):
    x, dy = rand(shape, dt), rand(shape, dt)
    ns = _nshape(shape, axes)
    w = rand(ns, dt, 0.5, 2) if weighted else np.ones(ns, x.dtype)
    trailing = sorted(a % len(shape) for a in axes) == list(range(len(shape) - len(axes), len(shape)))

    def fwd(xt, wt):
        if trailing:
            return F.rms_norm(xt, ns, wt, eps)
        return _rms_norm_any(xt, wt, axes, eps)

    operands = [dy, x] + ([w] if weighted else [])
    check_op("rms_norm_grad", operands, {"axes": list(axes), "eps": eps},
             lambda g, *_: vjp(fwd, [_t(x), _t(w)], g), atol=5e-5 if dt == "f32" else None)


def test_norm_grad_errors():
    expect_error("layer_norm_grad", [("f32", (2, 3)), ("f32", (2, 3)), ("f32", (2,))], {},
                 "weight f32[2] must have the normalized shape [3]")
    expect_error("layer_norm_grad", [("f32", (2, 3)), ("f32", (2, 3))], {"axes": []}, "at least one axis")
    expect_error("layer_norm_grad", [("f32", (2, 3)), ("f32", (2, 3))], {"axes": [1, -1]}, "repeat an axis")
    expect_error("rms_norm_grad", [("f32", (2, 3)), ("f32", (2, 4))], {}, "dy f32[2,3]", "shape of the input x")
    expect_error("rms_norm_grad", [("f32", (2, 3)), ("f32", (2, 3)), ("f64", (3,))], {}, "cast the weight to f32")
    expect_error("rms_norm_grad", [("i32", (2, 3)), ("i32", (2, 3))], {}, "floating-point")


# --- batch_norm ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 7), (3, 2, 5, 4)])
@pytest.mark.parametrize("dt", DTYPES)
def test_batch_norm_grad(shape, dt):
    eps = 1e-3
    x, dy, w = rand(shape, dt), rand(shape, dt), rand((shape[1],), dt, 0.5, 2)
    b = np.zeros(shape[1], x.dtype)
    check_op("batch_norm_grad", [dy, x, w], {"eps": eps},
             lambda g, *_: vjp(lambda xt, wt, bt: F.batch_norm(xt, None, None, wt, bt, True, 0.1, eps),
                               [_t(x), _t(w), _t(b)], g), atol=5e-5 if dt == "f32" else None)


@pytest.mark.parametrize("shape", [(4, 3), (3, 2, 5, 4)])
@pytest.mark.parametrize("dt", DTYPES)
def test_batch_norm_grad_inference_form(shape, dt):
    eps = 1e-3
    x, dy, w = rand(shape, dt), rand(shape, dt), rand((shape[1],), dt, 0.5, 2)
    rm, rv = rand((shape[1],), dt), rand((shape[1],), dt, 0.5, 2)
    b = np.zeros(shape[1], x.dtype)
    check_op("batch_norm_grad", [dy, x, w, rm, rv], {"eps": eps, "training": False},
             lambda g, *_: vjp(lambda xt, wt, bt: F.batch_norm(xt, _t(rm), _t(rv), wt, bt, False, 0.1, eps),
                               [_t(x), _t(w), _t(b)], g), atol=5e-5 if dt == "f32" else None)


def test_batch_norm_grad_errors():
    expect_error("batch_norm_grad", [("f32", (4, 3)), ("f32", (4, 3)), ("f32", (3,)), ("f32", (3,)), ("f32", (3,))],
                 {}, "takes no running statistics")
    expect_error("batch_norm_grad", [("f32", (4, 3)), ("f32", (4, 3)), ("f32", (3,))], {"training": False},
                 "needs running_mean and running_var")
    expect_error("batch_norm_grad", [("f32", (4,)), ("f32", (4,)), ("f32", (4,))], {}, "at least 2-d")
    expect_error("batch_norm_grad", [("f32", (4, 3)), ("f32", (4, 3)), ("f32", (4,))], {}, "shape [3]")
    expect_error("batch_norm_grad", [("f32", (1, 3)), ("f32", (1, 3)), ("f32", (3,))], {},
                 "more than 1 value per channel")


# --- convolution -----------------------------------------------------------------------------------------

CONV_CASES = [
    # x shape, weight shape, attrs
    ((2, 3, 7, 6), (4, 3, 3, 3), {}),
    ((2, 4, 9, 8), (6, 2, 3, 2), {"stride": [2, 1], "padding": [1, 0], "dilation": [1, 2], "groups": 2}),
    ((1, 3, 8, 8), (3, 1, 3, 3), {"stride": [2, 2], "padding": [2, 1], "groups": 3}),
    ((3, 2, 5, 5), (2, 2, 1, 1), {"stride": [3, 2]}),
    ((2, 3, 11), (4, 3, 3), {"stride": [2], "padding": [1], "dilation": [2]}),
    ((2, 4, 5, 6, 5), (2, 2, 2, 3, 2), {"stride": [1, 2, 1], "padding": [1], "groups": 2}),
]
_CONV = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}


@pytest.mark.parametrize("xs,ws,attrs", CONV_CASES)
@pytest.mark.parametrize("dt", DTYPES)
def test_conv_grad(xs, ws, attrs, dt):
    x, w = rand(xs, dt), rand(ws, dt)
    b = np.zeros(ws[0], x.dtype)
    conv = _CONV[len(ws)]
    kw = {k: (v[0] if len(v) == 1 else v) if isinstance(v, list) else v for k, v in attrs.items()}
    y = conv(_t(x), _t(w), None, **kw)
    dy = rand(tuple(y.shape), dt)
    check_op("conv2d_grad", [dy, x, w], attrs,
             lambda g, *_: vjp(lambda xt, wt, bt: conv(xt, wt, bt, **kw), [_t(x), _t(w), _t(b)], g),
             atol=5e-5 if dt == "f32" else None)


@pytest.mark.parametrize("mask", [(0, 1, 1), (1, 0, 0), (0, 0, 1)])
def test_conv_grad_mask_leaves_out_results_as_zeros(mask):
    x, w = rand((2, 3, 6, 5), "f32"), rand((4, 3, 3, 3), "f32")
    dy = rand((2, 4, 4, 3), "f32")
    b = np.zeros(4, np.float32)

    def want(g, *_):
        full = vjp(lambda xt, wt, bt: F.conv2d(xt, wt, bt), [_t(x), _t(w), _t(b)], g)
        return tuple(r if m else torch.zeros_like(r) for r, m in zip(full, mask))
    check_op("conv2d_grad", [dy, x, w], {"mask": list(mask)}, want, atol=5e-5)


def test_conv_grad_errors():
    expect_error("conv2d_grad", [("f32", (2, 4, 4, 3)), ("f32", (2, 3, 6, 5)), ("f32", (4, 3, 3, 3))],
                 {"mask": [1, 2, 1]}, "three 0/1 flags")
    x, w = ("f32", (2, 3, 6, 6)), ("f32", (4, 3, 3, 3))
    build("conv2d_grad", [_as((2, 4, 4, 4)), _as(x[1]), _as(w[1])])  # the valid case builds
    expect_error("conv2d_grad", [("f32", (2, 4, 5, 4)), x, w], {}, "dy f32[2,4,5,4]",
                 "shape of the convolution's output f32[2,4,4,4]")
    expect_error("conv2d_grad", [("f32", (2, 4, 4, 4)), x, ("f32", (4, 2, 3, 3))], {}, "channel mismatch")
    expect_error("conv2d_grad", [("f32", (2, 4, 4, 4)), x, w], {"groups": 3}, "not divisible by groups=3")
    expect_error("conv2d_grad", [("f32", (2, 4, 4, 4)), x, w], {"stride": [1, 1, 1]}, "'stride' must have 2")
    expect_error("conv2d_grad", [("f32", (2, 4, 4, 4)), x, w], {"dilation": [0, 1]}, "'dilation' must be >= 1")
    expect_error("conv2d_grad", [("f32", (2, 4, 4, 4)), ("f32", (2, 3, 6)), w], {}, "must have rank 4")
    expect_error("conv2d_grad", [("f32", (2, 4, 4, 4)), x, ("f32", (4, 3))], {}, "3-d, 4-d or 5-d")
    expect_error("conv2d_grad", [("f32", (2, 4, 1, 1)), ("f32", (2, 3, 2, 2)), w], {}, "larger than the padded input")


# --- pooling ------------------------------------------------------------------------------------------------

MAX_POOL_CASES = [
    ((2, 3, 6, 6), {"kernel": [2, 2]}),
    ((1, 2, 7, 9), {"kernel": [3, 3], "stride": [2, 2], "padding": [1, 1]}),
    ((2, 1, 7, 8), {"kernel": [3, 2], "stride": [2, 3], "padding": [1, 1], "ceil_mode": True}),
    ((1, 2, 9, 9), {"kernel": [3, 3], "stride": [2, 1], "dilation": [2, 3], "padding": [1, 0]}),
    ((2, 2, 5, 5), {"kernel": [2, 2], "stride": [1, 1]}),
    ((1, 1, 6, 5), {"kernel": [4, 3], "stride": [3, 2], "padding": [2, 1], "ceil_mode": True, "dilation": [1, 2]}),
]


def _pool_kw(attrs):
    kw = dict(attrs)
    kw["kernel_size"] = kw.pop("kernel")
    return kw


@pytest.mark.parametrize("shape,attrs", MAX_POOL_CASES)
@pytest.mark.parametrize("dt", DTYPES)
def test_max_pool2d_grad(shape, attrs, dt):
    x = rand(shape, dt)
    fwd = lambda t: F.max_pool2d(t, **_pool_kw(attrs))  # noqa: E731
    dy = rand(tuple(fwd(_t(x)).shape), dt)
    check_op("max_pool2d_grad", [dy, x], attrs, lambda g, _: vjp(fwd, [_t(x)], g)[0])


@pytest.mark.parametrize("shape,attrs", MAX_POOL_CASES)
def test_max_pool2d_grad_picks_the_first_of_tied_maxima(shape, attrs):
    # Few distinct values: most windows hold several equal maxima.
    x = rand(shape, "i64", 0, 2).astype(np.float32)
    fwd = lambda t: F.max_pool2d(t, **_pool_kw(attrs))  # noqa: E731
    dy = rand(tuple(fwd(_t(x)).shape), "f32")
    check_op("max_pool2d_grad", [dy, x], attrs, lambda g, _: vjp(fwd, [_t(x)], g)[0])


def test_max_pool2d_grad_nan_and_minus_inf_windows():
    x = np.full((1, 1, 4, 4), -np.inf, np.float32)
    x[0, 0, 0, 1] = x[0, 0, 1, 0] = np.nan  # NaN wins its window (the last NaN, in torch's scan)
    attrs = {"kernel": [3, 3], "stride": [2, 2], "padding": [1, 1]}
    fwd = lambda t: F.max_pool2d(t, **_pool_kw(attrs))  # noqa: E731
    dy = rand(tuple(fwd(_t(x)).shape), "f32")
    check_op("max_pool2d_grad", [dy, x], attrs, lambda g, _: vjp(fwd, [_t(x)], g)[0])


AVG_POOL_CASES = [
    ((2, 3, 6, 6), {"kernel": [2, 2]}),
    ((1, 2, 7, 9), {"kernel": [3, 3], "stride": [2, 2], "padding": [1, 1]}),
    ((1, 2, 7, 9), {"kernel": [3, 3], "stride": [2, 2], "padding": [1, 1], "count_include_pad": False}),
    ((2, 1, 7, 8), {"kernel": [3, 2], "stride": [2, 3], "padding": [1, 1], "ceil_mode": True}),
    ((2, 1, 8, 7), {"kernel": [4, 3], "stride": [3, 2], "padding": [2, 1], "ceil_mode": True,
                    "count_include_pad": False}),
    ((1, 1, 5, 5), {"kernel": [2, 3], "stride": [1, 1]}),
]


@pytest.mark.parametrize("shape,attrs", AVG_POOL_CASES)
@pytest.mark.parametrize("dt", DTYPES)
def test_avg_pool2d_grad(shape, attrs, dt):
    x = rand(shape, dt)
    fwd = lambda t: F.avg_pool2d(t, **_pool_kw(attrs))  # noqa: E731
    dy = rand(tuple(fwd(_t(x)).shape), dt)
    check_op("avg_pool2d_grad", [dy, x], attrs, lambda g, _: vjp(fwd, [_t(x)], g)[0])


POOL3D_CASES = [
    ((1, 2, 5, 6, 4), {"kernel": [2, 2, 2]}),
    ((2, 1, 5, 7, 6), {"kernel": [3, 2, 3], "stride": [2, 2, 1], "padding": [1, 1, 1], "ceil_mode": True}),
]


@pytest.mark.parametrize("shape,attrs", POOL3D_CASES)
@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("dt", DTYPES)
def test_pool3d_grads(shape, attrs, kind, dt):
    x = rand(shape, dt)
    pool = F.max_pool3d if kind == "max" else F.avg_pool3d
    fwd = lambda t: pool(t, **_pool_kw(attrs))  # noqa: E731
    dy = rand(tuple(fwd(_t(x)).shape), dt)
    check_op(f"{kind}_pool2d_grad", [dy, x], attrs, lambda g, _: vjp(fwd, [_t(x)], g)[0])


@pytest.mark.parametrize("attrs", [
    {"kernel": [3, 2], "dilation": [2, 3], "stride": [1, 2]},
    {"kernel": [3, 3], "dilation": [2, 1], "stride": [2, 2], "padding": [1, 1], "ceil_mode": True},
    {"kernel": [3, 3], "dilation": [1, 2], "padding": [1, 1], "count_include_pad": False},
])
@pytest.mark.parametrize("dt", DTYPES)
def test_avg_pool2d_grad_dilated(attrs, dt):
    # PyTorch's avg_pool2d has no dilation: differentiate the forward record's torch
    # implementation (a convolution of ones) instead.
    fwd_op = get_op("avg_pool2d")
    norm = fwd_op.normalize_attrs(attrs)
    x = rand((2, 2, 9, 8), dt)
    fwd = lambda t: fwd_op.torch([t], norm)  # noqa: E731
    dy = rand(tuple(fwd(_t(x)).shape), dt)
    check_op("avg_pool2d_grad", [dy, x], attrs, lambda g, _: vjp(fwd, [_t(x)], g)[0])


def test_pool_grad_errors():
    x = ("f32", (1, 1, 6, 6))
    expect_error("max_pool2d_grad", [("f32", (1, 1, 3, 2)), x], {"kernel": [2, 2]},
                 "dy f32[1,1,3,2]", "the max_pool2d output f32[1,1,3,3]")
    expect_error("avg_pool2d_grad", [("f32", (1, 1, 3, 3)), x], {"kernel": [2, 2], "padding": [2, 0]},
                 "more than half the window", "as for the forward avg_pool2d")
    expect_error("max_pool2d_grad", [("i64", (1, 1, 3, 3)), ("i64", (1, 1, 6, 6))], {"kernel": [2, 2]},
                 "floating-point")
    expect_error("avg_pool2d_grad", [("f32", (1, 3, 3)), ("f32", (1, 6, 6))], {"kernel": [2, 2]},
                 "4-d [N, C, H, W] (a 2-d pool) or 5-d")
    expect_error("max_pool2d_grad", [("f32", (1, 1, 3, 3)), x], {"kernel": [2, 2, 2]},
                 "must be 2 integers", "as for the forward max_pool2d")


# --- embedding, scatter_add, index_add ------------------------------------------------------------------------

@pytest.mark.parametrize("idx_shape", [(5,), (2, 3), ()])
@pytest.mark.parametrize("idx_dt", ["i64", "i32"])
@pytest.mark.parametrize("dt", DTYPES)
def test_embedding_grad(idx_shape, idx_dt, dt):
    v, d = 4, 3
    idx = rand(idx_shape, idx_dt, 0, v - 1)
    table = rand((v, d), dt)
    dy = rand(idx_shape + (d,), dt)
    check_op("embedding_grad", [dy, idx], {"num_embeddings": v},
             lambda g, i: vjp(lambda t: F.embedding(i, t), [_t(table)], g)[0])


def test_embedding_grad_errors():
    expect_error("embedding_grad", [("f32", (2, 3)), ("f32", (2,))], {"num_embeddings": 4}, "must be i32 or i64")
    expect_error("embedding_grad", [("f32", (2, 3)), ("i64", (3,))], {"num_embeddings": 4},
                 "indices.shape + [dim]")
    expect_error("embedding_grad", [("f32", (2, 3)), ("i64", (2,))], {}, "missing required attribute 'num_embeddings'")
    g = build("embedding_grad", [_as((2, 3)), _as((2,), "i64")], {"num_embeddings": 4})
    with pytest.raises(ExecutionError, match="index 4 is out of range"):
        partita.run(g, [rand((2, 3)), np.array([1, 4])])


@pytest.mark.parametrize("xs,idxs,srcs,axis", [((4, 5), (3, 5), (3, 5), 0), ((4, 5), (2, 3), (3, 4), 1),
                                                ((3, 4, 2), (3, 6, 2), (3, 6, 2), 1), ((6,), (9,), (9,), -1)])
@pytest.mark.parametrize("dt", DTYPES)
def test_scatter_add(xs, idxs, srcs, axis, dt):
    x, src = rand(xs, dt), rand(srcs, dt)
    idx = rand(idxs, "i64", 0, xs[axis] - 1)
    check_op("scatter_add", [x, idx, src], {"axis": axis}, lambda a, i, s: torch.scatter_add(a, axis, i, s))
    # It is gather's gradient.
    if idxs == srcs:
        zero = np.zeros_like(x)
        check_op("scatter_add", [zero, idx, src], {"axis": axis},
                 lambda a, i, s: vjp(lambda t: torch.gather(t, axis, i), [_t(x)], s)[0])


@pytest.mark.parametrize("xs,n,axis", [((4, 5), 6, 0), ((3, 4, 2), 2, 1), ((5,), 7, -1)])
@pytest.mark.parametrize("idx_dt", ["i64", "i32"])
@pytest.mark.parametrize("dt", DTYPES)
def test_index_add(xs, n, axis, idx_dt, dt):
    x = rand(xs, dt)
    idx = rand((n,), idx_dt, 0, xs[axis] - 1)
    src_shape = list(xs)
    src_shape[axis] = n
    src = rand(src_shape, dt)
    check_op("index_add", [x, idx, src], {"axis": axis}, lambda a, i, s: torch.index_add(a, axis, i, s))
    zero = np.zeros_like(x)
    check_op("index_add", [zero, idx, src], {"axis": axis},
             lambda a, i, s: vjp(lambda t: torch.index_select(t, axis, i), [_t(x)], s)[0])


def test_scatter_and_index_add_errors():
    expect_error("scatter_add", [("f32", (4, 5)), ("i64", (4,)), ("f32", (4, 5))], {"axis": 0}, "must have the rank")
    expect_error("scatter_add", [("f32", (4, 5)), ("i64", (4, 6)), ("f32", (4, 6))], {"axis": 0},
                 "larger than the input f32[4,5] in dim 1")
    expect_error("scatter_add", [("f32", (4, 5)), ("i64", (4, 5)), ("f32", (3, 5))], {"axis": 0},
                 "larger than src f32[3,5] in dim 0")
    expect_error("scatter_add", [("f32", (4, 5)), ("f32", (4, 5)), ("f32", (4, 5))], {"axis": 0}, "i32 or i64")
    expect_error("scatter_add", [("f32", (4, 5)), ("i64", (4, 5)), ("f64", (4, 5))], {"axis": 0}, "cast src to f32")
    expect_error("index_add", [("f32", (4, 5)), ("i64", (2, 2)), ("f32", (4, 5))], {"axis": 0}, "must be 1-D")
    expect_error("index_add", [("f32", (4, 5)), ("i64", (3,)), ("f32", (4, 5))], {"axis": 0},
                 "src f32[4,5] must have shape [3,5]")
    expect_error("index_add", [("f32", (4, 5)), ("i64", (3,)), ("f32", (3, 5))], {"axis": 2}, "axis 2 is out of range")
    g = build("index_add", [_as((4,)), _as((2,), "i64"), _as((2,))], {"axis": 0})
    with pytest.raises(ExecutionError, match="index -1 is out of range"):
        partita.run(g, [rand((4,)), np.array([0, -1]), rand((2,))])


# --- slice_grad -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,attrs", [
    ((5, 6), {"axis": 1, "start": 1, "end": 4}),
    ((5, 6), {"axis": 0, "start": -3}),
    ((4, 7, 2), {"axis": 1, "start": 1, "end": 100, "step": 2}),
    ((4, 7, 2), {"axis": -2, "start": -100, "end": -2, "step": 3}),
    ((6,), {"axis": 0, "start": 4, "end": 2}),
])
@pytest.mark.parametrize("dt", DTYPES)
def test_slice_grad(shape, attrs, dt):
    x = rand(shape, dt)
    axis = attrs["axis"] % len(shape)
    sl = (slice(None),) * axis + (slice(attrs.get("start", 0), attrs.get("end"), attrs.get("step", 1)),)
    dy = np.asarray(rand(x[sl].shape, dt))
    check_op("slice_grad", [dy], {"shape": list(shape), **attrs},
             lambda g: vjp(lambda t: t[sl], [_t(x)], g)[0])


def test_slice_grad_errors():
    expect_error("slice_grad", [("f32", (2, 3))], {"shape": [5, 3], "axis": 0, "start": 1},
                 "dy f32[2,3]", "the slice of [5,3] f32[4,3]")
    expect_error("slice_grad", [("f32", (2, 3))], {"shape": [5, 3], "axis": 0, "step": 0},
                 "'step' is 0", "as for the forward slice")
    expect_error("slice_grad", [("f32", (2, 3))], {"shape": [5, 3], "axis": 2}, "axis 2 is out of range")
    expect_error("slice_grad", [("f32", (2, 3))], {"shape": [-5, 3], "axis": 0}, "negative size")


# --- cross_entropy_grad --------------------------------------------------------------------------------------

CE_SHAPES = [((6, 5), (6,)), ((2, 4, 3, 2), (2, 3, 2)), ((7,), ())]


@pytest.mark.parametrize("logits_shape,target_shape", CE_SHAPES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("ignore,ls", [(False, 0.0), (True, 0.0), (True, 0.2), (False, 0.1)])
@pytest.mark.parametrize("dt", DTYPES)
def test_cross_entropy_grad(logits_shape, target_shape, reduction, ignore, ls, dt):
    ncls = logits_shape[1 if len(logits_shape) > 1 else 0]
    logits = rand(logits_shape, dt)
    target = rand(target_shape, "i64", 0, ncls - 1)
    ignore_index = -100
    if ignore and target.ndim:
        ignore_index = 1
        target.reshape(-1)[::3] = ignore_index  # every third target ignored (and class 1 too)
    dloss = rand(target_shape if reduction == "none" else (), dt)
    attrs = {"reduction": reduction, "ignore_index": ignore_index, "label_smoothing": ls}

    def fwd(t):
        return F.cross_entropy(t, _t(target), ignore_index=ignore_index, reduction=reduction, label_smoothing=ls)

    check_op("cross_entropy_grad", [dloss, logits, target], attrs,
             lambda g, *_: vjp(fwd, [_t(logits)], g)[0])


def test_cross_entropy_grad_all_targets_ignored():
    logits, target = rand((3, 4)), np.full(3, -100, np.int64)
    for reduction in ("sum", "none"):
        dloss = rand(() if reduction == "sum" else (3,))
        out = check_op("cross_entropy_grad", [dloss, logits, target], {"reduction": reduction},
                       lambda g, lg, tg: vjp(lambda t: F.cross_entropy(t, tg, reduction=reduction), [lg], g)[0])
        assert not out[0].any()


def test_cross_entropy_grad_errors():
    expect_error("cross_entropy_grad", [("f32", ()), ("f32", (4, 3)), ("i64", (4,))], {"reduction": "none"},
                 "dloss f32[] must have the shape of the loss (reduction 'none') f32[4]")
    expect_error("cross_entropy_grad", [("f32", (4,)), ("f32", (4, 3)), ("i64", (4,))], {},
                 "dloss f32[4] must have the shape of the loss (reduction 'mean') f32[]")
    expect_error("cross_entropy_grad", [("f32", ()), ("f32", (4, 3)), ("i32", (4,))], {},
                 "class indices as i64", "as for the forward cross_entropy")
    expect_error("cross_entropy_grad", [("f32", ()), ("f32", (4, 3)), ("i64", (3,))], {}, "must have shape [4]")
    expect_error("cross_entropy_grad", [("f64", ()), ("f32", (4, 3)), ("i64", (4,))], {}, "cast dloss to f32")
    expect_error("cross_entropy_grad", [("f32", ()), ("f32", (4, 3)), ("i64", (4,))], {"label_smoothing": 1.5},
                 "between 0 and 1")
    g = build("cross_entropy_grad", [_as(()), _as((2, 3)), _as((2,), "i64")])
    with pytest.raises(ExecutionError, match="target 3 is out of range"):
        partita.run(g, [np.float32(1.0), rand((2, 3)), np.array([0, 3])])


# --- low precision smoke test ----------------------------------------------------------------------

@pytest.mark.parametrize("dt", ["bf16", "f16"])
def test_low_precision_grads_run(dt):
    x, dy = rand((3, 8), dt), rand((3, 8), dt)
    tol = dict(rtol=5e-2, atol=5e-2)
    check_op("rms_norm_grad", [dy, x], {}, _low_rms, **tol)
    check_op("layer_norm_grad", [dy, x], {}, _low_ln, **tol)


def _low_rms(g, xt):
    """The f32 gradients rounded to the low dtype (the interpreter's contract)."""
    ones = torch.ones(xt.shape[-1])
    dx, dw = vjp(lambda t, w: F.rms_norm(t, (xt.shape[-1],), w), [xt.float(), ones], g.float())
    return dx.to(xt.dtype), dw.to(xt.dtype)


def _low_ln(g, xt):
    n = xt.shape[-1]
    dx, dw, db = vjp(lambda t, w, b: F.layer_norm(t, (n,), w, b), [xt.float(), torch.ones(n), torch.zeros(n)],
                     g.float())
    return dx.to(xt.dtype), dw.to(xt.dtype), db.to(xt.dtype)


# --- attention_grad ------------------------------------------------------------------------------------

def _attention_forward(q, k, v, mask, causal, scale):
    """out and lse of attention in f64 (out from SDPA, lse = logsumexp of the masked scores)."""
    qd, kd, vd = (_t(a).double() for a in (q, k, v))
    md = None if mask is None else (_t(mask) if mask.dtype == np.bool_ else _t(mask).double())
    out = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=md, is_causal=causal, scale=scale)
    s = qd @ kd.transpose(-1, -2) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
    if md is not None:
        s = s.masked_fill(~md, float("-inf")) if md.dtype == torch.bool else s + md
    lse_dt = np.float64 if q.dtype == np.float64 else np.float32
    return out.numpy().astype(q.dtype), torch.logsumexp(s, -1).numpy().astype(lse_dt)


# (q shape, Tk, Ev, mask kind, mask shape, causal, scale)
ATTENTION_GRAD_CASES = [
    ((2, 3, 5, 8), 7, 8, None, None, False, None),
    ((2, 2, 6, 4), 6, 4, None, None, True, 0.3),
    ((1, 2, 7, 4), 5, 4, None, None, True, None),
    ((2, 3, 5, 4), 7, 4, "float", (2, 1, 5, 7), False, None),
    ((2, 3, 5, 4), 7, 4, "bool", (5, 7), True, None),
    ((3, 5, 4), 7, 4, "float", (3, 1, 7), False, 0.7),
    ((3, 5, 4), 7, 4, "bool", (5, 7), False, None),
    ((2, 3, 5, 4), 7, 6, "bool", (1, 3, 5, 7), False, None),  # Ev != E: the formula in torch ops
]


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("case", ATTENTION_GRAD_CASES, ids=[str(i) for i in range(len(ATTENTION_GRAD_CASES))])
def test_attention_grad(case, dt):
    qs, tk, ev, kind, mshape, causal, scale = case
    q = rand(qs, dt, -1.5, 1.5)
    k, v = rand(qs[:-2] + (tk, qs[-1]), dt, -1.5, 1.5), rand(qs[:-2] + (tk, ev), dt, -1.5, 1.5)
    mask = None
    if kind == "bool":
        mask = rand(mshape, "bool")
        mask[..., 0] = True
    elif kind == "float":
        mask = rand(mshape, dt, -2.0, 2.0)
    out, lse = _attention_forward(q, k, v, mask, causal, scale)
    dout = rand(out.shape, dt)
    masks = [] if mask is None else [mask]
    attrs = {"causal": causal} if scale is None else {"causal": causal, "scale": scale}

    def want(g, qt, kt, vt, o, l, *m):
        fn = lambda a, b, c: F.scaled_dot_product_attention(a, b, c, attn_mask=m[0] if m else None,
                                                            is_causal=causal, scale=scale)
        return vjp(fn, [qt, kt, vt], g)

    check_op("attention_grad", [dout, q, k, v, out, lse, *masks], attrs, want)


def test_attention_grad_low_precision():
    q, k, v = rand((1, 2, 5, 8), "f16", -1, 1), rand((1, 2, 6, 8), "f16", -1, 1), rand((1, 2, 6, 8), "f16", -1, 1)
    out, lse = _attention_forward(q, k, v, None, False, None)
    dout = rand(out.shape, "f16")

    def want(g, qt, kt, vt, o, l):
        return vjp(F.scaled_dot_product_attention, [qt, kt, vt], g)

    check_op("attention_grad", [dout, q, k, v, out, lse], {}, want, rtol=1e-2, atol=1e-2)


def test_attention_grad_errors():
    q, kv = ("f32", (2, 3, 5, 8)), ("f32", (2, 3, 7, 8))
    out, lse = ("f32", (2, 3, 5, 8)), ("f32", (2, 3, 5))
    expect_error("attention_grad", [out, q, kv, kv, out, ("f64", (2, 3, 5))], {}, "cast lse to f32")
    expect_error("attention_grad", [out, q, kv, kv, ("f32", (2, 3, 5, 7)), lse], {}, "out f32[2,3,5,7]",
                 "shape of the forward's out")
    expect_error("attention_grad", [("f32", (2, 3, 5, 1)), q, kv, kv, out, lse], {}, "dout")
    expect_error("attention_grad", [out, q, ("f32", (2, 3, 7, 4)), kv, out, lse], {}, "head size 4",
                 "as for the forward attention")
    expect_error("attention_grad", [out, q, kv, kv, out, lse, ("bool", (5, 6))], {}, "does not broadcast")
