"""NCHW average pools as depthwise convolutions of ones divided by the window counts
(codegen/cnn_blocks.py, run first by assign-layout): the reference interpreter before and after
the rewrite, the compiled program against eager (a PoolFormer mixer: GroupNorm, pool minus its
input), and the pools it leaves alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import partita
from partita.codegen import CompiledProgram, cnn_blocks
from partita.codegen.layout import assign_layout


class _Mixer(nn.Module):
    """GroupNorm, then pool(x) - x (PoolFormer's token mixer), a 1 x 1 convolution, and a
    strided pool that counts the padding."""

    def __init__(self, include_pad: bool) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(1, 16)
        self.conv = nn.Conv2d(16, 16, 1)
        self.include_pad = include_pad

    def forward(self, x):
        h = self.norm(x)
        y = self.conv(F.avg_pool2d(h, 3, 1, 1, count_include_pad=self.include_pad) - h)
        return F.avg_pool2d(h * 2.0, 3, 2, 1, count_include_pad=self.include_pad) + y[:, :, ::2, ::2]


def _graph(include_pad: bool):
    torch.manual_seed(0)
    m = _Mixer(include_pad).eval()
    x = torch.randn(4, 16, 9, 9)
    g = partita.optimize(partita.import_torch(m, (x,)), "canonicalize,fold-batch-norm,fuse-library,cse,dce")
    with torch.inference_mode():
        want = m.double()(x.double()).float()
    return g, x, want


@pytest.mark.parametrize("include_pad", [False, True])
def test_the_rewrite_keeps_the_meaning(include_pad):
    g, x, want = _graph(include_pad)
    before = partita.run(g, [x.numpy()])[0]
    h = g.clone()
    assert cnn_blocks.pools_as_depthwise(h) == 2
    assert not any(n.op == "avg_pool2d" for n in h.nodes)
    after = partita.run(h, [x.numpy()])[0]
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(after, want.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("include_pad", [False, True])
def test_the_program_gives_eagers_results(include_pad):
    g, x, want = _graph(include_pad)
    prog = CompiledProgram(g)
    assert not any(n.op == "avg_pool2d" for n in prog.graph.nodes)
    for _ in range(3):
        torch.testing.assert_close(prog([x])[0], want, rtol=1e-4, atol=1e-5)


def test_window_counts_are_torchs_divisors():
    ones = torch.ones(1, 1, 7, 6)
    for k, s, p in (((3, 3), (1, 1), (1, 1)), ((3, 2), (2, 2), (1, 0)), ((2, 2), (2, 2), (0, 0))):
        for inc in (False, True):
            pooled = F.avg_pool2d(ones, k, s, p, count_include_pad=inc)
            sums = F.conv2d(ones, torch.ones(1, 1, *k), stride=s, padding=p)
            got = cnn_blocks.window_counts((7, 6), tuple(pooled.shape[2:]), k, s, p, inc)
            np.testing.assert_allclose(got, (sums / pooled)[0, 0].numpy(), rtol=1e-6)


class _ConvPool(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        return F.avg_pool2d(torch.relu(self.conv(x)), 2) + F.avg_pool2d(x, 2, 2, 0, ceil_mode=True)


def test_pools_of_channels_last_values_and_ceil_mode_stay():
    torch.manual_seed(0)
    m = _ConvPool().eval()
    x = torch.randn(2, 8, 8, 8)
    g = partita.optimize(partita.import_torch(m, (x,)), "canonicalize,fuse-library,cse,dce")
    assert cnn_blocks.pools_as_depthwise(g) == 0   # the conv's pool, and ceil_mode
    ref = partita.run(g, [x.numpy()])[0]
    assign_layout(g)
    np.testing.assert_allclose(partita.run(g, [x.numpy()])[0], ref, rtol=1e-5, atol=1e-6)
