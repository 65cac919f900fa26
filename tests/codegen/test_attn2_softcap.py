"""Attention spelled out in ops (Gemma2's: q k^T, scale, the logit soft cap tanh(s / cap) * cap,
mask, softmax, times v) taken back into one node (codegen/attention_spelled.py): with rotated q
and k and a cap, ``rotary_attention {softcap}`` whose kernel caps the scores; without a cap, an
``attention`` node. Reference interpreter before and after, the compiled program against it, the
kernel's cap against torch's formula, and a Gemma2 against eager."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from partita.codegen import CompiledProgram
from partita.codegen.attention import PreparedAttention
from partita.codegen.attention_spelled import fuse_spelled_attention
from partita.ir import Builder, TensorType, verify
from partita.ir.dtypes import DTYPES
from partita.passes import PassManager

from strategies import random_inputs, run_reference

F32 = DTYPES["f32"]
T = lambda *s: TensorType(tuple(s), F32)  # noqa: E731


def _rope(b, x, cos, sin):
    h = x.type.shape[-1] // 2
    rh = b.concat(b.neg(b.slice(x, axis=3, start=h)), b.slice(x, axis=3, end=h), axis=3)
    return b.add(b.mul(x, cos), b.mul(rh, sin))


def _spelled(rope: bool = True, cap: float | None = 50.0, mask: bool = True, kv_heads: int = 2):
    """Gemma2's eager attention as it is imported: 3-d matmuls between reshapes, the v repeat's
    broadcast reshaped straight to the batched 3-d shape."""
    b = Builder()
    B, H, S, E = 2, 4, 10, 16
    g = H // kv_heads
    q = b.input("q", T(B, H, S, E))
    k, v = b.input("k", T(B, kv_heads, S, E)), b.input("v", T(B, kv_heads, S, E))
    if rope:
        cos, sin = b.input("cos", T(1, 1, S, E)), b.input("sin", T(1, 1, S, E))
        q, k = _rope(b, q, cos, sin), _rope(b, k, cos, sin)
    if g > 1:
        k = b.reshape(b.broadcast_to(b.unsqueeze(k, axes=(2,)), shape=(B, kv_heads, g, S, E)), shape=(B, H, S, E))
        v5 = b.broadcast_to(b.unsqueeze(v, axes=(2,)), shape=(B, kv_heads, g, S, E))
    else:
        v5 = v
    s = b.reshape(b.matmul(b.reshape(q, shape=(B * H, S, E)),
                           b.reshape(b.transpose(k, perm=(0, 1, 3, 2)), shape=(B * H, E, S))), shape=(B, H, S, S))
    s = b.mul(s, b.full(shape=(), value=0.25))
    if cap is not None:
        s = b.mul(b.tanh(b.div(s, b.full(shape=(), value=cap))), b.full(shape=(), value=cap))
    if mask:
        s = b.add(s, b.input("mask", T(1, 1, S, S)))
    p = b.reshape(b.softmax(s), shape=(B * H, S, S))
    o = b.reshape(b.matmul(p, b.reshape(v5, shape=(B * H, S, E))), shape=(B, H, S, E))
    return verify(b.ret(o))


def _fuse(g, spread: float = 4.0):
    """fuse_spelled_attention on each softmax, then fuse-library; the reference before and after.
    ``spread`` scales q and k: 4 puts the scores past the cap's knee."""
    inputs = random_inputs(g, 3)
    inputs = {k: (v * spread if k in ("q", "k") else v) for k, v in inputs.items()}
    before = run_reference(g, inputs)
    for n in [n for n in g.nodes if n.op == "softmax"]:
        fuse_spelled_attention(g, n)
    out = verify(PassManager.parse("dce,fuse-library,dce").run(g))
    after = run_reference(out, inputs)
    for a, c in zip(before, after):
        np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-5)
    return out, inputs, before


def _program_matches(out, inputs, before):
    prog = CompiledProgram(out)
    got = prog({k: torch.from_numpy(v) for k, v in inputs.items()})
    np.testing.assert_allclose(got[0].numpy(), before[0], rtol=1e-5, atol=1e-5)
    return prog


@pytest.mark.parametrize("kv_heads,mask", [(2, True), (4, False)])
def test_soft_capped_rotary_attention_becomes_one_rotary_attention_node(kv_heads, mask):
    out, inputs, before = _fuse(_spelled(kv_heads=kv_heads, mask=mask))
    ops = [n.op for n in out.nodes]
    assert [o for o in ops if o not in ("full",)] == ["rotary_attention"], ops
    node = next(n for n in out.nodes if n.op == "rotary_attention")
    assert node.attrs["softcap"] == 50.0 and node.attrs["scale"] == 0.25
    assert node.operands[1].type.shape[1] == kv_heads
    assert len(_program_matches(out, inputs, before).attention_kernels) == 1


def test_spelled_attention_without_a_cap_becomes_an_attention_node():
    # No cap to bound them: scores of q and k at 4x spread reach the hundreds, where f32 sums
    # taken in another order (8 lanes against 16) move the softmax by 3e-5; at 1x they stay tens.
    out, inputs, before = _fuse(_spelled(rope=False, cap=None), spread=1.0)
    ops = [n.op for n in out.nodes]
    assert "attention" in ops and "softmax" not in ops and "matmul" not in ops
    _program_matches(out, inputs, before)


