"""The torch.compile backend reaches the import path's program on vision models' resizes
(MobileViT's bilinear ``F.interpolate``): the same steps, by op, and eager's results."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.nn.functional as F

import partita
import partita.codegen.dynamo as pd
from partita.codegen import CompiledProgram
from partita.frontend.fx_interpolate import interpolation_args, keep_interpolations

IMPORT_PIPELINE = "canonicalize,fold-batch-norm,fuse-library,fuse-kernels,cse,dce"


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    pd.reset_stats()
    yield
    torch._dynamo.reset()


class _Resizes(torch.nn.Module):
    """MobileViT's unfolding resize (bilinear to a size) and back, a scale factor, nearest and
    align_corners, between convolutions."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.out = torch.nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.silu(self.bn(self.conv(x)))
        h, w = y.shape[2:]
        a = F.interpolate(y, size=(8, 8), mode="bilinear", align_corners=False)
        a = F.interpolate(a * 2.0, size=(h, w), mode="bilinear", align_corners=False)
        b = F.interpolate(a, scale_factor=1.7, mode="bilinear")
        c = F.interpolate(b, scale_factor=(0.6, 1.3), mode="nearest")
        d = F.interpolate(c, size=5, mode="bilinear", align_corners=True)
        e = F.interpolate(d, scale_factor=2.5, mode="nearest", recompute_scale_factor=True)
        return self.out(e)


def _op_counts(graph: partita.Graph) -> Counter:
    return Counter(n.op for n in graph.nodes if n.op not in ("constant", "input"))


def _import_program(model: torch.nn.Module, x: torch.Tensor) -> CompiledProgram:
    g = partita.optimize(partita.import_torch(model, (x,)), IMPORT_PIPELINE)
    return CompiledProgram(g, freeze=True)


@pytest.mark.parametrize("shape", [(2, 3, 6, 9), (1, 3, 7, 5)])
def test_backend_keeps_interpolations_as_the_import_path(shape: tuple[int, ...]) -> None:
    """Each resize is the import path's two products (bilinear) or gathers (nearest), not
    AOTAutograd's decomposition into iota, where and index gathers; the results are eager's."""
    torch.manual_seed(0)
    model = _Resizes().eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-1, 1)
        model.bn.running_var.uniform_(0.5, 2)
    x = torch.randn(*shape)
    with torch.no_grad():
        want = model(x)
        compiled = torch.compile(model, backend="partita", options={"choose": "partita"})
        got = compiled(x)
        got = compiled(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    rec = pd.stats().graphs
    assert len(rec) == 1 and rec[0].fallback is None and rec[0].program is not None
    backend = _op_counts(rec[0].program.graph)
    assert backend == _op_counts(_import_program(model, x).graph)
    assert backend["index_select"] == 4 and "where" not in backend


def test_training_graph_keeps_the_decomposition() -> None:
    """A graph that needs gradients is traced as before (the custom op has no autograd formula):
    its gradients match eager's."""
    torch.manual_seed(0)
    model = _Resizes().train()
    x = torch.randn(2, 3, 6, 9)
    want = model(x)
    want.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    torch.manual_seed(0)
    compiled = torch.compile(model, backend="partita")
    got = compiled(x)
    got.sum().backward()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    for p, g in zip(model.parameters(), grads):
        torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-4)
    assert all(r.fallback is None for r in pd.stats().graphs)


def test_dynamo_graph_restored_and_unsupported_calls_left_alone() -> None:
    """The rewrite lasts only while AOTAutograd traces; bicubic and antialiased calls are not taken."""
    seen: list[tuple[int, int]] = []

    def backend(gm: torch.fx.GraphModule, inputs: list) -> object:
        before = [n.target for n in gm.graph.nodes]
        with keep_interpolations(gm) as n:
            seen.append((n, sum(1 for node in gm.graph.nodes if interpolation_args(node) is not None)))
        assert [n.target for n in gm.graph.nodes] == before
        return gm.forward

    class M(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            a = F.interpolate(x, size=(5, 5), mode="bicubic", align_corners=False)
            b = F.interpolate(x, size=(5, 5), mode="bilinear", antialias=True)
            c = F.interpolate(x, size=(5, 5), mode="bilinear")
            return a + b + c

    x = torch.randn(1, 2, 4, 4)
    torch.testing.assert_close(torch.compile(M(), backend=backend)(x), M()(x))
    assert seen == [(1, 0)]


def test_graph_on_aten_runs_the_kept_interpolation() -> None:
    """A graph that falls back to its own FX code (an op partita does not convert) runs the
    custom op's own kernel, ``F.interpolate``: eager's results."""

    class M(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = F.interpolate(torch.lgamma(x.abs() + 1), scale_factor=1.5, mode="bilinear")
            return F.interpolate(y, size=(4, 3), mode="nearest")

    x = torch.randn(2, 3, 5, 6)
    with torch.no_grad(), pytest.warns(pd.PartitaFallbackWarning, match="lgamma"):
        got = torch.compile(M(), backend="partita")(x)
    torch.testing.assert_close(got, M()(x))
    assert pd.stats().fallbacks == 1
