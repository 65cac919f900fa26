"""merge-linears (partita/codegen/merge_linear.py): linear layers on one input with known
weights become one layer and a split of its columns; the reference interpreter gives the same
results before and after (odd widths, with and without biases, both weight layouts), layers
that differ (activation, bias presence, input) stay apart, and a frozen program merges q, k and
v and cross-attention's k and v across layers and matches eager."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

import partita
from partita.backend import numpy_ref
from partita.codegen import CompiledProgram
from partita.codegen.merge_linear import merge_sibling_linears
from partita.ir import verify
from partita.passes import PassManager


class _Heads(nn.Module):
    """Three projections of one input (odd widths), an activated one read by a concat, a gated
    pair (SiLU times a projection) and one of another input."""

    def __init__(self, bias: bool) -> None:
        super().__init__()
        self.q = nn.Linear(11, 5, bias=bias)
        self.k = nn.Linear(11, 7, bias=bias)
        self.v = nn.Linear(11, 3, bias=bias)
        self.up = nn.Linear(11, 6)
        self.gate = nn.Linear(11, 4, bias=bias)
        self.up2 = nn.Linear(11, 4, bias=bias)
        self.other = nn.Linear(11, 5, bias=bias)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q(x), self.k(x), self.v(x)
        u = torch.relu(self.up(x))           # read by a concat: keeps its own layer
        gate = nn.functional.silu(self.gate(x)) * self.up2(x)   # SiLU leaves its GEMM for the product
        return torch.cat([q * 2.0, k * 3.0, v, u, gate, self.other(y)], dim=-1)


def _library(m: nn.Module, *args: torch.Tensor):
    g = partita.import_torch(m, args)
    return verify(PassManager.parse("canonicalize,fuse-library,dce").run(g))


@pytest.mark.parametrize("bias", [True, False])
def test_sibling_layers_merge_and_the_reference_agrees(bias):
    torch.manual_seed(0)
    m = _Heads(bias).eval()
    x, y = torch.randn(6, 11), torch.randn(6, 11)
    g = _library(m, x, y)
    before = numpy_ref.run(g, [x.numpy(), y.numpy()])[0]
    n_before = sum(n.op == "linear_pointwise" for n in g.nodes)
    merged = g.clone()
    gone = merge_sibling_linears(merged)
    verify(merged)
    assert gone == 4   # q, k, v, gate, up2 as one; up (relu) and other (another input) apart
    assert sum(n.op == "linear_pointwise" for n in merged.nodes) == n_before - 4
    assert [tuple(n.attrs["sizes"]) for n in merged.nodes if n.op == "split"] == [(5, 7, 3, 4, 4)]
    assert sum(n.op == "silu" for n in merged.nodes) == 1
    after = numpy_ref.run(merged, [x.numpy(), y.numpy()])[0]
    np.testing.assert_allclose(after, before, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(after, m(x, y).detach().numpy(), rtol=1e-5, atol=1e-5)
    # the old weights went; the merged ones hold the concatenation
    assert not {"q.weight", "k.weight", "v.weight"} & set(merged.weights)
    assert "q.weight.merged" in merged.weights and merged.weights["q.weight.merged"].shape == (23, 11)


def test_a_weight_that_is_not_known_is_not_merged():
    torch.manual_seed(0)
    m = _Heads(True).eval()
    x, y = torch.randn(6, 11), torch.randn(6, 11)
    g = _library(m, x, y)
    for v in g.inputs:
        if v.role == "param" and str(v.name).startswith("k."):
            del g.weights[str(v.name)]
    assert merge_sibling_linears(g) == 3   # q, v, gate and up2
    verify(g)


class _CrossAttention(nn.Module):
    """Two decoder layers: self-attention q, k, v of the decoder state and cross-attention k, v
    of the encoder's output in both layers (T5's pattern), heads reshaped and transposed."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.ModuleList([nn.Linear(16, 16, bias=False) for _ in range(3)])
        self.cross = nn.ModuleList([nn.Linear(16, 16, bias=False) for _ in range(4)])
        self.o = nn.Linear(16, 16)

    def forward(self, h: torch.Tensor, enc: torch.Tensor) -> torch.Tensor:
        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(2, -1, 4, 4).transpose(1, 2)
        q, k, v = (heads(lin(h)) for lin in self.qkv)
        a = torch.softmax(q @ k.transpose(-1, -2), -1) @ v
        out = h
        for i in range(2):
            ck, cv = heads(self.cross[2 * i](enc)), heads(self.cross[2 * i + 1](enc))
            c = torch.softmax(a @ ck.transpose(-1, -2), -1) @ cv
            out = out + self.o(c.transpose(1, 2).reshape(h.shape))
        return out


def test_frozen_program_merges_and_matches_eager():
    torch.manual_seed(0)
    m = _CrossAttention().eval()
    h, enc = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    g = partita.import_torch(m, (h, enc))
    prog = CompiledProgram(g, freeze=True)
    splits = sorted(tuple(n.attrs["sizes"]) for n in prog.graph.nodes if n.op == "split")
    assert (16, 16, 16) in splits and (16, 16, 16, 16) in splits
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(prog([h, enc])[0], m(h, enc), rtol=1e-5, atol=1e-5)
    # without freezing the weights may change at a call: nothing is merged
    loose = CompiledProgram(g)
    assert not any(n.op == "split" for n in loose.graph.nodes)
    with torch.no_grad():
        torch.testing.assert_close(loose([h, enc])[0], m(h, enc), rtol=1e-5, atol=1e-5)
