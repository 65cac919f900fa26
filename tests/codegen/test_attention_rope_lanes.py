"""The attention kernel's rotation in vectors narrower than a register (half a head of 4, 8 or
12 floats on a 16-lane machine) and its soft-capped scores through a lane buffer: the kernel
against torch on odd head sizes, with and without the cap, grouped-query heads."""

from __future__ import annotations

import pytest
import torch

from partita.codegen.attention import PreparedAttention


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], -1)


def _reference(q, k, v, cos, sin, mask, scale, cap, group):
    qr, kr = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
    kr, v = kr.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = qr @ kr.transpose(-1, -2) * scale
    if cap:
        s = cap * torch.tanh(s / cap)
    return torch.softmax(s + mask, -1) @ v


@pytest.mark.parametrize("e", [8, 16, 24, 40, 64])
@pytest.mark.parametrize("cap", [None, 30.0])
def test_rotated_and_capped_attention_equals_torch(e, cap):
    torch.manual_seed(e)
    b, h, kv, t = 3, 4, 2, 11
    q = torch.randn(b, t, h, e).transpose(1, 2)
    k, v = torch.randn(b, kv, t, e), torch.randn(b, kv, t, 16)   # v's head a whole vector
    ang = torch.randn(t, e // 2)
    cos, sin = (torch.cat([f(ang)] * 2, -1)[None, None] for f in (torch.cos, torch.sin))
    mask = torch.where(torch.rand(b, 1, t, t) < 0.2, -1e9, 0.0)
    pa = PreparedAttention((b, h), t, t, e, 16, e ** -0.5, False, mask="f32", rope=True, group=h // kv, softcap=cap)
    got, _ = pa(q, k, v, mask, cos, sin)
    want = _reference(q, k, v, cos, sin, mask, e ** -0.5, cap, h // kv)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
