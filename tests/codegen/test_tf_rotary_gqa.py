"""Grouped-query attention's rotated k, repeated after its rotation (Llama with fewer key/value
heads), is taken into ``rotary_attention`` too (codegen/rotary.py): the repeat reads the
unrotated k and the kernel rotates what it repeats. Reference interpreter before and after,
the compiled program against it, a rotated k read elsewhere left as it was, and a
grouped-query Llama against eager."""

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


def _rope(b, x, cos, sin):
    h = x.type.shape[-1] // 2
    rh = b.concat(b.neg(b.slice(x, axis=3, start=h)), b.slice(x, axis=3, end=h), axis=3)
    return b.add(b.mul(x, cos), b.mul(rh, sin))


def _repeat(b, x, r):
    n, h, t, e = x.type.shape
    return b.reshape(b.broadcast_to(b.unsqueeze(x, axes=(2,)), shape=(n, h, r, t, e)), shape=(n, h * r, t, e))


def _graph(extra_user: bool = False):
    b = Builder()
    q = b.input("q", T(2, 4, 10, 16))
    k, v = b.input("k", T(2, 2, 10, 16)), b.input("v", T(2, 2, 10, 16))
    cos, sin = b.input("cos", T(1, 1, 10, 16)), b.input("sin", T(1, 1, 10, 16))
    rk = _rope(b, k, cos, sin)
    out, _ = b.attention(_rope(b, q, cos, sin), _repeat(b, rk, 2), _repeat(b, v, 2), causal=True)
    return verify(b.ret(out, rk) if extra_user else b.ret(out))


def _fuse(g):
    inputs = random_inputs(g, 3)
    before = run_reference(g, inputs)
    out = verify(PassManager.parse("fuse-library,dce").run(g))
    after = run_reference(out, inputs)
    for a, c in zip(before, after):
        np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-6)
    return out, inputs, before


def test_a_rotated_k_repeated_for_grouped_query_attention_is_rotated_by_the_kernel():
    out, inputs, before = _fuse(_graph())
    ops = [n.op for n in out.nodes]
    assert ops.count("rotary_attention") == 1 and "neg" not in ops and "concat" not in ops
    prog = CompiledProgram(out)
    assert len(prog.attention_kernels) == 1
    got = prog({k: torch.from_numpy(v) for k, v in inputs.items()})
    np.testing.assert_allclose(got[0].numpy(), before[0], rtol=1e-5, atol=1e-5)


def test_a_rotated_k_read_elsewhere_keeps_the_rotation_before_the_repeat():
    out, _, _ = _fuse(_graph(extra_user=True))
    assert "rotary_attention" not in [n.op for n in out.nodes] and "attention" in [n.op for n in out.nodes]


def test_a_grouped_query_llama_compiles_with_the_rotation_inside_attention_and_equals_eager():
    transformers = pytest.importorskip("transformers")
    from lm_helpers import compiled_lm

    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=100, max_position_embeddings=32)
    torch.manual_seed(0)
    prog, ids, want = compiled_lm(transformers.LlamaForCausalLM(cfg))
    assert sum(n.op == "rotary_attention" for n in prog.graph.nodes) == 2
    got = prog([ids])[0]
    assert float((got - want).abs().max()) <= 1e-4
