"""Every differentiable op's vjp rule, checked three ways, generated from the registry.

For each op with a vjp rule, each sample below builds a one-node graph whose float operands
are ``param`` inputs and whose loss is ``sum(result * cotangent)`` over its float results,
runs the ``grad`` pass, and checks the gradients:

- against ``torch.autograd.grad`` through the op record's own torch implementation (f32, both
  executors);
- against central finite differences of the loss on the NumPy reference interpreter in f64
  (a directional derivative along a random direction per operand).

``test_every_op_is_accounted_for`` makes the table complete: a new op must get a vjp rule
(and a sample here) or be declared not differentiable.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import partita
from partita.autodiff import grad
from partita.autodiff.grad import NOT_DIFFERENTIABLE
from partita.backend.torch_exec import TorchProgram
from partita.ir import Builder, Graph, TensorType, verify
from partita.ir.dtypes import DTYPES
from partita.ops.registry import OPS

# Operand specs: ("f", shape) normal floats; ("pos", shape) floats in [0.5, 2]; ("unit", shape)
# floats in (-0.9, 0.9); ("gt1", shape) floats in [1.2, 3]; ("idx", shape, high) i64 in [0, high);
# ("bool", shape) random mask.
SAMPLES: dict[str, list[tuple[list, dict]]] = {
    "add": [([("f", (3, 4)), ("f", (4,))], {}), ([("f", (2, 1, 3)), ("f", (4, 1))], {})],
    "sub": [([("f", (3, 4)), ("f", (3, 1))], {})],
    "mul": [([("f", (3, 4)), ("f", (1, 4))], {}), ([("f", ()), ("f", (2, 3))], {})],
    "div": [([("f", (3, 4)), ("pos", (4,))], {})],
    "pow": [([("pos", (3, 4)), ("f", (3, 4))], {}), ([("pos", (2, 3)), ("f", ())], {})],
    "maximum": [([("f", (3, 4)), ("f", (4,))], {})],
    "minimum": [([("f", (3, 4)), ("f", (3, 4))], {})],
    "neg": [([("f", (3, 4))], {})],
    "abs": [([("f", (3, 4))], {})],
    "exp": [([("f", (3, 4))], {})],
    "log": [([("pos", (3, 4))], {})],
    "sqrt": [([("pos", (3, 4))], {})],
    "rsqrt": [([("pos", (3, 4))], {})],
    "sin": [([("f", (3, 4))], {})],
    "cos": [([("f", (3, 4))], {})],
    "erf": [([("f", (3, 4))], {})],
    "tanh": [([("f", (3, 4))], {})],
    "sigmoid": [([("f", (3, 4))], {})],
    "relu": [([("f", (3, 4))], {})],
    "silu": [([("f", (3, 4))], {})],
    "gelu": [([("f", (3, 4))], {}), ([("f", (3, 4))], {"approximate": "tanh"})],
    "softmax": [([("f", (3, 5))], {}), ([("f", (2, 3, 4))], {"axis": 1})],
    "log_softmax": [([("f", (3, 5))], {}), ([("f", (2, 3, 4))], {"axis": 0})],
    "cast": [([("f", (3, 4))], {"dtype": "f64"})],
    "where": [([("bool", (3, 4)), ("f", (3, 4)), ("f", (4,))], {})],
    "dropout": [([("f", (8, 16))], {"p": 0.3, "train": True, "seed": 7}), ([("f", (3, 4))], {})],
    "sum": [([("f", (3, 4, 5))], {"axes": [1]}), ([("f", (3, 4))], {}), ([("f", (3, 4))], {"axes": [0], "keepdim": True})],
    "mean": [([("f", (3, 4, 5))], {"axes": [0, 2]}), ([("f", (3, 4))], {})],
    "max": [([("f", (3, 4, 5))], {"axes": [1]}), ([("f", (3, 4))], {})],
    "min": [([("f", (3, 4))], {"axes": [1], "keepdim": True})],
    "prod": [([("pos", (3, 4))], {"axes": [1]}), ([("pos", (2, 3))], {})],
    "cumsum": [([("f", (3, 4))], {"axis": 1}), ([("f", (5,))], {"axis": 0})],
    "matmul": [([("f", (3, 4)), ("f", (4, 5))], {}), ([("f", (2, 3, 4)), ("f", (4, 5))], {}),
               ([("f", (4,)), ("f", (2, 4, 3))], {}), ([("f", (2, 1, 3, 4)), ("f", (5, 4, 2))], {}),
               ([("f", (4,)), ("f", (4,))], {}), ([("f", (1, 3, 4)), ("f", (2, 4, 2))], {})],
    "reshape": [([("f", (3, 4))], {"shape": [2, 6]})],
    "squeeze": [([("f", (3, 1, 4))], {"axes": [1]})],
    "unsqueeze": [([("f", (3, 4))], {"axes": [0, 2]})],
    "broadcast_to": [([("f", (3, 1))], {"shape": [2, 3, 4]})],
    "transpose": [([("f", (2, 3, 4))], {"perm": [2, 0, 1]}), ([("f", (3, 4))], {})],
    "concat": [([("f", (2, 3)), ("f", (4, 3))], {"axis": 0})],
    "split": [([("f", (5, 3))], {"axis": 0, "sizes": [2, 3]})],
    "slice": [([("f", (7, 3))], {"axis": 0, "start": 1, "end": 6, "step": 2}), ([("f", (3, 5))], {"axis": -1, "start": -3})],
    "pad": [([("f", (3, 4))], {"pads": [1, 0, 2, 3]})],
    "gather": [([("f", (4, 5)), ("idx", (3, 5), 4)], {"axis": 0})],
    "topk": [([("f", (4, 5))], {"k": 2}), ([("f", (3, 4, 2))], {"k": 3, "axis": 1, "largest": False})],
    "sort": [([("f", (3, 5))], {"axis": 1, "descending": True})],
    "index_select": [([("f", (4, 5)), ("idx", (6,), 5)], {"axis": 1})],
    "embedding": [([("f", (10, 4)), ("idx", (2, 3), 10)], {})],
    "layer_norm": [([("f", (3, 8)), ("f", (8,)), ("f", (8,))], {}), ([("f", (2, 3, 4))], {"axes": [-2, -1]}),
                   ([("f", (3, 8)), ("f", (8,))], {})],
    "rms_norm": [([("f", (3, 8)), ("f", (8,))], {"eps": 1e-6}), ([("f", (2, 3, 4))], {})],
    "conv2d": [([("f", (2, 3, 6, 6)), ("f", (4, 3, 3, 3)), ("f", (4,))], {"stride": [2, 1], "padding": [1, 1]}),
               ([("f", (1, 4, 5, 5)), ("f", (4, 2, 2, 2))], {"groups": 2, "dilation": [2, 1]})],
    "conv3d": [([("f", (1, 2, 4, 5, 4)), ("f", (3, 2, 2, 3, 2)), ("f", (3,))], {"stride": [1, 2, 1], "padding": [1, 0, 1]})],
    "conv_transpose2d": [([("f", (2, 4, 3, 3)), ("f", (4, 3, 3, 3)), ("f", (3,))],
                          {"stride": [2, 2], "padding": [1, 0], "output_padding": [1, 0]}),
                         ([("f", (1, 4, 3, 4)), ("f", (4, 1, 2, 2))], {"groups": 2, "dilation": [2, 1]})],
    "conv_transpose3d": [([("f", (1, 2, 2, 3, 2)), ("f", (2, 3, 2, 2, 2))], {"stride": [2, 1, 2]})],
    "max_pool3d": [([("f", (1, 2, 4, 4, 4))], {"kernel": [2, 2, 2]})],
    "avg_pool3d": [([("f", (1, 2, 4, 5, 4))], {"kernel": [2, 3, 2], "stride": [1, 2, 2], "padding": [1, 1, 0]})],
    "max_pool2d_with_indices": [([("f", (2, 3, 6, 6))], {"kernel": [3, 3], "stride": [2, 2], "padding": [1, 1]})],
    "max_pool3d_with_indices": [([("f", (1, 2, 4, 4, 4))], {"kernel": [2, 2, 2]})],
    "max_pool2d": [([("f", (2, 3, 6, 6))], {"kernel": [2, 2]}),
                   ([("f", (1, 2, 7, 7))], {"kernel": [3, 3], "stride": [2, 2], "padding": [1, 1], "ceil_mode": True})],
    "avg_pool2d": [([("f", (2, 3, 6, 6))], {"kernel": [2, 2]}),
                   ([("f", (1, 2, 7, 7))], {"kernel": [3, 3], "stride": [2, 2], "padding": [1, 1],
                                            "count_include_pad": False}),
                   ([("f", (1, 2, 7, 7))], {"kernel": [2, 2], "dilation": [2, 2], "ceil_mode": True})],
    "batch_norm": [([("f", (4, 3, 2, 2)), ("f", (3,)), ("f", (3,)), ("const", np.zeros(3)), ("const", np.ones(3))],
                    {"training": True}),
                   ([("f", (4, 3)), ("f", (3,)), ("f", (3,)), ("const", np.full(3, 0.1)), ("const", np.full(3, 2.0))],
                    {})],
    "scatter_add": [([("f", (4, 5)), ("idx", (3, 5), 4), ("f", (3, 5))], {"axis": 0})],
    "index_add": [([("f", (4, 5)), ("idx", (6,), 5), ("f", (4, 6))], {"axis": 1})],
    "scatter_elements": [([("f", (4, 5)), ("idx", (3, 5), 4), ("f", (3, 5))], {"axis": 0, "reduction": "add"}),
                         ([("f", (4, 5)), ("idx", (1, 5), 4), ("f", (1, 5))], {"axis": 0})],
    "cumprod": [([("f", (3, 4))], {"axis": 1}), ([("f", (5,))], {"axis": 0}), ([("f", (2, 3, 2))], {"axis": 1})],
    "cross_entropy": [([("f", (4, 5)), ("idx", (4,), 5)], {}),
                      ([("f", (2, 5, 3)), ("idx", (2, 3), 5)], {"reduction": "sum", "label_smoothing": 0.1}),
                      ([("f", (4, 5)), ("idx", (4,), 5)], {"reduction": "none"})],
    "attention": [([("f", (2, 3, 5, 4)), ("f", (2, 3, 6, 4)), ("f", (2, 3, 6, 4))], {}),
                  ([("f", (2, 3, 5, 4)), ("f", (2, 3, 5, 4)), ("f", (2, 3, 5, 4))], {"causal": True, "scale": 0.4}),
                  ([("f", (3, 5, 4)), ("f", (3, 6, 4)), ("f", (3, 6, 3))], {"causal": True}),
                  ([("f", (2, 5, 4)), ("f", (2, 6, 4)), ("f", (2, 6, 4)), ("bool", (5, 6))], {}),
                  ([("f", (2, 2, 5, 4)), ("f", (2, 2, 6, 4)), ("f", (2, 2, 6, 4)),
                    ("const", np.linspace(-2.0, 1.0, 12).reshape(2, 1, 1, 6))], {}),
                  # a learned additive bias (relative position bias): broadcast over the batch,
                  # over the heads, and a rank-2 one under the causal mask
                  ([("f", (2, 3, 5, 4)), ("f", (2, 3, 6, 4)), ("f", (2, 3, 6, 4)), ("f", (3, 5, 6))], {}),
                  ([("f", (2, 2, 5, 4)), ("f", (2, 2, 6, 4)), ("f", (2, 2, 6, 4)), ("f", (2, 1, 5, 6))],
                   {"scale": 0.3}),
                  ([("f", (2, 3, 5, 4)), ("f", (2, 3, 5, 4)), ("f", (2, 3, 5, 4)), ("f", (5, 5))],
                   {"causal": True, "scale": 0.4})],
    "masked_softmax": [([("f", (2, 3, 5, 5))], {"causal": True, "scale": 0.4}),
                       ([("f", (3, 5, 6))], {"causal": True}),
                       ([("f", (2, 5, 6)), ("bool", (5, 6))], {"scale": 2.0}),
                       ([("f", (2, 2, 5, 6)), ("const", np.linspace(-2.0, 1.0, 12).reshape(2, 1, 1, 6))],
                        {"causal": True})],
    **{n: [([("f", (3, 4))], {})] for n in ("tan", "atan", "sinh", "cosh", "asinh")},
    **{n: [([("unit", (3, 4))], {})] for n in ("asin", "acos", "atanh")},
    "acosh": [([("gt1", (3, 4))], {})],
    # The divisor kept away from the quotient's jumps: the samples' a / b are not near integers.
    "remainder": [([("f", (3, 4)), ("pos", (4,))], {})],
    "fmod": [([("f", (3, 4)), ("pos", (3, 4))], {})],
}


def _array(spec, dt: str, rng: np.random.Generator) -> np.ndarray:
    kind = spec[0]
    npdt = DTYPES[dt].np
    if kind == "f":
        return rng.standard_normal(spec[1]).astype(npdt)
    if kind == "pos":
        return rng.uniform(0.5, 2.0, spec[1]).astype(npdt)
    if kind == "unit":
        return rng.uniform(-0.9, 0.9, spec[1]).astype(npdt)
    if kind == "gt1":
        return rng.uniform(1.2, 3.0, spec[1]).astype(npdt)
    if kind == "idx":
        return rng.integers(0, spec[2], spec[1]).astype(np.int64)
    if kind == "bool":
        return rng.random(spec[1]) < 0.5
    if kind == "const":
        return np.asarray(spec[1], dtype=npdt)
    raise AssertionError(kind)


def _is_diff(spec) -> bool:
    return spec[0] in ("f", "pos", "unit", "gt1")


def _build(op: str, arrays: list[np.ndarray], specs, attrs: dict, dt: str, rng) -> tuple[Graph, dict, list]:
    """Graph: params/inputs -> op -> loss = sum_k sum(result_k * cot_k). Returns graph, feed, cots."""
    g = Graph(f"{op}_grad")
    b = Builder(g)
    vals, feed = [], {}
    for i, (a, s) in enumerate(zip(arrays, specs)):
        from partita.ir.dtypes import from_numpy
        t = TensorType(a.shape, from_numpy(a.dtype))
        name = f"a{i}"
        role = "param" if _is_diff(s) else "input"
        vals.append(b.input(name, t, role))
        feed[name] = a
    if "dtype" in attrs:
        attrs = dict(attrs, dtype=DTYPES[attrs["dtype"]])
    res = b.emit(op, *vals, **attrs)
    res = res if isinstance(res, tuple) else (res,)
    loss = None
    cots = []
    for k, r in enumerate(res):
        if not r.type.dtype.is_float:
            continue
        if op == "batch_norm" and k > 0:
            continue  # running statistics: state, not differentiated
        if op == "attention" and k > 0:
            continue  # lse: read by the backward (test_attention_lse_gradient covers its gradient)
        c = rng.standard_normal(r.type.shape).astype(r.type.dtype.np)
        cv = b.input(f"cot{k}", r.type)
        feed[f"cot{k}"] = c
        cots.append(c)
        term = b.sum(b.mul(r, cv))
        if term.type.dtype != DTYPES[dt]:
            term = b.cast(term, dtype=DTYPES[dt])
        loss = term if loss is None else b.add(loss, term)
    b.ret(loss)
    return g, feed, cots


def _torch_grads(op: str, arrays, specs, attrs, cots) -> list:
    opdef = OPS[op]
    g = Graph("tmp")
    attrs_n = opdef.normalize_attrs(dict(attrs, dtype=DTYPES[attrs["dtype"]]) if "dtype" in attrs else attrs)
    del g
    ts = [torch.tensor(a, requires_grad=_is_diff(s)) for a, s in zip(arrays, specs)]
    out = opdef.torch(ts, attrs_n)
    out = out if isinstance(out, (tuple, list)) else (out,)
    if op == "batch_norm":
        out = out[:1]
    loss = sum((o * torch.tensor(c)).sum() for o, c in zip(out, cots))
    diff = [t for t, s in zip(ts, specs) if _is_diff(s)]
    return [x.numpy() for x in torch.autograd.grad(loss, diff, allow_unused=False)]


CASES = [(op, i) for op, samples in SAMPLES.items() for i in range(len(samples))]


@pytest.mark.parametrize("op, i", CASES, ids=[f"{op}-{i}" for op, i in CASES])
def test_vjp_matches_torch_autograd(op, i):
    specs, attrs = SAMPLES[op][i]
    rng = np.random.default_rng(i + 17 * len(op))
    arrays = [_array(s, "f32", rng) for s in specs]
    g, feed, cots = _build(op, arrays, specs, attrs, "f32", rng)
    res = grad(g)
    verify(g)
    want = _torch_grads(op, arrays, specs, attrs, cots)
    names = [f"a{k}" for k, s in enumerate(specs) if _is_diff(s)]
    assert list(res.grads) == names
    got_np = partita.run(g, feed)[1:]
    got_t = [t.numpy() for t in TorchProgram(g)(feed)[1:]]
    for name, w, a, t in zip(names, want, got_np, got_t):
        scale = max(1.0, float(np.abs(w).max()) if w.size else 1.0)
        np.testing.assert_allclose(a, w, rtol=1e-4, atol=1e-5 * scale, err_msg=f"{op} d{name} (numpy)")
        np.testing.assert_allclose(t, w, rtol=1e-4, atol=1e-5 * scale, err_msg=f"{op} d{name} (torch)")


@pytest.mark.parametrize("op, i", CASES, ids=[f"{op}-{i}" for op, i in CASES])
def test_vjp_matches_finite_differences_f64(op, i):
    specs, attrs = SAMPLES[op][i]
    if op == "dropout" and attrs.get("train"):
        pass  # the mask is a function of the seed and index only: the loss is linear in x
    rng = np.random.default_rng(100 + i + 17 * len(op))
    arrays = [_array(s, "f64", rng) for s in specs]
    g, feed, cots = _build(op, arrays, specs, attrs, "f64", rng)
    fwd = g.clone()
    grad(g)
    grads = partita.run(g, feed)[1:]
    h = 1e-6
    k = 0
    for idx, s in enumerate(specs):
        if not _is_diff(s):
            continue
        name = f"a{idx}"
        direction = rng.standard_normal(arrays[idx].shape)
        plus = dict(feed, **{name: arrays[idx] + h * direction})
        minus = dict(feed, **{name: arrays[idx] - h * direction})
        fd = (float(partita.run(fwd, plus)[0]) - float(partita.run(fwd, minus)[0])) / (2 * h)
        an = float(np.sum(grads[k] * direction))
        assert abs(fd - an) <= 1e-5 * max(1.0, abs(fd)), f"{op} d{name}: finite differences {fd}, vjp {an}"
        k += 1


def test_every_op_is_accounted_for():
    """Each op either has a vjp rule with a sample above or is declared not differentiable."""
    missing_rule = sorted(n for n, o in OPS.items() if o.vjp is None)
    assert not missing_rule, f"ops without a vjp rule or a not-differentiable declaration: {missing_rule}"
    differentiable = {n for n, o in OPS.items() if o.vjp is not None and o.vjp != NOT_DIFFERENTIABLE}
    # Piecewise constant ops: a zero gradient, nothing to check numerically.
    missing_sample = sorted(differentiable - set(SAMPLES) - {"sign", "floor", "ceil", "round", "trunc"})
    assert not missing_sample, f"differentiable ops without a gradient sample: {missing_sample}"


@pytest.mark.parametrize("causal, ev", [(False, 4), (True, 3)])
def test_attention_lse_gradient(causal, ev):
    """A loss that reads attention's lse as well as out: the rule adds the lse term to dq/dk."""
    rng = np.random.default_rng(5)
    q, k = rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 6, 4))
    v = rng.standard_normal((2, 6, ev))
    cot_o, cot_l = rng.standard_normal((2, 5, ev)), rng.standard_normal((2, 5))
    g = Graph("lse")
    b = Builder(g)
    vals = [b.input(n, TensorType(a.shape, DTYPES["f64"]), "param") for n, a in (("q", q), ("k", k), ("v", v))]
    co, cl = b.input("co", TensorType(cot_o.shape, DTYPES["f64"])), b.input("cl", TensorType(cot_l.shape, DTYPES["f64"]))
    out, lse = b.attention(*vals, causal=causal)
    b.ret(b.add(b.sum(b.mul(out, co)), b.sum(b.mul(lse, cl))))
    grad(g)
    verify(g)
    feed = {"q": q, "k": k, "v": v, "co": cot_o, "cl": cot_l}
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    s = tq @ tk.transpose(-1, -2) / 2.0
    if causal:
        s = s.masked_fill(~torch.ones(5, 6, dtype=torch.bool).tril(), float("-inf"))
    loss = ((torch.softmax(s, -1) @ tv) * torch.tensor(cot_o)).sum() + (torch.logsumexp(s, -1) * torch.tensor(cot_l)).sum()
    want = [x.numpy() for x in torch.autograd.grad(loss, (tq, tk, tv))]
    for got in (partita.run(g, feed)[1:], [t.numpy() for t in TorchProgram(g)(feed)[1:]]):
        for w, a in zip(want, got):
            np.testing.assert_allclose(a, w, rtol=1e-9, atol=1e-10)


