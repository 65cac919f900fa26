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
