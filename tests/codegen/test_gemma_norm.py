"""Gemma's RMSNorm, ``x * rsqrt(mean(x^2) + eps) * (1 + w)`` with the ``1 + w`` written after
the statistics, taken into one ``rms_norm`` node by fuse-library (norm.fuse_rms_norm moves the
weight's nodes up), on odd widths, against torch; and a weight made from an input is left alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import partita
from partita.codegen import CompiledProgram


class GemmaRMSNorm(torch.nn.Module):
    """As transformers' Gemma2RMSNorm writes it."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.randn(dim) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (out * (1.0 + self.weight.float())).type_as(x)


class Block(torch.nn.Module):
    """A norm, a linear, a post-norm and the residual add, as a Gemma2 layer strings them."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.pre, self.post = GemmaRMSNorm(dim), GemmaRMSNorm(dim)
        self.lin = torch.nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.post(self.lin(self.pre(x)))


@pytest.mark.parametrize("dim", [64, 37, 8])
def test_gemma_rms_norm_is_one_node_and_keeps_its_meaning(dim):
    torch.manual_seed(dim)
    m = Block(dim).eval()
    x = torch.randn(3, 5, dim)
    g = partita.optimize(partita.import_torch(m, (x,)), "canonicalize,fuse-library,cse,dce")
    ops = [n.op for n in g.nodes]
    assert ops.count("rms_norm") + ops.count("add_norm") == 2 and "rsqrt" not in ops and "pow" not in ops
    weights = {k: torch.from_numpy(np.array(v, copy=True)) for k, v in g.weights.items()}
    with torch.no_grad():
        want = m(x)
    for freeze in (False, True):
        got = CompiledProgram(g, freeze=freeze)([x], weights)[0]
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


class InputWeight(torch.nn.Module):
    """The norm's weight made from an input after the statistics: not moved up, left as it is."""

    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return out * torch.tanh(w)


def test_a_weight_not_made_from_params_alone_is_left_alone():
    x, w = torch.randn(2, 4, 16), torch.randn(16)
    g = partita.optimize(partita.import_torch(InputWeight(), (x, w)), "canonicalize,fuse-library,cse,dce")
    ops = [n.op for n in g.nodes]
    got = CompiledProgram(g)([x, w])[0]
    torch.testing.assert_close(got, InputWeight()(x, w), rtol=1e-5, atol=1e-5)
    assert "tanh" in ops
