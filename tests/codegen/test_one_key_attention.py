"""Attention over one key spelled out in ops taken into one attention node
(codegen/one_key_attention.py): MobileViT's self-attention on patches of one pixel, imported
from torch, becomes one attention node (its k^T a reshape after canonicalize), and the compiled
program matches eager; other shapes (several keys) still fuse as before, and a one-key softmax
that is not attention is left alone."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import partita
from partita.codegen import CompiledProgram

PIPELINE = "canonicalize,fold-batch-norm,fuse-library,fuse-kernels,cse,dce"


class SelfAttention(nn.Module):
    """transformers' MobileViTSelfAttention: matmul, division by sqrt(E), softmax, matmul."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads, self.size = heads, hidden // heads
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))

    def split(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(*x.shape[:-1], self.heads, self.size).permute(0, 2, 1, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.split(self.query(x)), self.split(self.key(x)), self.split(self.value(x))
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.size)
        p = torch.softmax(s, dim=-1)
        o = torch.matmul(p, v).permute(0, 2, 1, 3).contiguous()
        return o.view(*o.shape[:-2], self.heads * self.size)


def _compiled(model: nn.Module, x: torch.Tensor):
    g = partita.optimize(partita.import_torch(model, (x,)), PIPELINE)
    return g, CompiledProgram(g, freeze=True)


@pytest.mark.parametrize("batch,seq,hidden,heads", [(16, 1, 24, 2), (16, 1, 32, 2), (3, 1, 20, 5), (4, 3, 24, 2)])
def test_spelled_attention_becomes_one_attention_node(batch, seq, hidden, heads):
    torch.manual_seed(0)
    model = SelfAttention(hidden, heads).eval()
    x = torch.randn(batch, seq, hidden)
    g, prog = _compiled(model, x)
    ops = [n.op for n in g.nodes]
    assert ops.count("attention") == 1 and "softmax" not in ops
    weights = {k: torch.from_numpy(v.copy()) for k, v in g.weights.items()}
    got = prog([x], weights)[0]
    with torch.no_grad():
        want = model(x)
    assert float((got - want).abs().max()) <= 1e-5 * max(1.0, float(want.abs().max()))


def test_a_one_key_softmax_that_is_not_attention_is_left_alone():
    class NotAttention(nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            s = torch.matmul(a, b.reshape(8, 6, 1)) / 2.0   # [8, 3, 1], not 4-d scores
            return torch.softmax(s, dim=-1) * 3.0

    a, b = torch.randn(8, 3, 6), torch.randn(8, 1, 6)
    g = partita.optimize(partita.import_torch(NotAttention(), (a, b)), PIPELINE)
    ops = [n.op for n in g.nodes]
    assert "attention" not in ops and "softmax" in ops
