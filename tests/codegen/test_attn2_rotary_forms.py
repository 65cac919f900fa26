"""rotary_attention's forms beyond a whole-head rotation (codegen/rotary.py, issue 37): a
partial rotary embedding (GPT-NeoX: the first rd of each head rotated, the rest passed through)
becomes ``rotary_dim``, and grouped-query attention's k/v repeat is read in place (the kernel
reads key/value head h / group for query head h). Reference interpreter before and after the
pass, the compiled program against it, and a GPT-NeoX and a grouped-query Qwen2 against eager."""

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


def _partial_rope(b, x, cos, sin, rd):
    return b.concat(_rope(b, b.slice(x, axis=3, end=rd), cos, sin), b.slice(x, axis=3, start=rd), axis=3)


def _repeat(b, x, r):
    n, h, t, e = x.type.shape
    return b.reshape(b.broadcast_to(b.unsqueeze(x, axes=(2,)), shape=(n, h, r, t, e)), shape=(n, h * r, t, e))


def _graph(heads: int = 4, kv_heads: int = 4, rd: int = 16, mask: bool = False, causal: bool = True):
    b = Builder()
    q = b.input("q", T(2, heads, 10, 16))
    k, v = b.input("k", T(2, kv_heads, 10, 16)), b.input("v", T(2, kv_heads, 10, 16))
    cos, sin = b.input("cos", T(1, 1, 10, rd)), b.input("sin", T(1, 1, 10, rd))
    rot = (lambda x: _rope(b, x, cos, sin)) if rd == 16 else (lambda x: _partial_rope(b, x, cos, sin, rd))
    rq, rk = rot(q), rot(k)
    if kv_heads != heads:
        rk, v = _repeat(b, rk, heads // kv_heads), _repeat(b, v, heads // kv_heads)
    extra = [b.input("mask", T(1, 1, 10, 10))] if mask else []
    out, _ = b.attention(rq, rk, v, *extra, causal=causal)
    return verify(b.ret(out))


def _fuse_and_run(g):
    """The graph through fuse-library: the reference before and after, the program against it."""
    inputs = random_inputs(g, 3)
    before = run_reference(g, inputs)
    out = verify(PassManager.parse("fuse-library,dce").run(g))
    after = run_reference(out, inputs)
    for a, c in zip(before, after):
        np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-6)
    prog = CompiledProgram(out)
    got = prog({k: torch.from_numpy(v) for k, v in inputs.items()})
    np.testing.assert_allclose(got[0].numpy(), before[0], rtol=1e-5, atol=1e-5)
    return out, prog


@pytest.mark.parametrize("mask,causal", [(False, True), (True, False)])
def test_a_partial_rotary_embedding_is_taken_as_rotary_dim(mask, causal):
    out, prog = _fuse_and_run(_graph(rd=4, mask=mask, causal=causal))
    ops = [n.op for n in out.nodes]
    assert ops == ["rotary_attention"]
    assert list(out.nodes)[0].attrs["rotary_dim"] == 4 and len(prog.attention_kernels) == 1


@pytest.mark.parametrize("rd", [16, 6])
def test_a_grouped_query_repeat_of_k_and_v_is_read_by_the_kernel_in_place(rd):
    out, prog = _fuse_and_run(_graph(heads=4, kv_heads=2, rd=rd, mask=True))
    ops = [n.op for n in out.nodes]
    assert ops == ["rotary_attention"], ops
    node = list(out.nodes)[0]
    assert node.operands[1].type.shape[1] == 2 and node.operands[2].type.shape[1] == 2
    assert len(prog.attention_kernels) == 1


def test_rotary_dim_odd_or_beyond_the_head_is_refused_with_the_reason():
    from partita.ir.diagnostics import TypeRuleError

    b = Builder()
    q, k, v = (b.input(n, T(2, 4, 10, 16)) for n in "qkv")
    cos, sin = b.input("cos", T(1, 1, 10, 5)), b.input("sin", T(1, 1, 10, 5))
    with pytest.raises(TypeRuleError, match="rotary_dim 5 must be even"):
        b.rotary_attention(q, k, v, cos, sin, rotary_dim=5)


@pytest.mark.parametrize("name,cls,cfg", [
    ("gpt_neox", "GPTNeoXForCausalLM", dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                            num_attention_heads=4, rotary_pct=0.25, use_parallel_residual=True)),
    ("qwen2", "Qwen2ForCausalLM", dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2)),
])
def test_partial_rotary_and_grouped_query_decoders_run_one_attention_step_and_equal_eager(name, cls, cfg):
    transformers = pytest.importorskip("transformers")
    from lm_helpers import compiled_lm

    config = getattr(transformers, cls.replace("ForCausalLM", "Config"))(vocab_size=100, max_position_embeddings=32,
                                                                           **cfg)
    torch.manual_seed(0)
    prog, ids, want = compiled_lm(getattr(transformers, cls)(config))
    ops = [n.op for n in prog.graph.nodes]
    assert ops.count("rotary_attention") == 2 and "neg" not in ops and "broadcast_to" not in ops, name
    got = prog([ids])[0]
    assert float((got - want).abs().max()) <= 1e-4
