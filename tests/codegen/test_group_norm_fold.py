"""BiT's weight standardization under freezing (partita/codegen/inference.py, fold-params): after
fuse-kernels the standardization's first kernel has two results of the weight's size (the
centred weight and its square); that is no growth, so it folds like the rest."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import partita
from partita.codegen import CompiledProgram


class _StdStem(nn.Module):
    """A weight-standardized 7 x 7 stem as transformers' BiT writes it (batch_norm in training
    mode over the flattened weight), 16 x 3 x 7 x 7 = 2,352 weights."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(16, 3, 7, 7))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = F.batch_norm(self.weight.reshape(1, 16, -1), None, None, training=True, momentum=0.0,
                         eps=1e-8).reshape_as(self.weight)
        return F.conv2d(x, w, stride=2, padding=3)


def test_standardization_with_two_weight_sized_kernel_results_folds_under_freeze() -> None:
    torch.manual_seed(0)
    m = _StdStem().eval()
    x = torch.randn(2, 3, 20, 20)
    g = partita.optimize(partita.import_torch(m, (x,)), "canonicalize,fuse-library,fuse-kernels,cse,dce")
    assert any(n.op == "fused" and len(n.results) == 2 for n in g.nodes)   # the case of the fix
    prog = CompiledProgram(g, freeze=True)
    left = [n.op for n in prog.graph.nodes if n.op not in ("conv2d_pointwise",)]
    assert left == [], left
    with torch.no_grad():
        want = m(x)
    weights = {k: torch.from_numpy(np.array(v, copy=True)) for k, v in g.weights.items()}
    for _ in range(2):
        torch.testing.assert_close(prog([x], weights)[0], want, rtol=1e-4, atol=1e-4)
