"""The torch.compile backend's program is the import path's program: a small transformer block
(embedding, fused QKV, causal attention, residual norms, GELU MLP, head) and a small CNN
(convolutions with batch norms, a depthwise one, a residual, a mean and a head) compile to the
same steps, op by op, through ``torch.compile(backend="partita")`` as through ``import_torch``
with the zoo's import pipeline and ``CompiledProgram(freeze=True)``; both equal eager.

What the backend costs beyond the import path on the zoo is dynamo's frame around the same
program (docs/codegen.md, "Backend program against the import path's (2026-12-07 late)"); a
step that one path makes and the other does not is what this guards against."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import partita
import partita.codegen.dynamo as pd
from partita.codegen import CompiledProgram

# bench/bench_zoo.py's IMPORT_PIPELINE: the import path the zoo measures
IMPORT_PIPELINE = "canonicalize,fold-batch-norm,fuse-library,fuse-kernels,cse,dce"


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    pd.reset_stats()
    yield
    torch._dynamo.reset()


class _Block(torch.nn.Module):
    """An encoder-decoder style block: embedding, one QKV projection split into heads, causal
    attention, the output projection and a residual LayerNorm, a GELU MLP and its residual
    LayerNorm, a linear head."""

    def __init__(self, d: int = 32, heads: int = 4, vocab: int = 50) -> None:
        super().__init__()
        self.heads = heads
        self.emb = torch.nn.Embedding(vocab, d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.out = torch.nn.Linear(d, d)
        self.n1, self.n2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.up, self.down = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)
        self.head = torch.nn.Linear(d, 10)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in self.qkv(x).split(d, -1))
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = self.n1(x + self.out(a.transpose(1, 2).reshape(b, t, d)))
        x = self.n2(x + self.down(torch.nn.functional.gelu(self.up(x))))
        return self.head(x)


class _Cnn(torch.nn.Module):
    """A convolution with batch norm and ReLU, a depthwise one with batch norm, a residual add
    and ReLU, a global mean and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.b1 = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8)
        self.c2, self.b2 = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8), torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.b1(self.c1(x)))
        y = torch.relu(self.b2(self.c2(y)) + y)
        return self.fc(y.mean((2, 3)))


def _steps(program: CompiledProgram) -> list[str]:
    """The ops of a program's graph that run at every call (constants left out)."""
    return [n.op for n in program.graph.nodes if n.op != "constant"]


def _import_path(model: torch.nn.Module, x: torch.Tensor) -> tuple[CompiledProgram, Any]:
    """The import path's frozen program of ``model`` and its result on ``x``."""
    g = partita.optimize(partita.import_torch(model, (x,)), IMPORT_PIPELINE)
    prog = CompiledProgram(g, freeze=True)
    weights = {k: torch.from_numpy(np.array(v, copy=True)) for k, v in g.weights.items()}
    return prog, prog([x], weights)[0]


def _randomize_norms(model: torch.nn.Module) -> None:
    """Batch norms with statistics and affine params away from their defaults."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)


@pytest.mark.parametrize("make, example", [
    (_Block, lambda: torch.randint(0, 50, (2, 7))),
    (_Cnn, lambda: torch.randn(2, 3, 9, 11)),      # odd spatial sizes
], ids=["transformer-block", "cnn"])
def test_backend_program_has_the_import_paths_steps(make: Any, example: Any) -> None:
    torch.manual_seed(0)
    model = make().eval()
    _randomize_norms(model)
    x = example()
    with torch.no_grad():
        want = model(x)
    compiled = torch.compile(model, backend="partita", options={"choose": "partita"})
    with torch.inference_mode():
        for _ in range(2):     # the frozen program is built at the first call
            got = compiled(x)
    (rec,) = pd.stats().graphs
    assert rec.fallback is None and rec.program is not None and rec.choice is not None and rec.choice.frozen
    prog, by_import = _import_path(model, x)
    assert _steps(rec.program) == _steps(prog)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(torch.as_tensor(np.asarray(by_import)), want, rtol=1e-4, atol=1e-5)
