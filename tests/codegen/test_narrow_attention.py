"""The generated attention kernel on narrower vectors for heads the machine's lanes do not divide
(codegen/narrow_attention.py): the config picked, the kernel against the formula in float64 on
odd shapes (heads of 4, 8, 12 and 20, one key, one row, rows and keys left over, masks, causal),
and the executor taking such attention nodes (MobileViT's heads of 8) on the kernel."""

from __future__ import annotations

import math

import pytest
import torch

from partita.codegen import attention as A
from partita.codegen import narrow_attention as NA
from partita.codegen.lowering import vector_width


def reference(q, k, v, mask, causal, scale):
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


def test_the_narrow_config_is_picked_only_for_heads_the_lanes_do_not_divide():
    lanes = vector_width()
    q = (2, 3, 5, 8)
    assert NA.narrow_config(q, q, (2, 3, 5, lanes), 1, A.supported) is None      # taken as it is
    if lanes > 8:
        assert NA.narrow_config(q, q, (2, 3, 5, 8), 1, A.supported) == (8, 4, 1, 1)
    assert NA.narrow_config(q, q, (2, 3, 5, 12), 1, A.supported) == (4, 4, 1, 1)
    assert NA.narrow_config(q, q, (2, 3, 5, 6), 1, A.supported) is None          # no lane count divides 6
    assert NA.narrow_config((2, 3, 5, 8), (2, 4, 5, 8), (2, 4, 5, 12), 1, A.supported) is None  # heads differ
    big = (1, A.MAX_KEYS + 1, 8)
    assert NA.narrow_config((1, 4, 8), big, big[:-1] + (12,), 1, A.supported) is None  # too many keys


# (lead, T, S, E, Ev, causal, mask): MobileViT's [16, 2, 4, 8] and one-key [16, 2, 1, 12]; a head
# of 20 and of 4; rows and keys left over a tile and a block; cross attention
CASES = [
    ((16, 2), 4, 4, 8, 8, False, ""),
    ((16, 2), 1, 1, 12, 12, False, ""),
    ((3, 5), 7, 9, 12, 12, True, ""),
    ((2,), 13, 6, 20, 20, False, "f32"),
    ((2, 3), 9, 17, 4, 4, True, "bool"),
    ((1, 1), 1, 33, 8, 24, False, "bool"),
    ((), 5, 3, 12, 8, False, "f32"),
]


@pytest.mark.parametrize("lead,t,s,e,ev,causal,kind", CASES)
def test_the_kernel_on_narrow_vectors_matches_the_formula(lead, t, s, e, ev, causal, kind):
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(*lead, n, d, generator=g) for n, d in ((t, e), (s, e), (s, ev)))
    mask = None
    if kind == "f32":
        mask = torch.randn(t, s, generator=g)
    elif kind == "bool":
        mask = torch.rand(1, s, generator=g) > 0.3
        mask[0, 0] = True
    cfg = NA.narrow_config((*lead, t, e), (*lead, s, e), (*lead, s, ev), 1, A.supported)
    if ev % vector_width() == 0:
        assert cfg is None
        cfg = NA.narrow_config((*lead, t, e), (*lead, s, e), (*lead, s, ev + 4), 1, A.supported)
    assert cfg is not None
    pa = A.PreparedAttention(tuple(lead), t, s, e, ev, None, causal, kind, cfg=A.AttentionConfig(*cfg))
    out, lse = pa(q, k, v, mask)
    want_out, want_lse = reference(q, k, v, mask, causal, 1 / math.sqrt(e))
    assert out.shape == (*lead, t, ev) and lse.shape == (*lead, t)
    assert float((out.double() - want_out).abs().max()) <= 2e-6 * max(1.0, float(want_out.abs().max()))
    assert float((lse.double() - want_lse).abs().max()) <= 2e-5 * max(1.0, float(want_lse.abs().max()))


@pytest.mark.parametrize("shape", [(16, 2, 4, 8), (16, 2, 1, 12), (2, 3, 7, 20)])
def test_compiled_programs_run_narrow_heads_on_the_kernel(shape):
    from partita.codegen import CompiledProgram
    from partita.ir import Builder, TensorType, verify
    from partita.ir.dtypes import DTYPES

    from strategies import random_inputs, run_reference

    b = Builder()
    t = TensorType(shape, DTYPES["f32"])
    q, k, v = (b.input(n, t) for n in "qkv")
    out, lse = b.attention(q, k, v, scale=0.3)
    bb, h, n, e = shape
    y = b.reshape(b.transpose(out, perm=[0, 2, 1, 3]), shape=[bb, n, h * e])
    g = verify(b.ret(y, lse))
    inputs = random_inputs(g, 5)
    want = run_reference(g, inputs)
    prog = CompiledProgram(g.clone())
    assert len(prog.attention_kernels) == (1 if NA.ENABLED else 0)
    got = prog({k2: torch.from_numpy(x) for k2, x in inputs.items()})
    for a, w in zip(got, want):
        assert float(abs(a.numpy() - w).max()) <= 1e-5 * max(1.0, float(abs(w).max()))