def test_a_cap_without_rotated_q_and_k_is_left_spelled_out():
    out, _, _ = _fuse(_spelled(rope=False))
    ops = [n.op for n in out.nodes]
    assert "softmax" in ops and "tanh" in ops and "attention" not in ops


@pytest.mark.parametrize("causal,mask,rd", [(True, False, 0), (False, True, 0), (True, True, 4)])
def test_the_kernel_caps_the_scores_as_torch_computes_them(causal, mask, rd):
    torch.manual_seed(0)
    b, h, t, e, cap = 2, 4, 21, 16, 20.0
    q, k, v = (torch.randn(b, h, t, e) * 3 for _ in range(3))
    kk, vv = k[:, :2], v[:, :2]   # two key/value heads for four query heads
    r = rd or e
    ang = torch.arange(t)[:, None] * torch.arange(r // 2)[None] * 0.3
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    m = torch.randn(1, 1, t, t) if mask else None

    def rope(x):
        xr = x[..., :r]
        rot = xr * cos + torch.cat((-xr[..., r // 2:], xr[..., :r // 2]), -1) * sin
        return torch.cat((rot, x[..., r:]), -1)

    scale = 1 / math.sqrt(e)
    s = torch.tanh(rope(q) @ rope(kk).repeat_interleave(2, 1).transpose(-1, -2) * scale / cap) * cap
    if causal:
        s = s.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
    if m is not None:
        s = s + m
    want = torch.softmax(s, -1) @ vv.repeat_interleave(2, 1)
    pa = PreparedAttention((b, h), t, t, e, e, None, causal, "f32" if mask else "", rope=True, group=2,
                           rot_dim=rd, softcap=cap)
    got, _ = pa(q, kk, vv, m, cos, sin)
    assert float((got - want).abs().max()) <= 2e-5


def test_a_gemma2_with_the_spelled_attention_taken_runs_one_step_per_attention_and_equals_eager(monkeypatch):
    transformers = pytest.importorskip("transformers")
    from lm_helpers import compiled_lm

    from partita.codegen import library

    monkeypatch.setitem(library.ANCHORS, "softmax", fuse_spelled_attention)
    cfg = transformers.Gemma2Config(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, head_dim=16, vocab_size=100, max_position_embeddings=32,
                                    sliding_window=4, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                                    query_pre_attn_scalar=16, attn_implementation="eager")
    torch.manual_seed(0)
    prog, ids, want = compiled_lm(transformers.Gemma2ForCausalLM(cfg))
    ops = [n.op for n in prog.graph.nodes]
    assert ops.count("rotary_attention") == 2 and "softmax" not in ops and "tanh" not in ops
    got = prog([ids])[0]
    assert float((got - want).abs().max()) <= 1e-4


def _disentangled(fully_masked_row: bool):
    """DeBERTa-v2's attention as it is imported: 3-d q k^T with k^T divided by sqrt(E * 3)
    (the head size a constant), a relative-position term added in 3-d, a masked fill with the
    f32 lowest value, softmax, times v."""
    b = Builder()
    B, H, S, E = 2, 4, 10, 16
    q, k, v = (b.input(n, T(B, H, S, E)) for n in "qkv")
    rel = b.input("rel", T(B * H, S, S))
    keep = b.input("keep", TensorType((B, 1, S, S), DTYPES["bool"]))
    c = b.sqrt(b.mul(b.full(shape=(), value=16.0), b.full(shape=(), value=3.0)))
    q3 = b.reshape(q, shape=(B * H, S, E))
    kt = b.div(b.transpose(b.reshape(k, shape=(B * H, S, E)), perm=(0, 2, 1)), c)
    s = b.reshape(b.add(b.matmul(q3, kt), rel), shape=(B, H, S, S))
    s = b.where(b.bitwise_not(keep), b.full(shape=(), value=-3.4028234663852886e38), s)
    p = b.reshape(b.softmax(s), shape=(B * H, S, S))
    o = b.reshape(b.matmul(p, b.reshape(v, shape=(B * H, S, E))), shape=(B, H, S, E))
    return verify(b.ret(o)), fully_masked_row


@pytest.mark.parametrize("fully_masked_row", [False, True])
def test_a_disentangled_attention_with_a_masked_fill_takes_its_term_as_the_mask(fully_masked_row):
    g, _ = _disentangled(fully_masked_row)
    inputs = random_inputs(g, 5)
    keep = np.random.default_rng(1).random((2, 1, 10, 10)) > 0.3
    keep[:, :, :, 0] = True
    if fully_masked_row:
        keep[1, 0, 3, :] = False   # a query that sees nothing: softmax of equal scores, as before
    inputs["keep"] = keep
    before = run_reference(g, inputs)
    for n in [n for n in g.nodes if n.op == "softmax"]:
        fuse_spelled_attention(g, n)
    out = verify(PassManager.parse("dce").run(g))
    ops = [n.op for n in out.nodes]
    assert "attention" in ops and "softmax" not in ops and "matmul" not in ops, ops
    node = next(n for n in out.nodes if n.op == "attention")
    assert abs(node.attrs["scale"] - 1 / math.sqrt(48)) < 1e-12
    after = run_reference(out, inputs)
    np.testing.assert_allclose(after[0], before[0], rtol=1e-5, atol=1e-5)
    _program_matches(out, inputs, before)
