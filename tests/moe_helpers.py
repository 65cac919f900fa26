"""A small mixture-of-experts language model for the expert-parallel tests: Mixtral's layer
(a top-2 router, gated SiLU experts stored as [E, 2F, H] and [E, H, F]) in GShard's dispatch
form (partita/frontend/moe.py), with the top-2 choice written with argmax so that it needs no
sort."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from partita.frontend.moe import dispatch_experts_forward


class Experts(nn.Module):
    """The attributes transformers' experts classes have, which the dispatch form reads."""

    def __init__(self, experts: int, hidden: int, ffn: int, groups: int) -> None:
        super().__init__()
        self.num_experts = experts
        self.gate_up_proj = nn.Parameter(torch.randn(experts, 2 * ffn, hidden) * hidden ** -0.5)
        self.down_proj = nn.Parameter(torch.randn(experts, hidden, ffn) * ffn ** -0.5)
        self.is_transposed = False
        self._partita_groups = groups
        self._partita_capacity_factor = None

    def _apply_gate(self, h: torch.Tensor) -> torch.Tensor:
        gate, up = h.chunk(2, dim=-1)
        return F.silu(gate) * up

    def forward(self, x, idx, w):
        return dispatch_experts_forward(self, x, idx, w)


def top2(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two largest logits' indices [T, 2] and their softmax weights [T, 2]."""
    e = logits.shape[-1]
    i1 = logits.argmax(-1)
    first = i1.unsqueeze(-1) == torch.arange(e)
    i2 = torch.where(first, torch.full_like(logits, -1e9), logits).argmax(-1)
    idx = torch.stack([i1, i2], dim=-1)
    return idx, torch.softmax(logits.gather(-1, idx), dim=-1)


class MoELayer(nn.Module):
    def __init__(self, experts: int, hidden: int, ffn: int, groups: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.router = nn.Linear(hidden, experts, bias=False)
        self.experts = Experts(experts, hidden, ffn, groups)

    def forward(self, x):
        b, s, h = x.shape
        t = self.norm(x).reshape(b * s, h)
        idx, w = top2(self.router(t))
        return x + self.experts(t, idx, w).reshape(b, s, h)


class MoELM(nn.Module):
    """Embedding, ``layers`` MoE layers, a norm and the LM head."""

    def __init__(self, vocab: int = 32, hidden: int = 16, ffn: int = 24, experts: int = 4, layers: int = 2,
                 groups: int = 4) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(MoELayer(experts, hidden, ffn, groups) for _ in range(layers))
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, ids):
        x = self.emb(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))
