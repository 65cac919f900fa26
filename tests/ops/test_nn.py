"""Tests of the nn op family against PyTorch eager on both executors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import partita
from optest import build, check_op, expect_error, rand
from partita.ir.diagnostics import ExecutionError
from partita.ops import nn as nn_ops
from partita.ops.registry import get_op

LOOSE = {"f16": dict(rtol=1e-2, atol=1e-2), "bf16": dict(rtol=5e-2, atol=5e-2)}


def _np(x):
    return x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


# --- softmax / log_softmax ------------------------------------------------------------------

SOFTMAX_CASES = [((4, 7), -1), ((2, 3, 5), 1), ((2, 3, 5), 0), ((1, 1), 0), ((0, 3), -1), ((3, 0), 1),
                 ((), -1), ((6,), 0)]


@pytest.mark.parametrize("op,fn", [("softmax", F.softmax), ("log_softmax", F.log_softmax)])
@pytest.mark.parametrize("shape,axis", SOFTMAX_CASES)
@pytest.mark.parametrize("dt", ["f32", "f64"])
def test_softmax_family(op, fn, shape, axis, dt):
    x = rand(shape, dt, -8, 8)
    check_op(op, [x], {"axis": axis}, lambda t: fn(t, dim=axis))


@pytest.mark.parametrize("op,fn", [("softmax", F.softmax), ("log_softmax", F.log_softmax)])
@pytest.mark.parametrize("dt", ["f16", "bf16"])
def test_softmax_family_low_precision(op, fn, dt):
    x = rand((3, 9), dt, -4, 4)
    check_op(op, [x], {}, lambda t: fn(t, dim=-1), **LOOSE[dt])


def test_softmax_stable_for_large_inputs_and_all_minus_inf_rows():
    x = np.array([[1000.0, 1001.0, 999.0], [-np.inf, -np.inf, -np.inf]], np.float32)
    out = check_op("softmax", [x], {}, lambda t: F.softmax(t, dim=-1))[0]
    assert np.all(np.isfinite(out[0])) and np.all(np.isnan(out[1]))


def test_softmax_errors():
    expect_error("softmax", [("i64", (2, 3))], {}, "floating-point", "i64[2,3]")
    expect_error("log_softmax", [("f32", (2, 3))], {"axis": 2}, "axis 2", "rank 2")


# --- masked_softmax --------------------------------------------------------------------------

def _masked_softmax_eager(x, mask=None, *, scale=1.0, causal=False):
    """What the fused op replaces: scale, mask and softmax as three eager ops."""
    s = x.double() * scale
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.double()
    return torch.nan_to_num(F.softmax(s, dim=-1), nan=0.0).to(x.dtype)


@pytest.mark.parametrize("shape,causal", [((2, 3, 5, 5), True), ((3, 4, 6), True), ((4, 6), False), ((2, 1), True),
                                          ((5,), False), ((0, 4), False), ((2, 0, 0), True)])
@pytest.mark.parametrize("dt", ["f32", "f64"])
def test_masked_softmax_matches_scale_mask_softmax(shape, causal, dt):
    x = rand(shape, dt, -8, 8)
    check_op("masked_softmax", [x], {"scale": 0.3, "causal": causal},
             lambda t: _masked_softmax_eager(t, scale=0.3, causal=causal))


def test_masked_softmax_with_bool_and_additive_masks_and_dropped_rows():
    x = rand((2, 3, 4), "f32", -4, 4)
    keep = np.array([[True, False, True, False], [False, False, False, False], [True, True, True, True]])
    out = check_op("masked_softmax", [x, keep], {"scale": 2.0},
                   lambda t, m: _masked_softmax_eager(t, m, scale=2.0))[0]
    assert np.all(out[:, 1] == 0.0)  # every score of query 1 dropped: probabilities 0, as attention gives
    bias = rand((2, 1, 4), "f32", -2, 1)
    check_op("masked_softmax", [x, bias], {"causal": True},
             lambda t, m: _masked_softmax_eager(t, m, causal=True))


@pytest.mark.parametrize("dt", ["f16", "bf16"])
def test_masked_softmax_low_precision(dt):
    x = rand((2, 6, 6), dt, -4, 4)
    check_op("masked_softmax", [x], {"causal": True, "scale": 0.125},
             lambda t: _masked_softmax_eager(t, scale=0.125, causal=True), **LOOSE[dt])


def test_masked_softmax_prices_one_pass_over_the_scores():
    t = partita.ir.types.TensorType((2, 8, 16, 16), partita.ir.dtypes.bf16)
    c = get_op("masked_softmax").cost_of([t], [t], {"scale": 1.0, "causal": True})
    assert (c.bytes_read, c.bytes_written, c.flops) == (t.nbytes, t.nbytes, 6 * t.numel)


def test_masked_softmax_errors():
    expect_error("masked_softmax", [("i64", (2, 3))], {}, "floating-point", "i64[2,3]")
    expect_error("masked_softmax", [("f32", (5,))], {"causal": True}, "rank 2 or more", "causal=true")
    expect_error("masked_softmax", [("f32", (2, 3)), ("f32", (4, 3))], {}, "does not broadcast", "f32[4,3]")
    expect_error("masked_softmax", [("f32", (2, 3)), ("i64", (2, 3))], {}, "must be bool", "cast it")


# --- layer_norm / rms_norm ----------------------------------------------------------------------

@pytest.mark.parametrize("shape,axes", [((4, 8), (-1,)), ((2, 3, 5), (-2, -1)), ((2, 3, 5), (1, 2)),
                                         ((1, 1), (-1,)), ((0, 6), (-1,)), ((3, 1, 4), (-1,))])
@pytest.mark.parametrize("affine", [0, 1, 2])
@pytest.mark.parametrize("dt", ["f32", "f64"])
def test_layer_norm(shape, axes, affine, dt):
    x = rand(shape, dt)
    nshape = shape[len(shape) - len(axes):]
    params = [rand(nshape, dt) for _ in range(affine)]
    check_op("layer_norm", [x, *params], {"axes": axes},
             lambda t, *ps: F.layer_norm(t, nshape, *ps))


def test_layer_norm_eps_and_constant_rows():
    # A constant row has zero variance: the output is 0 and eps alone keeps it finite.
    x = np.concatenate([np.full((1, 5), 3.0), rand((2, 5), "f64")]).astype(np.float64)
    check_op("layer_norm", [x], {"eps": 0.5}, lambda t: F.layer_norm(t, (5,), eps=0.5))


@pytest.mark.parametrize("dt", ["f16", "bf16"])
def test_layer_norm_low_precision(dt):
    x, w, b = rand((3, 16), dt), rand((16,), dt), rand((16,), dt)
    check_op("layer_norm", [x, w, b], {}, lambda t, w, b: F.layer_norm(t, (16,), w, b), **LOOSE[dt])


@pytest.mark.parametrize("shape,axes", [((4, 8), (-1,)), ((2, 3, 5), (-2, -1)), ((0, 3), (-1,)), ((2, 1), (-1,))])
@pytest.mark.parametrize("with_weight", [False, True])
@pytest.mark.parametrize("eps", [None, 1e-6, 0.25])
@pytest.mark.parametrize("dt", ["f32", "f64"])
def test_rms_norm(shape, axes, with_weight, eps, dt):
    x = rand(shape, dt)
    nshape = shape[len(shape) - len(axes):]
    params = [rand(nshape, dt)] if with_weight else []
    check_op("rms_norm", [x, *params], {"axes": axes, "eps": eps},
             lambda t, *ps: F.rms_norm(t, nshape, *ps, eps=eps))


@pytest.mark.parametrize("dt", ["f16", "bf16"])
def test_rms_norm_default_eps_low_precision(dt):
    # Tiny inputs make eps matter: PyTorch's default is f32's epsilon, not f16's.
    x = rand((2, 4), dt, -1e-3, 1e-3)
    check_op("rms_norm", [x], {}, lambda t: F.rms_norm(t, (4,)), **LOOSE[dt])


def test_norm_errors():
    expect_error("layer_norm", [("f32", (2, 3, 4))], {"axes": [1]}, "trailing axes", "[2]")
    expect_error("layer_norm", [("f32", (2, 3)), ("f32", (2,))], {}, "weight has shape [2]", "normalized shape [3]")
    expect_error("layer_norm", [("f32", (2, 3)), ("f32", (3,)), ("f64", (3,))], {}, "bias has dtype f64")
    expect_error("layer_norm", [("i32", (2, 3))], {}, "floating-point")
    expect_error("layer_norm", [("f32", (2, 3))], {"axes": []}, "at least one axis")
    expect_error("rms_norm", [("f32", (2, 3)), ("f32", (2, 3))], {}, "weight has shape [2,3]")
    expect_error("rms_norm", [("f32", (2, 3))], {"axes": [-3]}, "out of range")


# --- embedding ------------------------------------------------------------------------------

@pytest.mark.parametrize("idx_shape", [(), (5,), (2, 3), (0,), (2, 0, 3)])
@pytest.mark.parametrize("idt", ["i32", "i64"])
@pytest.mark.parametrize("dt", ["f32", "f64", "bf16"])
def test_embedding(idx_shape, idt, dt):
    table = rand((7, 4), dt)
    idx = rand(idx_shape, idt, 0, 6)
    check_op("embedding", [table, idx], {}, lambda t, i: F.embedding(i, t))


def test_embedding_errors():
    expect_error("embedding", [("f32", (7,)), ("i64", (3,))], {}, "2-d", "f32[7]")
    expect_error("embedding", [("f32", (7, 2)), ("f32", (3,))], {}, "i32 or i64", "f32[3]")
    for idx in (np.array([0, 7]), np.array([-1, 2])):
        g = build("embedding", [partita.TensorType((7, 2), partita.dtypes.f32),
                                partita.TensorType((2,), partita.dtypes.i64)])
        for backend in ("numpy", "torch"):
            with pytest.raises(ExecutionError, match="embedding"):
                partita.run(g, [rand((7, 2)), idx], backend=backend)


# --- conv2d ---------------------------------------------------------------------------------

CONV_CASES = [
    # (N, C, H, W), (O, kH, kW), attrs
    ((2, 3, 8, 8), (4, 3, 3), {}),
    ((1, 3, 7, 9), (5, 2, 3), {"stride": [2, 1], "padding": [1, 2]}),
    ((2, 4, 9, 9), (6, 3, 3), {"dilation": [2, 3], "padding": [2, 1]}),
    ((2, 4, 6, 6), (6, 3, 3), {"groups": 2, "stride": [2, 2], "padding": [1, 1]}),
    ((1, 6, 5, 5), (6, 3, 3), {"groups": 6}),  # depthwise
    ((0, 3, 5, 5), (2, 3, 3), {}),             # empty batch
    ((2, 1, 1, 1), (3, 1, 1), {}),             # size-1 everything
    ((1, 2, 4, 5), (3, 4, 5), {}),             # kernel as large as the input
    ((1, 2, 5, 4), (3, 1, 1), {"stride": [3, 2], "padding": [0, 1], "dilation": [1, 1]}),
]


@pytest.mark.parametrize("xshape,wshape,attrs", CONV_CASES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dt", ["f32", "f64"])
def test_conv2d(xshape, wshape, attrs, bias, dt):
    g = attrs.get("groups", 1)
    o, kh, kw = wshape
    x = rand(xshape, dt)
    w = rand((o, xshape[1] // g, kh, kw), dt)
    ops = [x, w] + ([rand((o,), dt)] if bias else [])
    kw_ = {k: tuple(v) if isinstance(v, list) else v for k, v in attrs.items()}
    check_op("conv2d", ops, attrs, lambda *ts: F.conv2d(*ts, **kw_), rtol=1e-4 if dt == "f32" else None)


def test_conv2d_cost():
    g = build("conv2d", [partita.TensorType((2, 4, 6, 6), partita.dtypes.f32),
                         partita.TensorType((6, 2, 3, 3), partita.dtypes.f32)], {"groups": 2, "padding": [1, 1]})
    node = g.first
    cost = get_op("conv2d").cost_of([v.type for v in node.operands], [r.type for r in node.results], node.attrs)
    assert cost.flops == 2 * 2 * 6 * 6 * 6 * 2 * 3 * 3
    assert cost.bytes_read == (2 * 4 * 36 + 6 * 2 * 9) * 4 and cost.bytes_written == 2 * 6 * 36 * 4


def test_conv2d_errors():
    x = ("f32", (1, 4, 8, 8))
    expect_error("conv2d", [x, ("f32", (6, 3, 3, 3))], {}, "channel mismatch", "4 channels", "has 3")
    expect_error("conv2d", [x, ("f32", (6, 2, 3, 3))], {"groups": 3}, "not divisible by groups=3")
    expect_error("conv2d", [x, ("f32", (5, 2, 3, 3))], {"groups": 2}, "5 output channels", "groups=2")
    expect_error("conv2d", [x, ("f32", (6, 4, 3, 3)), ("f32", (5,))], {}, "bias must have shape [6]")
    expect_error("conv2d", [x, ("f32", (6, 4, 9, 3))], {}, "larger than the padded input")
    expect_error("conv2d", [x, ("f32", (6, 4, 3, 3))], {"stride": [2]}, "'stride' must be 2 integers")
    expect_error("conv2d", [x, ("f32", (6, 4, 3, 3))], {"stride": [0, 1]}, "'stride' must be >= 1")
    expect_error("conv2d", [x, ("f32", (6, 4, 3, 3))], {"padding": [-1, 0]}, "'padding' must be >= 0")
    expect_error("conv2d", [("f32", (4, 8, 8)), ("f32", (6, 4, 3, 3))], {}, "4-d", "add a batch dimension")
    expect_error("conv2d", [x, ("f64", (6, 4, 3, 3))], {}, "weight has dtype f64")


# --- pooling ---------------------------------------------------------------------------------

MAX_POOL_CASES = [
    ((2, 3, 8, 8), {"kernel": [2, 2]}),
    ((1, 2, 7, 9), {"kernel": [3, 2], "stride": [2, 3], "padding": [1, 1]}),
    ((1, 2, 9, 9), {"kernel": [3, 3], "dilation": [2, 2], "padding": [1, 1]}),
    ((1, 2, 9, 8), {"kernel": [4, 2], "dilation": [2, 3], "padding": [2, 0], "stride": [1, 2]}),
    ((1, 2, 7, 7), {"kernel": [2, 2], "ceil_mode": True}),
    ((1, 2, 8, 6), {"kernel": [3, 3], "stride": [2, 2], "padding": [1, 1], "ceil_mode": True}),
    ((1, 1, 5, 5), {"kernel": [2, 3], "stride": [3, 3], "padding": [1, 1], "dilation": [2, 1], "ceil_mode": True}),
    ((0, 3, 4, 4), {"kernel": [2, 2]}),
    ((2, 1, 1, 1), {"kernel": [1, 1]}),
]


def _pool_kwargs(attrs, *drop):
    out = {k: tuple(v) if isinstance(v, list) else v for k, v in attrs.items() if k not in drop}
    out["kernel_size"] = out.pop("kernel")
    return out


@pytest.mark.parametrize("shape,attrs", MAX_POOL_CASES)
@pytest.mark.parametrize("dt", ["f32", "f64", "i64"])
def test_max_pool2d(shape, attrs, dt):
    x = rand(shape, dt, -50, 50)
    check_op("max_pool2d", [x], attrs, lambda t: F.max_pool2d(t, **_pool_kwargs(attrs)))


AVG_POOL_CASES = [
    ((2, 3, 8, 8), {"kernel": [2, 2]}),
    ((1, 2, 7, 9), {"kernel": [3, 2], "stride": [2, 3], "padding": [1, 1]}),
    ((1, 2, 7, 9), {"kernel": [3, 2], "stride": [2, 3], "padding": [1, 1], "count_include_pad": False}),
    ((1, 2, 7, 7), {"kernel": [2, 2], "ceil_mode": True}),
    ((1, 2, 8, 6), {"kernel": [3, 3], "stride": [2, 2], "padding": [1, 1], "ceil_mode": True}),
    ((1, 2, 8, 6), {"kernel": [3, 3], "stride": [2, 2], "padding": [1, 1], "ceil_mode": True,
                    "count_include_pad": False}),
    ((1, 1, 5, 4), {"kernel": [4, 3], "stride": [3, 2], "padding": [2, 1], "ceil_mode": True}),
    ((0, 3, 4, 4), {"kernel": [2, 2]}),
    ((2, 1, 1, 1), {"kernel": [1, 1]}),
]


@pytest.mark.parametrize("shape,attrs", AVG_POOL_CASES)
@pytest.mark.parametrize("dt", ["f32", "f64"])
def test_avg_pool2d(shape, attrs, dt):
    x = rand(shape, dt)
    check_op("avg_pool2d", [x], attrs, lambda t: F.avg_pool2d(t, **_pool_kwargs(attrs)))


def test_pool_errors():
    x = ("f32", (1, 1, 4, 4))
    expect_error("max_pool2d", [x], {"kernel": [3, 3], "padding": [2, 0]}, "more than half the window", "at most 1")
    expect_error("avg_pool2d", [x], {"kernel": [2, 2], "padding": [0, 2]}, "more than half the window", "width")
    expect_error("max_pool2d", [("f32", (1, 1, 2, 2))], {"kernel": [3, 3]}, "does not fit", "0x0")
    expect_error("max_pool2d", [x], {}, "missing required attribute 'kernel'")
    expect_error("avg_pool2d", [x], {"kernel": [2, 2, 2]}, "'kernel' must be 2 integers")
    expect_error("avg_pool2d", [("i64", (1, 1, 4, 4))], {"kernel": [2, 2]}, "floating-point")
    expect_error("max_pool2d", [("f32", (4, 4))], {"kernel": [2, 2]}, "4-d")


# --- conv3d and conv_transpose2d/3d ------------------------------------------------------------

CONV3D_CASES = [
    # (N, C, D, H, W), (O, kD, kH, kW), attrs
    ((2, 3, 4, 5, 5), (4, 2, 3, 3), {}),
    ((1, 4, 5, 6, 7), (6, 2, 3, 2), {"stride": [1, 2, 3], "padding": [1, 0, 1], "dilation": [2, 1, 2], "groups": 2}),
    ((1, 2, 3, 3, 3), (2, 1, 1, 1), {"groups": 2}),
    ((0, 2, 3, 3, 3), (3, 2, 2, 2), {}),
]


@pytest.mark.parametrize("xshape,wshape,attrs", CONV3D_CASES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dt", ["f32", "f64"])
def test_conv3d(xshape, wshape, attrs, bias, dt):
    g = attrs.get("groups", 1)
    o, *k = wshape
    ops = [rand(xshape, dt), rand((o, xshape[1] // g, *k), dt)] + ([rand((o,), dt)] if bias else [])
    kw_ = {k_: tuple(v) if isinstance(v, list) else v for k_, v in attrs.items()}
    check_op("conv3d", ops, attrs, lambda *ts: F.conv3d(*ts, **kw_), rtol=1e-4 if dt == "f32" else None)


CONV_TRANSPOSE_CASES = [
    # x shape, (O/groups, kernel...), attrs
    ((2, 3, 4, 5), (2, 3, 3), {}),
    ((1, 4, 3, 4), (3, 3, 2), {"stride": [2, 3], "padding": [1, 0], "output_padding": [1, 2], "groups": 2}),
    ((1, 2, 3, 3), (1, 2, 2), {"dilation": [2, 3], "output_padding": [1, 0], "stride": [1, 2]}),
    ((2, 2, 3, 4, 3), (2, 2, 2, 3), {}),
    ((1, 4, 2, 3, 3), (1, 3, 2, 2), {"stride": [2, 1, 3], "padding": [1, 0, 1], "output_padding": [1, 0, 2],
                                     "dilation": [1, 2, 1], "groups": 4}),
    ((0, 2, 3, 3), (2, 2, 2), {}),
]


@pytest.mark.parametrize("xshape,wshape,attrs", CONV_TRANSPOSE_CASES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dt", ["f32", "f64"])
def test_conv_transpose(xshape, wshape, attrs, bias, dt):
    nd = len(xshape) - 2
    g = attrs.get("groups", 1)
    og, *k = wshape
    ops = [rand(xshape, dt), rand((xshape[1], og, *k), dt)] + ([rand((og * g,), dt)] if bias else [])
    kw_ = {k_: tuple(v) if isinstance(v, list) else v for k_, v in attrs.items()}
    fn = F.conv_transpose2d if nd == 2 else F.conv_transpose3d
    check_op(f"conv_transpose{nd}d", ops, attrs, lambda *ts: fn(*ts, **kw_), rtol=1e-4 if dt == "f32" else None)


def test_conv3d_and_conv_transpose_cost():
    f32 = partita.dtypes.f32
    g = build("conv3d", [partita.TensorType((2, 4, 5, 6, 6), f32), partita.TensorType((6, 2, 1, 3, 3), f32)],
              {"groups": 2, "padding": [0, 1, 1]})
    node = g.first
    cost = get_op("conv3d").cost_of([v.type for v in node.operands], [r.type for r in node.results], node.attrs)
    assert cost.flops == 2 * (2 * 6 * 5 * 6 * 6) * 2 * 9
    g = build("conv_transpose2d", [partita.TensorType((2, 4, 3, 3), f32), partita.TensorType((4, 3, 2, 2), f32)],
              {"stride": [2, 2]})
    node = g.first
    assert node.results[0].type.shape == (2, 3, 6, 6)
    cost = get_op("conv_transpose2d").cost_of([v.type for v in node.operands], [node.results[0].type], node.attrs)
    assert cost.flops == 2 * (2 * 4 * 9) * 3 * 4 and cost.bytes_written == 2 * 3 * 36 * 4


def test_conv3d_and_conv_transpose_errors():
    x = ("f32", (1, 4, 6, 6, 6))
    expect_error("conv3d", [x, ("f32", (6, 4, 3, 3))], {}, "weight must be 5-d")
    expect_error("conv3d", [x, ("f32", (6, 4, 3, 3, 3))], {"stride": [1, 1]}, "'stride' must be 3 integers",
                 "[depth, height, width]")
    expect_error("conv3d", [("f32", (4, 6, 6, 6)), ("f32", (6, 4, 3, 3, 3))], {}, "5-d", "add a batch dimension")
    expect_error("conv3d", [x, ("f32", (6, 4, 7, 3, 3))], {}, "larger than the padded input", "6x6x6")
    expect_error("conv3d", [x, ("f32", (6, 3, 3, 3, 3))], {}, "channel mismatch")
    xt = ("f32", (1, 4, 5, 5))
    expect_error("conv_transpose2d", [xt, ("f32", (3, 2, 3, 3))], {}, "channel mismatch", "has 3 in dim 0")
    expect_error("conv_transpose2d", [xt, ("f32", (4, 2, 3, 3))], {"groups": 3}, "not divisible by groups=3")
    expect_error("conv_transpose2d", [xt, ("f32", (4, 2, 3, 3))], {"output_padding": [1, 0]},
                 "output_padding [1, 0] must be smaller than the stride", "height")
    expect_error("conv_transpose2d", [xt, ("f32", (4, 2, 3, 3)), ("f32", (2,))], {"groups": 2},
                 "bias must have shape [4]")
    expect_error("conv_transpose2d", [xt, ("f32", (4, 2, 3, 3))], {"padding": [5, 0]}, "crops the whole output")
    expect_error("conv_transpose3d", [xt, ("f32", (4, 2, 3, 3))], {}, "must be 5-d")
    expect_error("conv_transpose2d", [xt, ("f64", (4, 2, 3, 3))], {}, "weight has dtype f64")


# --- 3-d pools, pools with indices, dilated average pools --------------------------------------

def _torch_kwargs(attrs, *drop):
    out = {k: tuple(v) if isinstance(v, list) else v for k, v in attrs.items() if k not in drop}
    out["kernel_size"] = out.pop("kernel")
    return out


MAX_POOL3D_CASES = [
    ((2, 2, 4, 4, 4), {"kernel": [2, 2, 2]}),
    ((1, 2, 5, 7, 6), {"kernel": [3, 2, 3], "stride": [2, 1, 2], "padding": [1, 1, 1], "dilation": [1, 2, 1]}),
    ((1, 1, 5, 5, 6), {"kernel": [2, 3, 2], "stride": [2, 2, 3], "padding": [1, 1, 0], "ceil_mode": True}),
    ((0, 2, 3, 3, 3), {"kernel": [2, 2, 2]}),
]


@pytest.mark.parametrize("shape,attrs", MAX_POOL3D_CASES)
@pytest.mark.parametrize("dt", ["f32", "i64"])
def test_max_pool3d(shape, attrs, dt):
    check_op("max_pool3d", [rand(shape, dt, -50, 50)], attrs, lambda t: F.max_pool3d(t, **_torch_kwargs(attrs)))


@pytest.mark.parametrize("shape,attrs", MAX_POOL_CASES + MAX_POOL3D_CASES)
@pytest.mark.parametrize("dt", ["f32", "f64", "i64"])
def test_max_pool_with_indices(shape, attrs, dt):
    nd = len(shape) - 2
    # A small integer range makes ties, which must pick the same (first) tap as PyTorch.
    x = rand(shape, dt, -3, 3)
    if dt != "i64":
        x = np.round(x)
    fn = F.max_pool2d if nd == 2 else F.max_pool3d
    check_op(f"max_pool{nd}d_with_indices", [x], attrs, lambda t: fn(t, **_torch_kwargs(attrs), return_indices=True))


def test_max_pool_indices_with_nan_and_minus_inf_follow_pytorch():
    x = rand((1, 2, 5, 5), "f32")
    x[0, 0, 1, 1] = x[0, 0, 1, 2] = np.nan   # the last NaN of a window is taken
    x[0, 1] = -np.inf                        # all -inf: the first tap inside the input
    attrs = {"kernel": [3, 3], "stride": [2, 2], "padding": [1, 1]}
    check_op("max_pool2d_with_indices", [x], attrs,
             lambda t: F.max_pool2d(t, **_torch_kwargs(attrs), return_indices=True))


AVG_POOL3D_CASES = [
    ((2, 2, 4, 4, 4), {"kernel": [2, 2, 2]}),
    ((1, 2, 5, 7, 6), {"kernel": [3, 2, 3], "stride": [2, 1, 2], "padding": [1, 1, 1]}),
    ((1, 2, 5, 7, 6), {"kernel": [3, 2, 3], "stride": [2, 1, 2], "padding": [1, 1, 1], "count_include_pad": False}),
    ((1, 1, 5, 5, 6), {"kernel": [2, 3, 2], "stride": [2, 2, 3], "padding": [1, 1, 0], "ceil_mode": True}),
]


@pytest.mark.parametrize("shape,attrs", AVG_POOL3D_CASES)
@pytest.mark.parametrize("dt", ["f32", "f64"])
def test_avg_pool3d(shape, attrs, dt):
    check_op("avg_pool3d", [rand(shape, dt)], attrs, lambda t: F.avg_pool3d(t, **_torch_kwargs(attrs)))


def _dilated_avg_pool_by_loops(x, kernel, stride, padding, dilation, ceil_mode, count_include_pad):
    """The dilated average pool written out tap by tap (the definition, in torch): a tap
    counts when it lies in the input, or in the padding with count_include_pad."""
    nd = x.dim() - 2
    size = x.shape[2:]
    out = []
    for i in range(nd):
        span = size[i] + 2 * padding[i] - dilation[i] * (kernel[i] - 1) - 1
        o = (-(-span // stride[i]) if ceil_mode else span // stride[i]) + 1
        if ceil_mode and (o - 1) * stride[i] >= size[i] + padding[i]:
            o -= 1
        out.append(o)
    y = torch.zeros(x.shape[:2] + tuple(out), dtype=x.dtype)
    for pos in itertools.product(*(range(o) for o in out)):
        total, count = torch.zeros(x.shape[:2], dtype=x.dtype), 0
        for tap in itertools.product(*(range(k) for k in kernel)):
            at = [pos[i] * stride[i] - padding[i] + tap[i] * dilation[i] for i in range(nd)]
            inside = all(0 <= at[i] < size[i] for i in range(nd))
            in_pad = all(-padding[i] <= at[i] < size[i] + padding[i] for i in range(nd))
            if inside:
                total = total + x[(slice(None), slice(None)) + tuple(at)]
            count += inside or (count_include_pad and in_pad)
        y[(slice(None), slice(None)) + pos] = total / max(count, 1)
    return y


DILATED_AVG_POOL_CASES = [
    ((1, 2, 4, 4), {"kernel": [2, 2], "stride": [1, 1], "dilation": [2, 2], "ceil_mode": True}),
    ((2, 1, 7, 6), {"kernel": [3, 2], "stride": [2, 1], "padding": [1, 1], "dilation": [2, 3]}),
    ((1, 2, 7, 8), {"kernel": [2, 3], "stride": [2, 3], "padding": [1, 1], "dilation": [3, 2], "ceil_mode": True}),
    ((1, 1, 6, 5, 7), {"kernel": [2, 3, 2], "stride": [3, 2, 2], "padding": [1, 1, 0], "dilation": [2, 1, 3],
                       "ceil_mode": True}),
]


@pytest.mark.parametrize("shape,attrs", DILATED_AVG_POOL_CASES)
@pytest.mark.parametrize("include", [True, False])
def test_avg_pool_with_dilation(shape, attrs, include):
    nd = len(shape) - 2
    attrs = dict(attrs, count_include_pad=include)
    geometry = (attrs["kernel"], attrs["stride"], attrs.get("padding", [0] * nd), attrs["dilation"],
                attrs.get("ceil_mode", False), include)
    check_op(f"avg_pool{nd}d", [rand(shape, "f64")], attrs, lambda t: _dilated_avg_pool_by_loops(t, *geometry))


def test_pool3d_and_indices_errors():
    x = ("f32", (1, 1, 4, 4, 4))
    expect_error("max_pool3d", [x], {"kernel": [2, 2]}, "'kernel' must be 3 integers")
    expect_error("avg_pool3d", [x], {"kernel": [2, 2, 2], "padding": [0, 0, 2]}, "more than half the window",
                 "width")
    expect_error("avg_pool3d", [x], {"kernel": [2, 5, 2]}, "does not fit", "4x4x4")
    expect_error("max_pool3d_with_indices", [("f32", (1, 4, 4, 4))], {"kernel": [2, 2, 2]}, "5-d")
    expect_error("max_pool2d_with_indices", [("bool", (1, 1, 4, 4))], {"kernel": [2, 2]}, "numeric")
    expect_error("avg_pool2d", [("f32", (1, 1, 4, 4))], {"kernel": [2, 2], "dilation": [0, 1]},
                 "'dilation' must be >= 1")


# --- batch_norm -------------------------------------------------------------------------------

def _bn_operands(c, dt):
    return [rand((c,), dt), rand((c,), dt), rand((c,), dt), rand((c,), dt, 0.5, 2.0)]


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5), (2, 3, 4, 4), (0, 3, 2, 2), (1, 1, 1, 2)])
@pytest.mark.parametrize("dt", ["f32", "f64"])
def test_batch_norm_inference(shape, dt):
    x = rand(shape, dt)
    check_op("batch_norm", [x, *_bn_operands(shape[1], dt)], {"eps": 1e-3},
             lambda t, w, b, rm, rv: F.batch_norm(t, rm, rv, w, b, False, 0.1, 1e-3))


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 4, 4), (1, 2, 1, 3), (0, 3, 2)])
@pytest.mark.parametrize("dt", ["f32", "f64"])
def test_batch_norm_training_returns_new_running_stats(shape, dt):
    x = rand(shape, dt)

    def eager(t, w, b, rm, rv):
        rm, rv = rm.clone(), rv.clone()
        return F.batch_norm(t, rm, rv, w, b, True, 0.3, 1e-5), rm, rv

    check_op("batch_norm", [x, *_bn_operands(shape[1], dt)], {"training": True, "momentum": 0.3}, eager)


def test_batch_norm_errors():
    stat = ("f32", (3,))
    expect_error("batch_norm", [("f32", (2, 3, 4)), stat, stat, ("f32", (4,)), stat], {},
                 "running_mean must have shape [3]")
    expect_error("batch_norm", [("f32", (2, 3)), stat, stat, stat, ("f64", (3,))], {}, "running_var has dtype f64")
    expect_error("batch_norm", [("f32", (1, 3)), stat, stat, stat, stat], {"training": True},
                 "more than 1 value per channel")
    expect_error("batch_norm", [("f32", (3,)), stat, stat, stat, stat], {}, "at least 2-d")


# --- dropout -------------------------------------------------------------------------------

def _dropout_graph(shape, dt="f32", **attrs):
    attrs.setdefault("train", True)
    return build("dropout", [partita.TensorType(shape, getattr(partita.dtypes, dt))], attrs)


@pytest.mark.parametrize("dt", ["f32", "f64", "bf16"])
def test_dropout_eval_is_identity_and_pure(dt):
    x = rand((3, 0, 2) if dt == "bf16" else (4, 5), dt)
    check_op("dropout", [x], {"train": False, "p": 0.7}, lambda t: t)
    op = get_op("dropout")
    assert op.effects_of(op.normalize_attrs({"train": False})) == frozenset()
    assert op.effects_of(op.normalize_attrs({})) == frozenset()  # train defaults to false: inference
    assert op.effects_of(op.normalize_attrs({"train": True})) == frozenset({"rng"})


@pytest.mark.parametrize("shape,p,dt", [((64, 33), 0.3, "f32"), ((7,), 0.5, "f64"), ((2, 3, 4), 0.9, "f16"),
                                        ((0, 4), 0.5, "f32"), ((), 0.5, "f64")])
def test_dropout_train_masks_agree_across_executors(shape, p, dt):
    g = _dropout_graph(shape, dt, p=p, seed=1234)
    x = rand(shape, dt, 0.5, 2.0)  # nonzero, so a zero in the result always means "dropped"
    a = partita.run(g, [x], backend="numpy")[0]
    b = _np(partita.run(g, [x], backend="torch")[0])
    assert a.dtype == b.dtype == x.dtype and a.shape == b.shape == x.shape
    np.testing.assert_array_equal(a == 0, b == 0)
    kept = a != 0
    np.testing.assert_array_equal(a[kept], b[kept])
    want = (x.astype(np.float64) / (1 - p)).astype(x.dtype)
    np.testing.assert_allclose(a[kept].astype(np.float64), want[kept].astype(np.float64), rtol=2e-3)


def test_dropout_seed_controls_the_mask_and_keep_fraction_is_1_minus_p():
    x = np.ones((200, 100), np.float32)
    masks = {}
    for seed in (0, 1, 2 ** 40):
        g = _dropout_graph(x.shape, p=0.25, seed=seed)
        m1 = partita.run(g, [x], backend="numpy")[0] != 0
        m2 = partita.run(g, [x], backend="numpy")[0] != 0
        np.testing.assert_array_equal(m1, m2)  # same seed, same mask
        masks[seed] = m1
        frac = m1.mean()
        assert abs(frac - 0.75) < 0.015, f"seed {seed}: kept {frac:.4f}, expected about 0.75"
    assert (masks[0] != masks[1]).mean() > 0.2
    assert (masks[0] != masks[2 ** 40]).mean() > 0.2  # the high half of the seed matters too
    # Neighbouring elements are not correlated (a weak check of the hash's mixing).
    m = masks[0].reshape(-1).astype(np.float64)
    assert abs(np.corrcoef(m[:-1], m[1:])[0, 1]) < 0.05


def test_dropout_p_zero_and_one():
    x = rand((5, 6), "f32")
    x[0, 0] = np.nan
    for backend in ("numpy", "torch"):
        np.testing.assert_array_equal(_np(partita.run(_dropout_graph(x.shape, p=0.0), [x], backend=backend)[0]), x)
        np.testing.assert_array_equal(_np(partita.run(_dropout_graph(x.shape, p=1.0), [x], backend=backend)[0]),
                                      np.zeros_like(x))


def test_dropout_hash_identical_for_huge_indices():
    # Flat indices beyond 2**32 must hash the same in NumPy and torch (and not overflow).
    idx = np.array([0, 1, 2 ** 32 - 1, 2 ** 32, 2 ** 33 + 5, 2 ** 40 + 3], np.int64)
    for seed in (0, -1, 2 ** 63 - 1):
        k0, k1 = nn_ops._dropout_keys(seed)
        a = nn_ops._dropout_hash(idx, k0, k1)
        b = nn_ops._dropout_hash(torch.from_numpy(idx), k0, k1).numpy()
        np.testing.assert_array_equal(a, b)
        assert a.min() >= 0 and a.max() < 2 ** 32


def test_dropout_errors():
    expect_error("dropout", [("f32", (3,))], {"p": 1.5}, "between 0 and 1", "1.5")
    expect_error("dropout", [("i64", (3,))], {}, "floating-point")


# --- cross_entropy ----------------------------------------------------------------------------

def _targets(shape, ncls, ignore=None, frac=0.0):
    t = rand(shape, "i64", 0, ncls - 1)
    if ignore is not None and t.size:
        t[rand(shape, "f64", 0, 1) < frac] = ignore
    return t


@pytest.mark.parametrize("lshape", [(5, 4), (3, 4, 6), (2, 3, 2, 2), (4,), (1, 1), (0, 3)])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
@pytest.mark.parametrize("dt", ["f32", "f64"])
def test_cross_entropy(lshape, reduction, label_smoothing, dt):
    logits = rand(lshape, dt)
    cdim = 1 if len(lshape) >= 2 else 0
    tshape = lshape[:cdim] + lshape[cdim + 1:]
    target = _targets(tshape, lshape[cdim], ignore=-100, frac=0.3)
    attrs = {"reduction": reduction, "label_smoothing": label_smoothing}
    check_op("cross_entropy", [logits, target], attrs,
             lambda l, t: F.cross_entropy(l, t, reduction=reduction, label_smoothing=label_smoothing))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_custom_ignore_index(reduction):
    logits = rand((6, 5, 3), "f64")
    target = _targets((6, 3), 5, ignore=2, frac=0.4)
    attrs = {"reduction": reduction, "ignore_index": 2, "label_smoothing": 0.1}
    check_op("cross_entropy", [logits, target], attrs,
             lambda l, t: F.cross_entropy(l, t, ignore_index=2, reduction=reduction, label_smoothing=0.1))


def test_cross_entropy_all_ignored_mean_is_nan():
    logits, target = rand((3, 4), "f32"), np.full((3,), -100, np.int64)
    out = check_op("cross_entropy", [logits, target], {}, lambda l, t: F.cross_entropy(l, t))[0]
    assert np.isnan(out)


def test_cross_entropy_errors():
    expect_error("cross_entropy", [("f32", (4, 3)), ("i32", (4,))], {}, "i64", "i32[4]")
    expect_error("cross_entropy", [("f32", (4, 3, 2)), ("i64", (4, 3))], {}, "must have shape [4,2]")
    expect_error("cross_entropy", [("i64", (4, 3)), ("i64", (4,))], {}, "logits must have a floating-point")
    expect_error("cross_entropy", [("f32", (4, 3)), ("i64", (4,))], {"label_smoothing": -0.1}, "label_smoothing")
    expect_error("cross_entropy", [("f32", (4, 3)), ("i64", (4,))], {"reduction": "avg"}, "'mean', 'sum', 'none'")
    g = build("cross_entropy", [partita.TensorType((2, 3), partita.dtypes.f32),
                                partita.TensorType((2,), partita.dtypes.i64)])
    for backend in ("numpy", "torch"):
        with pytest.raises(ExecutionError, match="cross_entropy"):
            partita.run(g, [rand((2, 3)), np.array([0, 3])], backend=backend)


# --- records ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["softmax", "log_softmax", "layer_norm", "rms_norm", "embedding", "conv2d",
                                  "max_pool2d", "avg_pool2d", "batch_norm", "dropout", "cross_entropy"])
def test_records_are_documented_and_located(name):
    op = get_op(name)
    assert op.doc and op.defined_at is not None and op.defined_at.file.endswith("nn.py")


# --- attention ---------------------------------------------------------------------------------

def _attention_lse(q, k, mask, causal, scale):
    """torch.logsumexp of the scaled, masked scores, computed in f64 (the oracle for lse)."""
    s = q.double() @ k.double().transpose(-1, -2) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.double()
    lse = torch.logsumexp(s, -1)
    return lse.to(torch.float64 if q.dtype == torch.float64 else torch.float32)


def _sdpa_with_lse(causal=False, scale=None):
    def fn(q, k, v, mask=None):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)
        return out, _attention_lse(q, k, mask, causal, scale)
    return fn


def _attention_mask(kind, shape, dt):
    if kind is None:
        return []
    if kind == "bool":
        m = rand(shape, "bool")
        m[..., 0] = True  # every row keeps a score (torch.logsumexp of an empty row is -inf)
        return [m]
    return [rand(shape, dt, -2.0, 2.0)]


# (q shape, Tk, Ev, mask kind, mask shape, causal, scale)
ATTENTION_CASES = [
    ((2, 3, 5, 8), 7, 8, None, None, False, None),        # the flash kernel, 4-d
    ((2, 2, 6, 8), 6, 8, None, None, True, None),
    ((1, 2, 7, 4), 5, 4, None, None, True, 0.3),          # causal with Tq > Tk (top-left aligned)
    ((2, 3, 5, 4), 7, 4, "float", (2, 1, 5, 7), False, 0.5),
    ((2, 3, 5, 4), 7, 4, "bool", (5, 7), False, None),
    ((2, 3, 5, 4), 7, 4, "bool", (2, 1, 1, 7), True, None),  # causal and a mask: both apply
    ((3, 5, 4), 7, 4, "bool", (5, 7), False, None),       # 3-d: reshaped to 4-d for the kernel
    ((3, 5, 4), 7, 4, "float", (3, 1, 7), False, None),
    ((2, 2, 3, 5, 4), 6, 4, "float", (2, 1, 1, 5, 6), False, None),  # 5-d
    ((5, 4), 7, 4, "float", (7,), False, 1.5),             # 2-d, 1-d mask
    ((2, 3, 5, 4), 7, 6, "bool", (1, 3, 5, 7), False, None),  # Ev != E: the formula in torch ops
    ((3, 5, 4), 6, 2, None, None, True, None),
]


@pytest.mark.parametrize("dt", ["f32", "f64"])
@pytest.mark.parametrize("case", ATTENTION_CASES, ids=[str(i) for i in range(len(ATTENTION_CASES))])
def test_attention_matches_sdpa(case, dt):
    qs, tk, ev, kind, mshape, causal, scale = case
    q = rand(qs, dt, -1.5, 1.5)
    k, v = rand(qs[:-2] + (tk, qs[-1]), dt, -1.5, 1.5), rand(qs[:-2] + (tk, ev), dt, -1.5, 1.5)
    attrs = {"causal": causal} if scale is None else {"causal": causal, "scale": scale}
    check_op("attention", [q, k, v, *_attention_mask(kind, mshape, dt)], attrs, _sdpa_with_lse(causal, scale))


@pytest.mark.parametrize("dt", ["bf16", "f16"])
def test_attention_low_precision(dt):
    q, k, v = rand((2, 2, 5, 8), dt, -1, 1), rand((2, 2, 6, 8), dt, -1, 1), rand((2, 2, 6, 8), dt, -1, 1)
    check_op("attention", [q, k, v], {"causal": True}, _sdpa_with_lse(True), **LOOSE[dt])
    # Ev != E takes the fallback, computed in f32 as the kernel does.
    check_op("attention", [q, k, v[..., :4]], {}, _sdpa_with_lse(), **LOOSE[dt])


def test_attention_row_with_every_score_masked_gives_zeros():
    q, k, v = rand((1, 2, 4, 4)), rand((1, 2, 5, 4)), rand((1, 2, 5, 4))
    mask = rand((4, 5), "bool")
    mask[:, 0] = True
    mask[2] = False

    def fn(q, k, v, m):
        out, lse = _sdpa_with_lse()(q, k, v, m)
        return out, lse.masked_fill(lse == float("-inf"), 0.0)

    out, lse = check_op("attention", [q, k, v, mask], {}, fn)
    assert not out[:, :, 2].any() and not lse[:, :, 2].any()
    # The same through the fallback (Ev != E).
    out, lse = check_op("attention", [q, k, v[..., :3], mask], {}, fn)
    assert not out[:, :, 2].any() and not lse[:, :, 2].any()


@pytest.mark.parametrize("tq, tk", [(0, 5), (4, 0)])
def test_attention_empty(tq, tk):
    # The flash kernel cannot take an empty dim (it crashes); both executors use the formula.
    q, k, v = rand((2, tq, 4)), rand((2, tk, 4)), rand((2, tk, 3))
    g = build("attention", [partita.TensorType(a.shape, partita.dtypes.f32) for a in (q, k, v)])
    for backend in ("numpy", "torch"):
        out, lse = (_np(r) for r in partita.run(g, [q, k, v], backend=backend))
        assert out.shape == (2, tq, 3) and lse.shape == (2, tq)
        assert not out.any() and not lse.any()


def test_attention_types_and_cost():
    out, lse = build("attention", [partita.TensorType((2, 3, 5, 8), partita.dtypes.bf16),
                                   partita.TensorType((2, 3, 7, 8), partita.dtypes.bf16),
                                   partita.TensorType((2, 3, 7, 6), partita.dtypes.bf16)]).outputs
    assert str(out.type) == "bf16[2,3,5,6]" and str(lse.type) == "f32[2,3,5]"
    op = get_op("attention")
    ins = [partita.TensorType(s, partita.dtypes.f32) for s in ((2, 5, 8), (2, 7, 8), (2, 7, 6))]
    cost = op.cost_of(ins, [], op.normalize_attrs({}))
    assert cost.flops == 2 * (2 * 5 * 7) * (8 + 6) + 5 * (2 * 5 * 7)  # both matmuls, then the softmax


def test_attention_errors():
    ok_k = ("f32", (2, 3, 7, 8))
    expect_error("attention", [("i32", (2, 3, 5, 8)), ("i32", (2, 3, 7, 8)), ("i32", (2, 3, 7, 8))], {},
                 "floating-point")
    expect_error("attention", [("f32", (2, 3, 5, 8)), ("f64", (2, 3, 7, 8)), ok_k], {}, "cast the key k to f32")
    expect_error("attention", [("f32", (8,)), ("f32", (8,)), ("f32", (8,))], {}, "rank 2 or more")
    expect_error("attention", [("f32", (2, 3, 5, 8)), ("f32", (3, 7, 8)), ok_k], {}, "same rank")
    expect_error("attention", [("f32", (2, 3, 5, 8)), ("f32", (2, 1, 7, 8)), ok_k], {},
                 "batch/head dims of k", "[2,1]", "[2,3]")
    expect_error("attention", [("f32", (2, 3, 5, 8)), ("f32", (2, 3, 7, 4)), ok_k], {}, "head size 4")
    expect_error("attention", [("f32", (2, 3, 5, 8)), ok_k, ("f32", (2, 3, 6, 8))], {}, "6 keys", "has 7")
    expect_error("attention", [("f32", (2, 0)), ("f32", (3, 0)), ("f32", (3, 2))], {}, "head size 0")
    expect_error("attention", [("f32", (2, 3, 5, 8)), ok_k, ok_k, ("f64", (5, 7))], {}, "must be bool",
                 "cast it")
    expect_error("attention", [("f32", (2, 3, 5, 8)), ok_k, ok_k, ("bool", (5, 6))], {}, "does not broadcast",
                 "[2,3,5,7]")
    expect_error("attention", [("f32", (2, 3, 5, 8)), ok_k, ok_k, ("bool", (1, 2, 3, 5, 7))], {},
                 "does not broadcast")
    expect_error("attention", [("f32", (2, 3, 5, 8)), ok_k, ok_k], {"scale": "big"}, "'scale' must be a number")


def test_attention_record_is_documented_and_located():
    op = get_op("attention")
    assert "scaled_dot_product_attention" in op.doc and op.defined_at.file.endswith("nn.py")
