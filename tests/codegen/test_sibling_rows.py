"""Linear layers sharing an input of rank 3 or more read it as 2-d rows (codegen/sibling_rows.py):
after fuse-library the layers read one [rows, K] reshape, merge-linears then joins them into one
GEMM, and the compiled program matches eager; a lone layer and a graph-output layer are left as
they are."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import partita
from partita.codegen import CompiledProgram
from partita.codegen.sibling_rows import flatten_sibling_linears

PIPELINE = "canonicalize,fold-batch-norm,fuse-library,fuse-kernels,cse,dce"


class Three(nn.Module):
    """MobileViT's q, k, v layers on a [B, 1, C] input, one of them wider."""

    def __init__(self, c: int, n: int) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(c, n), nn.Linear(c, n), nn.Linear(c, 2 * n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.layer_norm(x, x.shape[-1:])
        return self.a(x) * self.b(x) + self.c(x)[..., ::2]


def _linears(g) -> list:
    return [n for n in g.nodes if n.op == "linear_pointwise"]


@pytest.mark.parametrize("shape", [(16, 1, 24), (3, 5, 7), (2, 3, 1, 12)])
def test_sibling_layers_read_rows_and_merge(shape):
    torch.manual_seed(0)
    c = shape[-1]
    model = Three(c, 6).eval()
    x = torch.randn(*shape)
    g = partita.optimize(partita.import_torch(model, (x,)), PIPELINE)
    layers = _linears(g)
    assert len(layers) == 3 and all(n.operands[0].type.rank == 2 for n in layers)
    assert len({n.operands[0] for n in layers}) == 1
    prog = CompiledProgram(g, freeze=True)
    steps = [s for s in prog.program.steps if s[-1].op == "linear_pointwise"]
    assert len(steps) == 1   # merge-linears joined them
    weights = {k: torch.from_numpy(v.copy()) for k, v in g.weights.items()}
    got = prog([x], weights)[0]
    with torch.no_grad():
        want = model(x)
    assert float((got - want).abs().max()) <= 1e-5 * max(1.0, float(want.abs().max()))


def test_a_lone_layer_and_an_output_are_left_alone():
    class Lone(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(8, 4), nn.Linear(8, 4)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple:
            return torch.relu(self.a(x)), self.b(y)

    g = partita.optimize(partita.import_torch(Lone().eval(), (torch.randn(2, 3, 8), torch.randn(2, 3, 8))), PIPELINE)
    assert flatten_sibling_linears(g) == 0
