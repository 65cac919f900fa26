"""BLOOM's ALiBi attention (q k^T scaled, plus the ALiBi bias [B * H, 1, S] in the batched 3-d
form, plus the additive mask [B, 1, T, S] in 4-d, softmax, times v) taken into one ``attention``
node whose mask is the two terms' sum (codegen/attention_spelled.py). Odd shapes; the
reference interpreter before and after, the compiled program against it, and a BloomModel
with padding against eager."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import partita
from partita.codegen import CompiledProgram
from partita.codegen.attention_spelled import fuse_spelled_attention
from partita.ir import Builder, TensorType, verify
from partita.ir.dtypes import DTYPES
from partita.passes import PassManager

from strategies import random_inputs, run_reference

F32 = DTYPES["f32"]
T = lambda *s: TensorType(tuple(s), F32)  # noqa: E731


def _alibi_attention(B: int, H: int, S: int, E: int, bias_shape: tuple, mask: bool = True):
    """BLOOM's eager attention as it is imported: ``baddbmm(alibi, q, k^T, alpha=scale)`` in
    3-d, viewed as [B, H, T, S], plus the mask, softmax, ``bmm`` with v."""
    b = Builder()
    q, k, v = (b.input(n, T(B, H, S, E)) for n in "qkv")
    alibi = b.input("alibi", T(*bias_shape))
    q3 = b.reshape(q, shape=(B * H, S, E))
    kt = b.transpose(b.reshape(k, shape=(B * H, S, E)), perm=(0, 2, 1))
    s3 = b.add(alibi, b.mul(b.matmul(q3, kt), b.full(shape=(), value=E ** -0.5)))
    s = b.reshape(s3, shape=(B, H, S, S))
    if mask:
        s = b.add(s, b.input("mask", T(B, 1, S, S)))
    p = b.reshape(b.softmax(s), shape=(B * H, S, S))
    o = b.reshape(b.matmul(p, b.reshape(v, shape=(B * H, S, E))), shape=(B, H, S, E))
    return verify(b.ret(o))


def _fuse(g):
    """fuse_spelled_attention on each softmax, then dce; the reference before and after."""
    inputs = random_inputs(g, 5)
    before = run_reference(g, inputs)
    for n in [n for n in g.nodes if n.op == "softmax"]:
        fuse_spelled_attention(g, n)
    out = verify(PassManager.parse("dce").run(g))
    after = run_reference(out, inputs)
    for a, c in zip(before, after):
        np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-5)
    return out, inputs, before


@pytest.mark.parametrize("B,H,S,E,bias,mask", [
    (3, 5, 7, 12, "flat_row", True),     # BLOOM's [B * H, 1, S]
    (2, 3, 9, 20, "flat_full", True),    # a full [B * H, T, S] bias
    (1, 4, 5, 8, "flat_row", True),      # B = 1: [H, 1, S] broadcasts as it is
    (2, 3, 6, 16, "row", False),         # a [1, S] bias, no mask
])
def test_alibi_bias_and_mask_become_the_attention_mask(B, H, S, E, bias, mask):
    shape = {"flat_row": (B * H, 1, S), "flat_full": (B * H, S, S), "row": (1, S)}[bias]
    out, inputs, before = _fuse(_alibi_attention(B, H, S, E, shape, mask))
    ops = [n.op for n in out.nodes]
    assert "attention" in ops and "softmax" not in ops and "matmul" not in ops, ops
    att = next(n for n in out.nodes if n.op == "attention")
    assert abs(att.attrs["scale"] - E ** -0.5) < 1e-7 and len(att.operands) == 4
    prog = CompiledProgram(out)
    got = prog({k: torch.from_numpy(v) for k, v in inputs.items()})
    np.testing.assert_allclose(got[0].numpy(), before[0], rtol=1e-5, atol=1e-5)


def test_a_bias_of_another_leading_size_is_left_spelled_out():
    b = Builder()
    B, H, S, E = 2, 3, 5, 8
    q, k, v = (b.input(n, T(B, H, S, E)) for n in "qkv")
    q3 = b.reshape(q, shape=(B * H, S, E))
    kt = b.transpose(b.reshape(k, shape=(B * H, S, E)), perm=(0, 2, 1))
    s3 = b.add(b.input("bias", T(H * B, S, S)), b.matmul(q3, kt))
    s = b.reshape(b.transpose(b.reshape(s3, shape=(H, B, S, S)), perm=(1, 0, 2, 3)), shape=(B, H, S, S))
    p = b.reshape(b.softmax(s), shape=(B * H, S, S))
    o = b.reshape(b.matmul(p, b.reshape(v, shape=(B * H, S, E))), shape=(B, H, S, E))
    out, _, _ = _fuse(verify(b.ret(o)))
    assert "softmax" in [n.op for n in out.nodes]


@pytest.mark.parametrize("pad", [False, True])
def test_a_bloom_model_runs_one_attention_step_per_layer_and_equals_eager(pad):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BloomConfig(hidden_size=60, n_layer=2, n_head=5, vocab_size=97)
    torch.manual_seed(0)
    model = transformers.BloomModel(cfg).eval()
    ids = torch.randint(0, 97, (3, 7))
    am = torch.ones(3, 7, dtype=torch.long)
    if pad:
        am[1, :2] = 0   # left padding
        am[2, 5:] = 0   # right padding
    kwargs = {"input_ids": ids, "attention_mask": am}
    g = partita.optimize(partita.import_torch(model, (), kwargs),
                         "canonicalize,fold-batch-norm,fuse-library,fuse-kernels,cse,dce")
    ops = [n.op for n in g.nodes]
    assert ops.count("attention") == 2 and "softmax" not in ops, ops
    prog = CompiledProgram(g, freeze=True)
    with torch.no_grad():
        want = model(**kwargs).last_hidden_state
    got = prog([ids, am])[0]
    assert float((got - want).abs().max()) <= 1e-4


def _factored_gelu(b, x, assoc: int, square: int):
    """BLOOM's ``x * 0.5 * (1 + tanh(0.79788456 * x * (1 + 0.044715 * x * x)))``, the outer
    product and the square in the association asked."""
    c = lambda v: b.full(shape=(), value=v)  # noqa: E731
    sq = b.mul(b.mul(x, c(0.044715)), x) if square == 0 else b.mul(c(0.044715), b.mul(x, x))
    core = b.add(c(1.0), b.tanh(b.mul(b.mul(c(0.79788456), x), b.add(sq, c(1.0)))))
    if assoc == 0:
        return b.mul(b.mul(x, c(0.5)), core)
    if assoc == 1:
        return b.mul(x, b.mul(c(0.5), core))
    return b.mul(b.mul(x, core), c(0.5))


@pytest.mark.parametrize("assoc,square", [(0, 0), (1, 0), (2, 0), (0, 1), (2, 1)])
def test_a_factored_gelu_after_a_linear_layer_becomes_its_epilogue(assoc, square):
    from partita.codegen.factored_gelu import take_factored_gelu

    b = Builder()
    x = b.input("x", T(3, 7, 24))
    w, bias = b.param("w", T(37, 24)), b.param("bias", T(37))
    h = b.reshape(b.add(b.matmul(b.reshape(x, shape=(21, 24)), b.transpose(w, perm=(1, 0))), bias), shape=(3, 7, 37))
    g = verify(b.ret(_factored_gelu(b, h, assoc, square)))
    inputs = random_inputs(g, 7)
    before = run_reference(g, inputs)
    probe = g.clone()
    assert take_factored_gelu(probe) == 1 and "tanh" not in [n.op for n in probe.nodes]
    out = verify(PassManager.parse("fuse-library,fuse-kernels,dce").run(g))
    lin = [n for n in out.nodes if n.op == "linear_pointwise"]
    assert len(lin) == 1 and lin[0].attrs["unary"] == "gelu_tanh" and "tanh" not in [n.op for n in out.nodes]
    np.testing.assert_allclose(run_reference(out, inputs)[0], before[0], rtol=1e-5, atol=1e-5)
    prog = CompiledProgram(out)
    got = prog({k: torch.from_numpy(v) for k, v in inputs.items() if k == "x"},
               {k: torch.from_numpy(v) for k, v in inputs.items() if k != "x"})
    np.testing.assert_allclose(got[0].numpy(), before[0], rtol=1e-5, atol=1e-5)


def test_a_gelu_with_another_constant_is_left_spelled_out_and_a_shared_tanh_stays():
    from partita.codegen.factored_gelu import take_factored_gelu

    b = Builder()
    x = b.input("x", T(5, 9))
    c = lambda v: b.full(shape=(), value=v)  # noqa: E731
    core = b.add(c(1.0), b.tanh(b.mul(b.mul(c(0.8), x), b.add(b.mul(b.mul(x, c(0.044715)), x), c(1.0)))))
    y = b.mul(b.mul(x, c(0.5)), core)
    assert take_factored_gelu(verify(b.ret(y))) == 0
    b2 = Builder()
    x2 = b2.input("x", T(5, 9))
    t = b2.tanh(b2.mul(b2.mul(b2.full(shape=(), value=0.79788456), x2),
                       b2.add(b2.mul(b2.mul(x2, b2.full(shape=(), value=0.044715)), x2), b2.full(shape=(), value=1.0))))
    y2 = b2.mul(b2.mul(x2, b2.full(shape=(), value=0.5)), b2.add(t, b2.full(shape=(), value=1.0)))
    g2 = verify(b2.ret(y2, t))   # the tanh is read by the graph's outputs too
    inputs = random_inputs(g2, 3)
    before = run_reference(g2, inputs)
    assert take_factored_gelu(g2) == 1
    ops = [n.op for n in g2.nodes]
    assert "gelu" in ops and "tanh" in ops
    for a, c in zip(before, run_reference(verify(g2), inputs)):
        np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-6)
