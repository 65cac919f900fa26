"""rotary_attention for the rotary forms of GPT-J, CodeGen and OLMo (codegen/rotary.py, issue 37):
the interleaved rotation (``rotate_every_two``: pairs (2i, 2i + 1)) of a partial head rotated
in the [B, T, H, E] layout before a transpose becomes ``rotary_attention {rotary_pairs}`` on the
transposed q and k, and a rotation whose x the importer spelled once per reader (OLMo: views of
a clamped projection) is taken as one. Reference interpreter before and after the pass, the
compiled program against it, odd shapes, and GPT-J, CodeGen, Cohere and OLMo against eager."""

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


def _rope_pairs(b, x, cos, sin):
    """GPT-J's x * cos + rotate_every_two(x) * sin on the last axis."""
    last = x.type.rank - 1
    odd = b.unsqueeze(b.neg(b.slice(x, axis=last, start=1, step=2)), axes=(last + 1,))
    even = b.unsqueeze(b.slice(x, axis=last, start=0, step=2), axes=(last + 1,))
    rh = b.reshape(b.concat(odd, even, axis=last + 1), shape=tuple(x.type.shape))
    return b.add(b.mul(x, cos), b.mul(rh, sin))


def _gptj_graph(t: int = 7, heads: int = 3, e: int = 16, rd: int = 6, mask: bool = False,
                same_tables: bool = True):
    """q, k [B, T, H, E] rotated in pairs on the first rd, then transposed to [B, H, T, E]."""
    b = Builder()
    q, k = b.input("q", T(2, t, heads, e)), b.input("k", T(2, t, heads, e))
    v = b.input("v", T(2, heads, t, 16))
    cos, sin = b.input("cos", T(1, t, 1, rd)), b.input("sin", T(1, t, 1, rd))
    ksin = sin if same_tables else b.input("sin2", T(1, t, 1, rd))

    def rot(x, s):
        r = _rope_pairs(b, b.slice(x, axis=3, end=rd), cos, s) if rd < e else _rope_pairs(b, x, cos, s)
        whole = b.concat(r, b.slice(x, axis=3, start=rd), axis=3) if rd < e else r
        return b.transpose(whole, perm=(0, 2, 1, 3))

    extra = [b.input("mask", TensorType((2, 1, t, t), DTYPES["bool"]))] if mask else []
    out, _ = b.attention(rot(q, sin), rot(k, ksin), v, *extra, causal=True)
    return verify(b.ret(out))


