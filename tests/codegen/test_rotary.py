"""Rotary embedding taken into attention (partita/codegen/rotary.py): the rewrite on the
pattern Llama exports (either operand order), the reference before and after, what it leaves
alone, the op's own steps, and a transformers Llama compiled end to end against eager."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from partita.codegen import CompiledProgram
from partita.ir import Builder, TensorType, verify
from partita.ir.dtypes import DTYPES
from partita.passes import PassManager

from strategies import random_inputs, run_reference

F32 = DTYPES["f32"]
T = lambda *s: TensorType(tuple(s), F32)  # noqa: E731


def _rope(b, x, cos, sin, swap=False):
    h = x.type.shape[-1] // 2
    lo = b.slice(x, axis=3, end=h)
    hi = b.slice(x, axis=3, start=h)
    rh = b.concat(b.neg(hi), lo, axis=3)
    m1, m2 = (b.mul(cos, x), b.mul(sin, rh)) if swap else (b.mul(x, cos), b.mul(rh, sin))
    return b.add(m2, m1) if swap else b.add(m1, m2)


def _graph(same_tables=True, keep_lse=False, extra_user=False, swap=False, mask=False):
    b = Builder()
    q, k, v = (b.input(n, T(2, 3, 10, 16)) for n in "qkv")
    cos, sin = b.input("cos", T(1, 1, 10, 16)), b.input("sin", T(1, 1, 10, 16))
    cos2 = b.input("cos2", T(1, 1, 10, 16)) if not same_tables else cos
    rq = _rope(b, q, cos, sin, swap)
    rk = _rope(b, k, cos2, sin, swap)
    ops = [rq, rk, v] + ([b.input("m", TensorType((2, 1, 10, 10), DTYPES["bool"]))] if mask else [])
    out, lse = b.attention(*ops, causal=True)
    outs = [out] + ([lse] if keep_lse else []) + ([rq] if extra_user else [])
    return verify(b.ret(*outs))


def _fuse(g):
    inputs = random_inputs(g, 3)
    before = run_reference(g, inputs)
    out = verify(PassManager.parse("fuse-library,dce").run(g))
    after = run_reference(out, inputs)
    for a, c in zip(before, after):
        np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-6)
    return out, inputs, before


@pytest.mark.parametrize("swap,mask", [(False, False), (True, True)])
def test_the_pattern_becomes_one_rotary_attention_with_the_same_reference(swap, mask):
    out, inputs, before = _fuse(_graph(swap=swap, mask=mask))
    assert [n.op for n in out.nodes] == ["rotary_attention"]
    prog = CompiledProgram(out)
    assert len(prog.attention_kernels) == 1
    got = prog({k: torch.from_numpy(v) for k, v in inputs.items()})
    np.testing.assert_allclose(got[0].numpy(), before[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kw", [{"same_tables": False}, {"keep_lse": True}, {"extra_user": True}])
def test_what_does_not_fit_the_pattern_stays_attention(kw):
    out, _, _ = _fuse(_graph(**kw))
    assert "rotary_attention" not in [n.op for n in out.nodes]
    assert "attention" in [n.op for n in out.nodes]


def test_the_ops_own_step_and_the_kernel_agree():
    from partita.backend.torch_exec import TorchProgram

    out, inputs, before = _fuse(_graph())
    feed = {k: torch.from_numpy(v) for k, v in inputs.items()}
    aten = TorchProgram(out)(feed)[0]            # the rotation in torch ops, then the attention op's step
    np.testing.assert_allclose(aten.numpy(), before[0], rtol=1e-5, atol=1e-5)


def test_a_llama_compiles_with_the_rotation_inside_attention_and_equals_eager():
    transformers = pytest.importorskip("transformers")
    from lm_helpers import compiled_lm

    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=4, vocab_size=100, max_position_embeddings=32)
    torch.manual_seed(0)
    prog, ids, want = compiled_lm(transformers.LlamaForCausalLM(cfg))
    assert sum(n.op == "rotary_attention" for n in prog.graph.nodes) == 2
    got = prog([ids])[0]
    assert float((got - want).abs().max()) <= 1e-4
