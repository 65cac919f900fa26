"""squeeze-excitation as one step (codegen/se_block.py): the rewrite and the step against torch."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import partita
from partita.codegen import CompiledProgram


class SE(torch.nn.Module):
    def __init__(self, c: int, cr: int, act: str, gate: str) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(c, c, 3, padding=1)
        self.fc1 = torch.nn.Conv2d(c, cr, 1)
        self.fc2 = torch.nn.Conv2d(cr, c, 1)
        self.act = {"relu": torch.nn.ReLU(), "silu": torch.nn.SiLU()}[act]
        self.gate = {"sigmoid": torch.nn.Sigmoid(), "hardsigmoid": torch.nn.Hardsigmoid()}[gate]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        s = self.gate(self.fc2(self.act(self.fc1(y.mean((2, 3), keepdim=True)))))
        return y * s


@pytest.mark.parametrize("n,c,cr,hw,act,gate", [
    (1, 8, 2, 1, "relu", "sigmoid"), (3, 13, 5, 7, "relu", "hardsigmoid"), (2, 20, 6, 5, "silu", "sigmoid"),
    (4, 32, 8, 16, "relu", "hardsigmoid")])
def test_se_block_against_torch(n: int, c: int, cr: int, hw: int, act: str, gate: str) -> None:
    torch.manual_seed(0)
    m = SE(c, cr, act, gate).eval()
    x = torch.randn(n, c, hw, hw)
    g = partita.optimize(partita.import_torch(m, (x,)), "canonicalize")
    prog = CompiledProgram(g)
    ops = [nd.op for nd in prog.graph.nodes]
    assert ("se_block" in ops) == (hw > 1), ops   # a 1 x 1 map has no mean left to match
    want = m(x).detach().numpy()
    got = np.asarray(prog([x])[0])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    if hw == 1:
        return
    node = next(nd for nd in prog.graph.nodes if nd.op == "se_block")
    from partita.ops.registry import OPS
    args = [x.numpy()] + [np.asarray(prog.graph.weights[str(v.name)]) if str(v.name) in prog.graph.weights else None
                          for v in node.operands[1:]]
    if all(a is not None for a in args):
        ref = OPS["se_block"].reference([m.conv(x).detach().numpy()] + args[1:], node.attrs)
        np.testing.assert_allclose(ref, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("n,c,cr,hw,act,gate,cl", [
    (1, 13, 5, 1, "silu", "sigmoid", True), (3, 13, 5, 7, "relu", "hardsigmoid", False),
    (2, 24, 6, 5, "none", "sigmoid", True), (4, 32, 8, 16, "relu", "hardsigmoid", True)])
def test_generated_kernel_against_aten(n: int, c: int, cr: int, hw: int, act: str, gate: str, cl: bool) -> None:
    from partita.codegen.se_block import PreparedSE
    from partita.ops.registry import OPS

    torch.manual_seed(1)
    x = torch.randn(n, c, hw, hw)
    if cl:
        x = x.contiguous(memory_format=torch.channels_last)
    args = [x, torch.randn(cr, c, 1, 1), torch.randn(cr), torch.randn(c, cr, 1, 1), torch.randn(c)]
    attrs = {"act": act, "gate": gate}
    got = PreparedSE(tuple(x.shape), act, gate, cr)(args)
    want = OPS["se_block"].torch(args, attrs)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    ref = OPS["se_block"].reference([a.numpy() for a in args], attrs)
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-5, atol=1e-5)
