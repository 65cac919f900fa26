"""The torch.compile backend runs the program the import path runs: each test is a small module
on which the two differed (the backend's program slower or larger), checked against eager."""

from __future__ import annotations

import pytest
import torch

import partita.codegen.dynamo as pd
from partita.codegen.library import packed_weight_stats


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    pd.reset_stats()
    yield
    torch._dynamo.reset()


class _PoolMixer(torch.nn.Module):
    """PoolFormer's token mixer: an average pool without the padding in its count (a depthwise
    convolution with a constant weight of ones, divided by a constant count map) after a
    GroupNorm, less its input."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.norm = torch.nn.GroupNorm(1, 8)
        self.pool = torch.nn.AvgPool2d(3, 1, 1, count_include_pad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(self.proj(x))
        return self.pool(y) - y


def test_program_built_under_inference_mode_packs_its_constant_weights() -> None:
    """Called under ``torch.inference_mode()`` (the graph compiled and its frozen program built at
    that first call), the program's constants are ordinary tensors: the pool's ones weight packs
    and no call runs an unpacked convolution (as inference tensors, every call did)."""
    torch.manual_seed(0)
    model = _PoolMixer().eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        want = model(x)
    compiled = torch.compile(model, backend="partita", options={"choose": "partita"})
    with torch.inference_mode():
        for _ in range(3):
            got = compiled(x)
        before = packed_weight_stats()["unpacked_calls"]
        for _ in range(3):
            got = compiled(x)
        after = packed_weight_stats()["unpacked_calls"]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    rec = pd.stats().graphs
    assert len(rec) == 1 and rec[0].fallback is None and rec[0].choice is not None and rec[0].choice.frozen
    assert after == before, "a convolution of the frozen program ran unpacked in the steady state"
    consts = [v for n in rec[0].program.graph.nodes if n.op == "constant" for v in n.results]
    assert consts, "the pool's ones weight is a constant of the program"


class _NormHead(torch.nn.Module):
    """A convolution, a GroupNorm with ReLU, a global mean and a linear head (BiT's pattern)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.norm = torch.nn.GroupNorm(2, 8)
        self.head = torch.nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.norm(self.conv(x))).mean((2, 3)))


def test_frozen_program_matches_library_patterns_on_the_params_as_they_come() -> None:
    """The library patterns run on the frozen graph before ``fold-params`` (the import path's
    order): the group norm takes its [C] weight and bias (not [1, C, 1, 1] params reshaped back
    at every call) and the linear layer its [N, K] weight (not a folded transpose)."""
    torch.manual_seed(0)
    model = _NormHead().eval()
    with torch.no_grad():
        model.norm.weight.uniform_(0.5, 1.5)
        model.norm.bias.uniform_(-0.5, 0.5)
    x = torch.randn(2, 3, 12, 12)
    with torch.no_grad():
        want = model(x)
        got = torch.compile(model, backend="partita", options={"choose": "partita"})(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    (rec,) = pd.stats().graphs
    assert rec.program is not None and rec.choice is not None and rec.choice.frozen
    nodes = {n.op: n for n in rec.program.graph.nodes}
    assert "group_norm" in nodes and "linear_pointwise" in nodes, sorted(nodes)
    assert [v.type.shape for v in nodes["group_norm"].operands[1:]] == [(8,), (8,)]
    assert nodes["linear_pointwise"].operands[1].type.shape == (5, 8)
