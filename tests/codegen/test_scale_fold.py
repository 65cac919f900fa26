"""scale-fold (partita/codegen/scale_fold.py): per-feature scales of linear layers' inputs and
outputs, and norms' weights and biases before linear layers, folded into the layers' known
weights; the reference interpreter gives the same results before and after on odd widths,
nothing is folded where a value on the way has another reader, an activation stands between,
or the scale is not known; a frozen program folds them and matches eager, and
PARTITA_SCALE_FOLD=0 leaves them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

import partita
from partita.backend import numpy_ref
from partita.codegen import CompiledProgram
from partita.codegen.scale_fold import fold_scales
from partita.ir import verify
from partita.passes import PassManager


def _library(m: nn.Module, *args: torch.Tensor):
    g = partita.import_torch(m, args)
    return verify(PassManager.parse("canonicalize,fuse-library,dce").run(g))


def _folded(m: nn.Module, *args: torch.Tensor) -> tuple[int, object, object]:
    """(folds made, the graph before, after), the reference agreeing before and after."""
    g = _library(m, *args)
    h = g.clone()
    n = fold_scales(h)
    verify(h)
    arrays = [a.numpy() for a in args]
    for a, b in zip(numpy_ref.run(g, arrays), numpy_ref.run(h, arrays)):
        np.testing.assert_allclose(b, a, rtol=2e-5, atol=2e-5)
    with torch.no_grad():
        want = m(*args)
    np.testing.assert_allclose(numpy_ref.run(h, arrays)[0], want.numpy(), rtol=2e-5, atol=2e-5)
    return n, g, h


def _count(g, op: str) -> int:
    return sum(n.op == op for n in g.nodes)


class _LayerScale(nn.Module):
    """ConvNeXt's block end: gamma * pwconv2(gelu(pwconv1(x))), [B, H, W, C] channels last."""

    def __init__(self, c: int, bias: bool = True) -> None:
        super().__init__()
        self.fc1 = nn.Linear(c, 3 * c)
        self.fc2 = nn.Linear(3 * c, c, bias=bias)
        self.gamma = nn.Parameter(torch.randn(c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.gamma * self.fc2(torch.nn.functional.gelu(self.fc1(x)))


@pytest.mark.parametrize("bias", [True, False])
def test_layer_scale_folds_into_the_output_rows(bias):
    torch.manual_seed(0)
    n, g, h = _folded(_LayerScale(7, bias).eval(), torch.randn(2, 3, 5, 7))
    assert n == 1 and _count(g, "mul") == 1 and _count(h, "mul") == 0
    assert not any("gamma" in str(v.name) for v in h.inputs)   # read by nothing else: gone


class _Head(nn.Module):
    """A norm, a scalar scale and a head tied to the embedding (T5's end: the norm folds once
    the scale has)."""

    def __init__(self, vocab: int, d: int, rms: bool) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.norm = nn.RMSNorm(d, eps=1e-6) if rms else nn.LayerNorm(d)
        with torch.no_grad():
            self.norm.weight.copy_(torch.rand(d) + 0.5)
            if not rms:
                self.norm.bias.copy_(torch.randn(d))
        self.fc = nn.Linear(d, d)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.fc(self.emb(ids)))
        return (h * self.emb.weight.shape[1] ** -0.5) @ self.emb.weight.t()


@pytest.mark.parametrize("rms", [True, False])
def test_tied_head_scale_and_norm_weights_fold(rms):
    torch.manual_seed(1)
    m = _Head(13, 11, rms).eval()
    n, g, h = _folded(m, torch.randint(0, 13, (3, 5)))
    assert n >= 2
    assert _count(h, "mul") == 0
    norm = next(x for x in h.nodes if x.op in ("rms_norm", "layer_norm"))
    assert len(norm.operands) == 1                       # the norm keeps no weight
    names = {str(v.name) for v in h.inputs}
    assert "emb.weight" in names                         # the embedding still reads it unscaled


class _Qkv(nn.Module):
    """An RMSNorm read by three projections, or by two and a residual add (not folded)."""

    def __init__(self, d: int, residual: bool) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(d, eps=1e-6)
        with torch.no_grad():
            self.norm.weight.copy_(torch.rand(d) + 0.5)
        self.q, self.k, self.v = nn.Linear(d, 5, bias=False), nn.Linear(d, 3), nn.Linear(d, 9, bias=False)
        self.residual = residual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = self.norm(x)
        out = torch.cat([self.q(n), self.k(n), self.v(n)], dim=-1)
        return torch.cat([out, n], dim=-1) if self.residual else out


def test_norm_weight_folds_into_every_reading_layer():
    torch.manual_seed(2)
    n, _, h = _folded(_Qkv(6, residual=False).eval(), torch.randn(4, 3, 6))
    assert n == 1
    assert all(len(x.operands) == 1 for x in h.nodes if x.op == "rms_norm")


def test_norm_with_another_reader_keeps_its_weight():
    torch.manual_seed(3)
    n, g, h = _folded(_Qkv(6, residual=True).eval(), torch.randn(4, 3, 6))
    assert n == 0 and h.structurally_equal(g)


class _NotFoldable(nn.Module):
    """A scale after an activation, a scale by a runtime input, a scaled output read twice."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(5, 7), nn.Linear(5, 7), nn.Linear(5, 7)
        self.s = nn.Parameter(torch.randn(7))

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        a = torch.relu(self.a(x)) * self.s
        b = self.b(x) * t
        c = self.c(x)
        return a + b + c * self.s + c


def test_nothing_folds_where_it_would_change_the_meaning():
    torch.manual_seed(4)
    n, g, h = _folded(_NotFoldable().eval(), torch.randn(3, 5), torch.randn(7))
    assert n == 0 and h.structurally_equal(g)


def test_frozen_program_folds_and_matches_eager(monkeypatch):
    torch.manual_seed(5)
    m = _LayerScale(9).eval()
    x = torch.randn(2, 4, 3, 9)
    g = _library(m, x)
    with torch.no_grad():
        want = m(x)
    on = CompiledProgram(g, freeze=True)
    assert _count(on.graph, "mul") == 0
    np.testing.assert_allclose(on([x])[0].numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    monkeypatch.setenv("PARTITA_SCALE_FOLD", "0")
    off = CompiledProgram(g, freeze=True)
    assert not any(str(v.name).endswith(".scaled") for v in off.graph.inputs)
    np.testing.assert_allclose(off([x])[0].numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    unfrozen = CompiledProgram(g)
    assert not any(str(v.name).endswith(".scaled") for v in unfrozen.graph.inputs)


class _GemmaNorm(nn.Module):
    """Gemma's RMSNorm, ``x * rsqrt(mean(x^2) + eps) * (1 + w)``, before a gate and an up projection."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(d) * 0.3)
        self.gate, self.up = nn.Linear(d, 10, bias=False), nn.Linear(d, 10, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (1.0 + self.w)
        return torch.nn.functional.gelu(self.gate(n), approximate="tanh") * self.up(n)


def test_gemma_norm_weight_folds_once_its_one_plus_w_is_known():
    torch.manual_seed(6)
    m = _GemmaNorm(12).eval()
    x = torch.randn(3, 4, 12)
    g = verify(PassManager.parse("canonicalize,fold-params,fuse-library,dce").run(partita.import_torch(m, (x,))))
    h = g.clone()
    assert fold_scales(h) == 1
    verify(h)
    assert not any(v.type.shape == (12,) for v in h.inputs)   # (1 + w) is in the weights now
    with torch.no_grad():
        want = m(x).numpy()
    np.testing.assert_allclose(numpy_ref.run(h, [x.numpy()])[0], want, rtol=2e-5, atol=2e-5)


class _KnLayout(nn.Module):
    """A LayerNorm, a weight laid out [K, N] (``x @ W``) and a per-column scale after it."""

    def __init__(self, k: int, n: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(k)
        with torch.no_grad():
            self.norm.weight.copy_(torch.rand(k) + 0.5)
            self.norm.bias.copy_(torch.randn(k))
        self.w = nn.Parameter(torch.randn(k, n))
        self.s = nn.Parameter(torch.randn(1, n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.norm(x) @ self.w) * self.s


def test_weights_laid_out_k_by_n_fold_on_their_own_axes():
    torch.manual_seed(7)
    n, g, h = _folded(_KnLayout(9, 5).eval(), torch.randn(7, 9))
    layouts = {x.attrs["weight_layout"] for x in g.nodes if x.op == "linear_pointwise"}
    assert n == 2 and _count(h, "mul") == 0
    assert layouts == {"kn"}, layouts


def test_a_large_tied_weight_is_not_copied(monkeypatch):
    import partita.codegen.scale_fold as SF

    monkeypatch.setattr(SF, "MAX_SHARED_COPY", 100)   # the tied [13, 11] table is over it
    torch.manual_seed(8)
    n, g, h = _folded(_Head(13, 11, rms=True).eval(), torch.randint(0, 13, (3, 5)))
    assert n == 0 and h.structurally_equal(g)       # the head's scale stays a step, the norm its weight


class _ScaledEmbedding(nn.Module):
    """Gemma's embedding scale, the table tied to the head."""

    def __init__(self, vocab: int, d: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.scale = d ** 0.5

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.emb(ids) * self.scale) @ self.emb.weight.t()


def test_an_embedding_scale_folds_into_a_copy_of_its_tied_table():
    torch.manual_seed(9)
    n, g, h = _folded(_ScaledEmbedding(17, 6).eval(), torch.randint(0, 17, (2, 5)))
    assert n == 1 and _count(h, "mul") == 0
    assert "emb.weight" in {str(v.name) for v in h.inputs}   # the head reads it unscaled