def _olmo_graph(t: int = 5, heads: int = 4, kv: int = 2, e: int = 16):
    """OLMo's spelling: a clamped projection viewed and transposed once per reader of the rotation."""
    b = Builder()
    pq, pk = b.input("pq", T(2, t, heads * e)), b.input("pk", T(2, t, kv * e))
    v = b.input("v", T(2, kv, t, e))
    cos, sin = b.input("cos", T(1, 1, t, e)), b.input("sin", T(1, 1, t, e))

    def view(x, h):
        return b.transpose(b.reshape(x, shape=(2, t, h, e)), perm=(0, 2, 1, 3))

    def rot(x, h):
        x = b.tanh(x)   # an elementwise step before the rotation (OLMo clamps)
        half = e // 2
        rh = b.concat(b.neg(b.slice(view(x, h), axis=3, start=half)), b.slice(view(x, h), axis=3, end=half), axis=3)
        return b.add(b.mul(view(x, h), cos), b.mul(rh, sin))

    def repeat(x):
        return b.reshape(b.broadcast_to(b.unsqueeze(x, axes=(2,)), shape=(2, kv, heads // kv, t, e)),
                         shape=(2, heads, t, e))

    out, _ = b.attention(rot(pq, heads), repeat(rot(pk, kv)), repeat(v), causal=True)
    return verify(b.ret(out))


def _fuse_and_run(g):
    """The graph through fuse-library: the reference before and after, the program against it."""
    inputs = random_inputs(g, 5)
    before = run_reference(g, inputs)
    out = verify(PassManager.parse("fuse-library,dce").run(g))
    after = run_reference(out, inputs)
    for a, c in zip(before, after):
        np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-6)
    prog = CompiledProgram(out)
    got = prog({k: torch.from_numpy(v) for k, v in inputs.items()})
    np.testing.assert_allclose(got[0].numpy(), before[0], rtol=1e-5, atol=1e-5)
    return out, prog


@pytest.mark.parametrize("t,heads,e,rd,mask", [(7, 3, 16, 6, False), (5, 2, 16, 16, True), (9, 1, 32, 10, True),
                                               (1, 2, 16, 2, False)])
def test_gptj_interleaved_rotation_before_a_transpose_becomes_one_rotary_attention(t, heads, e, rd, mask):
    out, prog = _fuse_and_run(_gptj_graph(t, heads, e, rd, mask))
    ra = [n for n in out.nodes if n.op == "rotary_attention"]
    assert len(ra) == 1 and ra[0].attrs["rotary_pairs"] is True
    assert (ra[0].attrs.get("rotary_dim") or e) == rd
    assert not any(n.op in ("neg", "concat", "slice") for n in out.nodes)
    assert len(prog.attention_kernels) == 1


@pytest.mark.parametrize("t,e,rd", [(7, 16, 16), (3, 16, 6)])
def test_pairs_after_the_transpose_with_grouped_k_and_v_read_unrepeated(t, e, rd):
    """Cohere's form: [B, H, T, E] rotated in pairs, k and v repeated for grouped-query heads."""
    b = Builder()
    heads, kv = 4, 2
    q, k = b.input("q", T(2, heads, t, e)), b.input("k", T(2, kv, t, e))
    v = b.input("v", T(2, kv, t, 16))
    cos, sin = b.input("cos", T(1, 1, t, rd)), b.input("sin", T(1, 1, t, rd))

    def rot(x):
        if rd == e:
            return _rope_pairs(b, x, cos, sin)
        return b.concat(_rope_pairs(b, b.slice(x, axis=3, end=rd), cos, sin), b.slice(x, axis=3, start=rd), axis=3)

    def repeat(x):
        n, h, tt, ee = x.type.shape
        return b.reshape(b.broadcast_to(b.unsqueeze(x, axes=(2,)), shape=(n, h, heads // kv, tt, ee)),
                         shape=(n, heads, tt, ee))

    out, _ = b.attention(rot(q), repeat(rot(k)), repeat(v), causal=True)
    fused, prog = _fuse_and_run(verify(b.ret(out)))
    ops = [n.op for n in fused.nodes]
    assert ops == ["rotary_attention"], ops
    node = list(fused.nodes)[0]
    assert node.attrs["rotary_pairs"] is True and node.operands[1].type.shape[1] == kv
    assert len(prog.attention_kernels) == 1


def test_pairs_with_different_tables_for_q_and_k_stay_as_they_are():
    out, _ = _fuse_and_run(_gptj_graph(same_tables=False))
    assert not any(n.op == "rotary_attention" for n in out.nodes)


def test_a_rotation_spelled_once_per_reader_after_a_clamp_is_taken():
    out, prog = _fuse_and_run(_olmo_graph())
    ops = [n.op for n in out.nodes]
    assert ops.count("rotary_attention") == 1 and "neg" not in ops and "broadcast_to" not in ops, ops


@pytest.mark.parametrize("rd", [4, 12])
def test_the_op_torch_form_equals_its_reference_in_pairs(rd):
    from partita.ops.registry import OPS

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 3, 6, 12)).astype(np.float32) for _ in range(3))
    cos, sin = (rng.standard_normal((1, 1, 6, rd)).astype(np.float32) for _ in range(2))
    op = OPS["rotary_attention"]
    attrs = op.normalize_attrs({"causal": True, "rotary_dim": rd, "rotary_pairs": True})
    want = op.reference([q, k, v, cos, sin], attrs)[0]
    got = op.torch([torch.from_numpy(x) for x in (q, k, v, cos, sin)], attrs)[0]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
    # against rotate_every_two written in torch as GPT-J does
    tq, tk = torch.from_numpy(q), torch.from_numpy(k)

    def every_two(x):
        return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)

    def rope(x):
        xr = x[..., :rd]
        c, s = torch.from_numpy(cos), torch.from_numpy(sin)
        return torch.cat((xr * c + every_two(xr) * s, x[..., rd:]), -1)

    ref = torch.nn.functional.scaled_dot_product_attention(rope(tq), rope(tk), torch.from_numpy(v), is_causal=True)
    np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name,cls,cfg", [
    ("gptj", "GPTJForCausalLM", dict(n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=32)),
    ("codegen", "CodeGenForCausalLM", dict(n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=32, n_ctx=32)),
    ("cohere", "CohereForCausalLM", dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, use_qk_norm=False,
                                         max_position_embeddings=32)),
    ("olmo", "OlmoForCausalLM", dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, clip_qkv=8.0, max_position_embeddings=32)),
])
def test_gptj_codegen_cohere_and_olmo_run_one_rotary_attention_step_and_equal_eager(name, cls, cfg):
    transformers = pytest.importorskip("transformers")
    from lm_helpers import compiled_lm

    config = getattr(transformers, cls.replace("ForCausalLM", "Config"))(vocab_size=100, **cfg)
    torch.manual_seed(0)
    prog, ids, want = compiled_lm(getattr(transformers, cls)(config))
    ops = [n.op for n in prog.graph.nodes]
    assert ops.count("rotary_attention") == 2 and "neg" not in ops, (name, ops)
    got = prog([ids])[0]
    assert float((got - want).abs().max()) <= 1e-4


@pytest.mark.parametrize("e", [8, 12, 16, 24, 32, 64])
@pytest.mark.parametrize("rd_part", [False, True])
def test_the_kernel_in_pairs_equals_the_op_torch_form_for_head_sizes(e, rd_part):
    """The generated kernel's rotation in pairs (vectors for a whole head, scalars for a part)."""
    from partita.codegen.attention import PreparedAttention
    from partita.ops.registry import OPS

    rd = e // 2 - (e // 2) % 2 if rd_part else e
    if rd == 0:
        pytest.skip("no rotated part")
    g = torch.Generator().manual_seed(e)
    t = 11
    q, k = (torch.randn(2, 3, t, e, generator=g) for _ in range(2))
    v = torch.randn(2, 3, t, 16, generator=g)
    cos, sin = (torch.randn(1, 1, t, rd, generator=g) for _ in range(2))
    pa = PreparedAttention((2, 3), t, t, e, 16, None, True, rope=True, rot_dim=rd if rd < e else 0,
                           rotary_pairs=True)
    got = pa(q, k, v, None, cos, sin)[0]
    attrs = OPS["rotary_attention"].normalize_attrs({"causal": True, "rotary_dim": rd, "rotary_pairs": True})
    want = OPS["rotary_attention"].torch([q, k, v, cos, sin], attrs)[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
