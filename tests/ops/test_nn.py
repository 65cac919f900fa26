"""Tests of the nn op family against PyTorch eager on both executors."""

from __future__ import annotations

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
