"""The generated attention's call sets every parameter slot once per layout and only the
pointers while the strides stay (codegen/attention.py, ``PreparedAttention``): one prepared
kernel called in turn with new tensors of the same layout, with other strides (a transposed
view, a contiguous copy), with a mask broadcast differently and with rotary tables, each call
against torch's formula."""

from __future__ import annotations

import math

import pytest
import torch

import partita.codegen.attention as A


def _reference(q, k, v, mask, scale):
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    if mask is not None:
        s = s + mask.double()
    return torch.softmax(s, -1) @ v.double()


def _rope(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), -1) * sin


def _bthe(b, t, h, e, g):
    """[B, H, T, E] as a view of [B, T, H, E] memory (the projection's layout)."""
    return torch.randn(b, t, h, e, generator=g).transpose(1, 2)


@pytest.mark.parametrize("lanes", [8, 16])
def test_calls_with_new_tensors_and_layouts(lanes):
    cfg = A.attention_config(lanes)
    g = torch.Generator().manual_seed(3)
    b, h, t, s, e, ev = 3, 2, 5, 7, 9, 16
    pa = A.PreparedAttention((b, h), t, s, e, ev, 0.3, False, "f32", cfg=cfg)
    layouts = [
        lambda: (_bthe(b, t, h, e, g), _bthe(b, s, h, e, g), _bthe(b, s, h, ev, g), torch.randn(h, t, s, generator=g)),
        lambda: (_bthe(b, t, h, e, g), _bthe(b, s, h, e, g), _bthe(b, s, h, ev, g), torch.randn(h, t, s, generator=g)),
        lambda: (torch.randn(b, h, t, e, generator=g), torch.randn(b, h, s, e, generator=g),
                 torch.randn(b, h, s, ev, generator=g), torch.randn(b, 1, t, s, generator=g)),
        lambda: (_bthe(b, t, h, e, g), _bthe(b, s, h, e, g), _bthe(b, s, h, ev, g),
                 torch.randn(s, t, generator=g).t()),   # the mask's last dim strided: copied each call
        lambda: (_bthe(b, t, h, e, g), _bthe(b, s, h, e, g), _bthe(b, s, h, ev, g), torch.randn(t, s, generator=g)),
    ]
    for make in layouts + layouts[::-1]:
        q, k, v, mask = make()
        out, _ = pa(q, k, v, mask)
        assert float((out.double() - _reference(q, k, v, mask, 0.3)).abs().max()) <= 1e-5


def test_rotary_tables_new_each_call():
    g = torch.Generator().manual_seed(4)
    lead, t, e = (2, 3), 6, 16
    pa = A.PreparedAttention(lead, t, t, e, 16, None, False, "", rope=True)
    for _ in range(3):
        q, k, v = (torch.randn(*lead, t, d, generator=g) for d in (e, e, 16))
        ang = torch.arange(t)[:, None] * torch.rand(e // 2, generator=g)[None, :]
        ang = torch.cat((ang, ang), -1)
        cos, sin = torch.cos(ang)[None], torch.sin(ang)[None]
        out, _ = pa(q, k, v, None, cos, sin)
        want = _reference(_rope(q, cos, sin), _rope(k, cos, sin), v, None, 1 / math.sqrt(e))
        assert float((out.double() - want).abs().max()) <= 1e-5
