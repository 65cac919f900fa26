"""partita's generated attention kernel (codegen/attention.py): the online softmax against the
formula in float64 on edge shapes, masks (f32, bool, broadcast, rows with no key), causal
alignment when T != S, views, both tiles, NaN, two threads, and the executor taking it for
attention nodes."""

from __future__ import annotations

import math

import pytest
import torch

from partita.codegen import attention as A
from partita.codegen import cpu


def _reference(q, k, v, mask, causal, scale):
    """out and lse in float64 (rows with every score dropped: 0 and 0, as the op's record says)."""
    q, k, v = q.double(), k.double(), v.double()
    s = (q @ k.transpose(-2, -1)) * scale
    t, n = s.shape[-2:]
    if causal:
        s = s.masked_fill(~torch.ones(t, n, dtype=torch.bool).tril(), float("-inf"))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.double()
    m = s.amax(-1, keepdim=True)
    m = m.masked_fill(m == float("-inf"), 0.0)
    e = torch.exp(s - m)
    tot = e.sum(-1, keepdim=True)
    safe = tot.masked_fill(tot == 0, 1.0)
    return e @ v / safe, (m + torch.log(safe)).squeeze(-1).masked_fill(tot.squeeze(-1) == 0, 0.0)


def _heads(lead, t, e, g, transposed=True):
    """[*lead, t, e]; with two leading dims a transposed view of [B, t, H, e] (as a model makes)."""
    if transposed and len(lead) == 2:
        return torch.randn(lead[0], t, lead[1], e, generator=g).transpose(1, 2)
    return torch.randn(*lead, t, e, generator=g)


def _run(lead, t, s, e, ev, causal, mask_kind, cfg=None, seed=0, scale=None):
    g = torch.Generator().manual_seed(seed)
    q, k, v = _heads(lead, t, e, g), _heads(lead, s, e, g), _heads(lead, s, ev, g)
    mask = None
    if mask_kind == "f32":
        mask = torch.randn(*lead[:1], *([1] * (len(lead) - 1)), t, s, generator=g)
    elif mask_kind == "bool":
        mask = torch.rand(*lead[:1], *([1] * (len(lead) - 1)), 1, s, generator=g) > 0.3
    pa = A.PreparedAttention(tuple(lead), t, s, e, ev, scale, causal, mask_kind, cfg=cfg)
    out, lse = pa(q, k, v, mask)
    want_out, want_lse = _reference(q, k, v, mask, causal, 1 / math.sqrt(e) if scale is None else scale)
    assert out.shape == (*lead, t, ev) and lse.shape == (*lead, t)
    tol = 2e-6 * max(1.0, float(want_out.abs().max())) * math.sqrt(max(e, ev) / 16)
    assert float((out.double() - want_out).abs().max()) <= tol
    assert float((lse.double() - want_lse).abs().max()) <= 2e-5 * max(1.0, float(want_lse.abs().max()))
    return out, lse


# T, S: one row and one key, tiles with rows left over (T % 6), key blocks with keys left over
# (S % 64 and S % 16), several key blocks, cross attention longer and shorter than the queries.
SHAPES = [(1, 1), (7, 5), (37, 37), (64, 64), (130, 130), (50, 170), (90, 20)]


@pytest.mark.parametrize("lanes", [8, 16])
def test_every_shape_and_mask_matches_the_formula(lanes):
    # 16 lanes are AVX-512's tile; on a CPU without it LLVM splits the vectors, slower but exact.
    cfg = A.attention_config(lanes)
    for i, (t, s) in enumerate(SHAPES):
        for causal in (False, True):
            for kind in ("", "f32", "bool"):
                _run((2, 3), t, s, 48, 32, causal, kind, cfg=cfg, seed=i)


def test_head_sizes_leading_dims_and_scale():
    for lead in [(), (5,), (2, 2)]:
        for e, ev in [(64, 64), (128, 128), (5, 16), (3, 16), (80, 80), (24, 144)]:
            _run(lead, 20, 30, e, ev, True, "", scale=0.3)


def test_rows_with_no_visible_key_give_zeros_and_lse_zero():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 9, 16, generator=g) for _ in range(3))
    mask = torch.ones(1, 1, 9, 9, dtype=torch.bool)
    mask[..., 4, :] = False                 # row 4 sees nothing
    mask[..., 0, 0] = False                 # causal row 0 then sees nothing either
    out, lse = A.PreparedAttention((1, 2), 9, 9, 16, 16, None, True, "bool")(q, k, v, mask)
    assert torch.equal(out[..., 4, :], torch.zeros(1, 2, 16)) and torch.equal(lse[..., 4], torch.zeros(1, 2))
    assert torch.equal(out[..., 0, :], torch.zeros(1, 2, 16)) and torch.equal(lse[..., 0], torch.zeros(1, 2))
    want_out, _ = _reference(q, k, v, mask, True, 0.25)
    assert float((out.double() - want_out).abs().max()) <= 2e-6


def test_a_nan_reaches_the_rows_that_see_it():
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 1, 8, 16, generator=g) for _ in range(3))
    k[0, 0, 5, 3] = float("nan")
    out, _ = A.PreparedAttention((1, 1), 8, 8, 16, 16, None, True, "")(q, k, v)
    assert not torch.isnan(out[0, 0, :5]).any()     # causal rows before key 5 never see it
    assert torch.isnan(out[0, 0, 5:]).all()