def test_attention_bias_and_lse_gradients_together():
    """A learned bias with a loss that reads lse too: the bias gets p * dlse besides."""
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((2, 5, 4)) for _ in range(3))
    bias = rng.standard_normal((5, 5))
    cot_o, cot_l = rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 5))
    g = Graph("bias_lse")
    b = Builder(g)
    vals = [b.input(n, TensorType(a.shape, DTYPES["f64"]), "param") for n, a in (("q", q), ("k", k), ("v", v), ("bias", bias))]
    co, cl = b.input("co", TensorType(cot_o.shape, DTYPES["f64"])), b.input("cl", TensorType(cot_l.shape, DTYPES["f64"]))
    out, lse = b.attention(*vals, causal=True)
    b.ret(b.add(b.sum(b.mul(out, co)), b.sum(b.mul(lse, cl))))
    grad(g)
    verify(g)
    feed = {"q": q, "k": k, "v": v, "bias": bias, "co": cot_o, "cl": cot_l}
    tq, tk, tv, tb = (torch.tensor(a, requires_grad=True) for a in (q, k, v, bias))
    s = tq @ tk.transpose(-1, -2) / 2.0 + tb
    s = s.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), float("-inf"))
    loss = ((torch.softmax(s, -1) @ tv) * torch.tensor(cot_o)).sum() + (torch.logsumexp(s, -1) * torch.tensor(cot_l)).sum()
    want = [x.numpy() for x in torch.autograd.grad(loss, (tq, tk, tv, tb))]
    for got in (partita.run(g, feed)[1:], [t.numpy() for t in TorchProgram(g)(feed)[1:]]):
        for w, a in zip(want, got):
            np.testing.assert_allclose(a, w, rtol=1e-9, atol=1e-10)