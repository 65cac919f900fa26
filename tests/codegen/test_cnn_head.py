"""A CNN's head: max pool after the stem, global average pool, flatten, classifier
(codegen/pool.py, cnn_blocks.global_pools_flattened): the flatten folded into the mean keeps the
meaning (reference interpreter before and after), the program runs no reshape step and equals
eager, from channels-last convolutions and from NCHW inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

import partita
from partita.codegen import CompiledProgram, cnn_blocks


class _Net(nn.Module):
    def __init__(self, c: int, ceil: bool) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, 2, 1)
        self.pool = nn.MaxPool2d(3, 2, 1, ceil_mode=ceil)
        self.conv = nn.Conv2d(c, c, 3, 1, 1)
        self.fc = nn.Linear(c, 10)

    def forward(self, x):
        h = self.pool(torch.relu(self.stem(x)))
        h = torch.relu(self.conv(h))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(h, 1), 1))


class _Bare(nn.Module):
    """Pools straight on the NCHW input (no convolution before them)."""

    def forward(self, x):
        return nn.functional.max_pool2d(x, 2, 2, ceil_mode=True).mean((2, 3), keepdim=True).flatten(1)


@pytest.mark.parametrize("c,size,ceil", [(16, 32, False), (13, 14, True), (7, 2, False)])
def test_head_program_equals_eager(c, size, ceil):
    torch.manual_seed(0)
    m = _Net(c, ceil).eval()
    x = torch.randn(4, 3, size, size)
    g = partita.optimize(partita.import_torch(m, (x,)), "canonicalize,fold-batch-norm,cse,dce")
    prog = CompiledProgram(g, freeze=True)
    ops = [n.op for n in prog.graph.nodes]
    assert "max_pool2d" in ops
    if size > 4:   # larger than 1 x 1 after the pools (a 1 x 1 map's mean is dropped: its flatten is a view)
        assert "reshape" not in ops and "mean" in ops
    with torch.inference_mode():
        want = m(x)
        for _ in range(2):
            torch.testing.assert_close(prog([x])[0], want, rtol=1e-4, atol=1e-5)


def test_pools_of_the_input():
    x = torch.randn(3, 5, 7, 7)
    g = partita.import_torch(_Bare().eval(), (x,))
    prog = CompiledProgram(g)
    torch.testing.assert_close(prog([x])[0], _Bare()(x))


def test_the_fold_keeps_the_meaning():
    torch.manual_seed(0)
    m = _Net(16, False).eval()
    x = torch.randn(2, 3, 16, 16)
    g = partita.optimize(partita.import_torch(m, (x,)), "canonicalize,cse,dce")
    before = partita.run(g, [x.numpy()])[0]
    h = g.clone()
    if not any(n.op == "mean" and n.attrs["keepdim"] for n in h.nodes):
        pytest.skip("the importer wrote no keepdim mean")
    assert cnn_blocks.global_pools_flattened(h) == 1
    assert not any(n.op == "reshape" for n in h.nodes)
    np.testing.assert_allclose(partita.run(h, [x.numpy()])[0], before, rtol=1e-6, atol=1e-6)


def test_a_mean_read_elsewhere_is_left():
    class Two(nn.Module):
        def forward(self, x):
            m = x.mean((2, 3), keepdim=True)
            return m.flatten(1), m * 2.0

    x = torch.randn(2, 4, 3, 3)
    g = partita.import_torch(Two().eval(), (x,))
    assert cnn_blocks.global_pools_flattened(g) == 0
    prog = CompiledProgram(g)
    a, b = prog([x])
    torch.testing.assert_close(a, x.mean((2, 3)))
    torch.testing.assert_close(b, x.mean((2, 3), keepdim=True) * 2.0)


def test_a_classifier_sized_linear_is_a_gemm_candidate(monkeypatch, tmp_path):
    """With measuring on, a [4, 64] x [64, 10] layer (below the measured band) is measured, the
    generated GEMM its default, and equals eager whichever runs; measuring off, it stays on ATen."""
    from partita.codegen import choose, library
    from partita.codegen.cnn_blocks import head_linear

    torch.manual_seed(0)
    fc = nn.Linear(64, 10).eval()
    x = torch.randn(4, 64)
    g = partita.optimize(partita.import_torch(fc, (x,)), "canonicalize,fuse-library")
    (node,) = [n for n in g.nodes if n.op == "linear_pointwise"]
    assert head_linear(node)
    assert library.LinearChoice(node, 4, 64, 10, "nk", True, "none").default == "generated"
    monkeypatch.setenv("PARTITA_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PARTITA_KERNEL_CHOICE", "measure")
    choose.clear(disk=False)
    prog = CompiledProgram(g, freeze=True)
    with torch.inference_mode():
        for _ in range(3):
            torch.testing.assert_close(prog([x])[0], fc(x))
    assert any(c.key.startswith("linear_pointwise m=4 k=64 n=10") for c in choose.choices())
    choose.clear(disk=False)