def test_the_output_is_a_view_whose_transpose_is_contiguous():
    out, _ = _run((2, 4), 10, 10, 16, 16, False, "")
    assert out.transpose(1, 2).is_contiguous()        # [B, T, H, E] memory: the reshape after is free


def test_two_threads_agree_with_one_on_the_team_and_on_the_pool(monkeypatch):
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(4, 4, 128, 64, generator=g) for _ in range(3))
    pa = A.PreparedAttention((4, 4), 128, 128, 64, 64, None, True, "")
    assert pa.parallel
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = [t.clone() for t in pa(q, k, v)]
        torch.set_num_threads(2)
        two = pa(q, k, v)
        monkeypatch.setattr(cpu, "_SPLIT", False)    # as on a machine whose torch uses no libgomp
        pool = pa(q, k, v)
    finally:
        torch.set_num_threads(old)
    for a, b, c in zip(one, two, pool):
        assert torch.equal(a, b) and torch.equal(a, c)


def test_what_the_kernel_does_not_take_is_said():
    assert A.supported((2, 8, 16), (2, 8, 16), (2, 8, 16)) is None
    assert "multiple" in A.supported((2, 8, 16), (2, 8, 16), (2, 8, 12))
    assert "empty" in A.supported((2, 0, 16), (2, 8, 16), (2, 8, 16))
    assert "keys" in A.supported((1, 8, 16), (1, A.MAX_KEYS + 1, 16), (1, A.MAX_KEYS + 1, 16))
    with pytest.raises(ValueError, match="multiple of"):
        A.PreparedAttention((1,), 4, 4, 8, 12, None, False, "")


# --- in the executor ------------------------------------------------------------------------

def _attention_graph(mask_dtype=None, causal=False):
    from partita.ir import Builder, TensorType, verify
    from partita.ir.dtypes import DTYPES

    b = Builder()
    t = TensorType((2, 4, 24, 16), DTYPES["f32"])
    q, k, v = (b.input(n, t) for n in "qkv")
    ops = [q, k, v]
    if mask_dtype is not None:
        ops.append(b.input("mask", TensorType((2, 1, 24, 24), DTYPES[mask_dtype])))
    out, lse = b.attention(*ops, causal=causal)
    # the transpose and reshape a model puts after the heads
    y = b.reshape(b.transpose(out, perm=[0, 2, 1, 3]), shape=[2, 24, 64])
    return verify(b.ret(y, lse))


@pytest.mark.parametrize("mask_dtype,causal", [(None, True), ("f32", False), ("bool", True)])
def test_compiled_programs_run_attention_nodes_on_the_kernel(mask_dtype, causal):
    from partita.codegen import CompiledProgram

    from strategies import random_inputs, run_reference

    g = _attention_graph(mask_dtype, causal)
    inputs = random_inputs(g, 7)
    want = run_reference(g, inputs)
    prog = CompiledProgram(g.clone())
    assert len(prog.attention_kernels) == 1
    got = prog({k: torch.from_numpy(v) for k, v in inputs.items()})
    for a, b in zip(got, want):
        assert float(abs(a.numpy() - b).max()) <= 1e-5 * max(1.0, float(abs(b).max()))


def test_the_flash_kernel_is_kept_when_asked(monkeypatch):
    from partita.codegen import CompiledProgram

    monkeypatch.setattr(A, "ATTENTION", "flash")
    assert CompiledProgram(_attention_graph()).attention_kernels == []


def test_other_dtypes_stay_on_the_ops_step():
    from partita.codegen import CompiledProgram
    from partita.ir import Builder, TensorType, verify
    from partita.ir.dtypes import DTYPES

    b = Builder()
    t = TensorType((2, 8, 16), DTYPES["f64"])
    q, k, v = (b.input(n, t) for n in "qkv")
    out, _ = b.attention(q, k, v)
    assert CompiledProgram(verify(b.ret(out))).attention_kernels == []


def _rope(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), -1) * sin


@pytest.mark.parametrize("lanes", [8, 16])
def test_rotary_embedding_applied_inside_equals_rotating_first(lanes):
    cfg = A.attention_config(lanes)
    g = torch.Generator().manual_seed(8)
    for lead, t, e, causal, kind in [((2, 3), 37, 64, True, ""), ((1, 2), 70, 32, False, "bool"), ((4,), 9, 16, True, "f32")]:
        q, k, v = _heads(lead, t, e, g), _heads(lead, t, e, g), _heads(lead, t, 16, g)
        ang = torch.arange(t)[:, None] * torch.rand(e // 2, generator=g)[None, :]
        ang = torch.cat((ang, ang), -1)
        cos, sin = torch.cos(ang)[None], torch.sin(ang)[None]        # [1, t, e], broadcast
        mask = None
        if kind == "f32":
            mask = torch.randn(t, t, generator=g)
        elif kind == "bool":
            mask = torch.rand(t, t, generator=g) > 0.2
        pa = A.PreparedAttention(lead, t, t, e, 16, None, causal, kind, cfg=cfg, rope=True)
        out, lse = pa(q, k, v, mask, cos, sin)
        want_out, want_lse = _reference(_rope(q, cos, sin), _rope(k, cos, sin), v, mask, causal, 1 / math.sqrt(e))
        assert float((out.double() - want_out).abs().max()) <= 1e-5
        assert float((lse.double() - want_lse).abs().max()) <= 1e-5 * max(1.0, float(want_lse.abs().max()))
