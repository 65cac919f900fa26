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


class SEBetween(torch.nn.Module):
    """A squeeze-excitation between two 1 x 1 convolutions (regnet's y block) after a stem and
    before a head (the stem converts the NCHW input, the head's result is the caller's: neither
    is chained): in the arena its step writes its planned buffer, and with the two convolutions
    it runs in one step chain."""

    def __init__(self, c: int, cr: int) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(c, c, 3, padding=1)
        self.conv1 = torch.nn.Conv2d(c, c, 1)
        self.fc1 = torch.nn.Conv2d(c, cr, 1)
        self.fc2 = torch.nn.Conv2d(cr, c, 1)
        self.conv2 = torch.nn.Conv2d(c, c, 1)
        self.head = torch.nn.Conv2d(c, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv1(torch.relu(self.stem(x))))
        s = torch.sigmoid(self.fc2(torch.relu(self.fc1(y.mean((2, 3), keepdim=True)))))
        return self.head(torch.relu(self.conv2(y * s)))


def test_se_block_in_a_step_chain(monkeypatch, tmp_path) -> None:
    from partita.codegen import choose
    from partita.codegen.step_chain import ChainStep

    monkeypatch.setenv("PARTITA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PARTITA_KERNEL_CHOICE", "off")   # the rules' kernels: the generated ones
    choose.clear(disk=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(3)
        m = SEBetween(16, 4).eval()
        x = torch.randn(4, 16, 8, 8)
        g = partita.optimize(partita.import_torch(m, (x,)), "canonicalize,fuse-library,fuse-kernels,cse,dce")
        prog = CompiledProgram(g)
        weights = {k: torch.from_numpy(np.array(v, copy=True)) for k, v in g.weights.items()}
        assert "se_block" in [nd.op for nd in prog.graph.nodes]

        def want(x: torch.Tensor) -> torch.Tensor:
            ref = SEBetween(16, 4).eval()
            ref.load_state_dict(weights)
            with torch.inference_mode():
                return ref.double()(x.double()).float()

        with torch.inference_mode():
            for _ in range(6):
                torch.testing.assert_close(prog([x], weights)[0], want(x), rtol=1e-4, atol=1e-5)
        chains = [st[0] for st in prog.program.steps if type(st[0]) is ChainStep]
        members = [mb.node.op for c in chains for mb in c.members]
        assert members == ["conv2d_pointwise", "se_block", "conv2d_pointwise"], members
        native = sum(c.native_calls for c in chains)
        with torch.inference_mode():
            for _ in range(2):
                x2 = torch.randn(4, 16, 8, 8)
                torch.testing.assert_close(prog([x2], weights)[0], want(x2), rtol=1e-4, atol=1e-5)
        assert sum(c.native_calls for c in chains) > native
        # the squeeze-excitation's weights changed in place, then swapped for others under the
        # same tensor objects: the kernel reads what they hold now
        k = next(k for k in weights if k.startswith("fc2") and k.endswith("weight"))
        weights[k].mul_(-2.0)
        with torch.inference_mode():
            torch.testing.assert_close(prog([x], weights)[0], want(x), rtol=1e-4, atol=1e-5)
        k1 = next(k for k in weights if k.startswith("fc1") and k.endswith("weight"))
        weights[k1].data = weights[k1].clone() * 3.0
        with torch.inference_mode():
            for _ in range(3):
                torch.testing.assert_close(prog([x], weights)[0], want(x), rtol=1e-4, atol=1e-5)
    finally:
        torch.set_num_threads(threads)
        choose.clear(disk=False)
