"""Per-rank programs with generated code (``launch(executor="codegen")``): fused kernels, the
AdamW kernel and the memory plan on every rank of data, ZeRO-3, tensor and pipeline parallel
programs on real gloo processes, each checked against the single-device step."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import partita
from partita.runtime import LaunchError


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.fc1(x))
        return torch.tanh(self.fc2(h)) * 0.5 + x


class MLP(nn.Module):
    """Numbered blocks (layers.0, layers.1), so a pipeline has layers to cut between."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.inp = nn.Linear(12, width)
        self.layers = nn.ModuleList([Block(width) for _ in range(2)])
        self.head = nn.Linear(width, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def _step():
    torch.manual_seed(0)
    fwd = partita.import_torch(MLP().eval(), (torch.randn(16, 12),))
    return partita.training_step(fwd, loss="cross_entropy", optimizer="adamw", lr=1e-2)


def _batches(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((16, 12)).astype(np.float32),
             "target": rng.integers(0, 6, size=16).astype(np.int64)} for _ in range(n)]


@pytest.mark.parametrize("mesh,strategy,extra", [
    ("dp=2", "dp", {}),
    ("dp=2", "zero3", {}),
    ("tp=2", "megatron", {}),
    ("pp=2", "pp", {"microbatches": 2, "schedule": "1f1b"}),
])
def test_generated_code_on_every_rank_matches_one_device(mesh, strategy, extra):
    step = _step()
    prog = partita.parallelize(step, mesh, strategy, **extra)
    res = partita.launch(prog, 2, _batches(2), check=True, timeout_s=60, executor="codegen")
    assert res.passed, [(c.step, c.worst, c.worst_output) for c in res.checks]
    again = partita.launch(prog, 2, _batches(2), timeout_s=60)
    np.testing.assert_allclose(res.losses(), again.losses(), rtol=1e-5)


def test_codegen_executor_is_checked():
    prog = partita.parallelize(_step(), "dp=2", "dp")
    with pytest.raises(LaunchError, match="executor"):
        partita.launch(prog, 2, _batches(1), executor="llvm")
