"""The channels-last pad (partita/codegen/conv_pad.py): the generated copy against F.pad on odd
shapes, pads and values; which pads it takes; when its result buffer is kept across calls; and a
BiT-like stem (convolution -> pad -> max pool) through the import path against eager."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import partita
from partita.codegen import CompiledProgram
from partita.codegen.conv_pad import PreparedPad, pad_kernel, pads_hw, result_dies_in_call

CL = torch.channels_last
PIPELINE = "canonicalize,fold-batch-norm,fuse-library,fuse-kernels,cse,dce"


@pytest.mark.parametrize("shape,pads", [((4, 16, 16, 16), (1, 1, 1, 1)), ((2, 3, 5, 7), (0, 2, 3, 1)),
                                        ((1, 8, 4, 4), (2, 0, 0, 0)), ((2, 5, 3, 2), (1, 1, 0, 2)),
                                        ((1, 17, 1, 1), (3, 2, 1, 4)), ((3, 1, 6, 5), (0, 0, 0, 0))])
@pytest.mark.parametrize("value", [0.0, 1.5, -float("inf")])
@pytest.mark.parametrize("keep", [False, True])
def test_generated_pad_matches_f_pad(shape: tuple, pads: tuple, value: float, keep: bool) -> None:
    k = PreparedPad(shape, pads, value, keep=keep)
    for seed in range(2):   # a kept buffer is written whole again
        torch.manual_seed(seed)
        x = torch.randn(shape).contiguous(memory_format=CL)
        y = k(x)
        assert y.is_contiguous(memory_format=CL)
        assert torch.equal(y, F.pad(x, [pads[2], pads[3], pads[0], pads[1]], value=value))


class Stem(nn.Module):
    """BiT's stem: a 7 x 7 stride-2 convolution, a zero pad of one pixel, a 3 x 3 stride-2 max
    pool; ``expose`` returns the padded map as well (then it outlives the call)."""

    def __init__(self, c: int, expose: bool = False) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, c, 7, stride=2, padding=3, bias=False)
        self.expose = expose

    def forward(self, x: torch.Tensor):
        p = F.pad(self.conv(x), (1, 1, 1, 1))
        y = F.max_pool2d(p, 3, 2)
        return (y, p) if self.expose else y


def _pad_node(g):
    return next(n for n in g.nodes if n.op == "pad")


@pytest.mark.parametrize("c,hw", [(16, 32), (8, 21), (24, 15)])
def test_stem_through_the_import_path_matches_eager(c: int, hw: int, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bool] = []
    run = PreparedPad.__call__

    def counted(self: PreparedPad, x: torch.Tensor) -> torch.Tensor:
        calls.append(self.kept is not None)
        return run(self, x)

    monkeypatch.setattr(PreparedPad, "__call__", counted)
    torch.manual_seed(c + hw)
    m = Stem(c).eval()
    x = torch.randn(2, 3, hw, hw)
    with torch.no_grad():
        want = m(x)
    g = partita.optimize(partita.import_torch(m, (x,)), PIPELINE)
    node = _pad_node(g)
    assert pads_hw(node) == (1, 1, 1, 1) and result_dies_in_call(node)
    prog = CompiledProgram(g, freeze=True)
    for _ in range(3):
        torch.testing.assert_close(prog([x])[0], want, rtol=1e-5, atol=1e-5)
    assert calls and all(calls)   # the channels-last pad ran, into its kept buffer


def test_a_returned_pad_keeps_no_buffer_and_each_call_has_its_own_result() -> None:
    torch.manual_seed(0)
    m = Stem(16, expose=True).eval()
    x1, x2 = torch.randn(2, 3, 16, 16), torch.randn(2, 3, 16, 16)
    g = partita.optimize(partita.import_torch(m, (x1,)), PIPELINE)
    assert not result_dies_in_call(_pad_node(g))
    prog = CompiledProgram(g, freeze=True)
    prog([x1])
    first = prog([x1])[1]
    prog([x2])
    with torch.no_grad():
        torch.testing.assert_close(first, m(x1)[1], rtol=1e-5, atol=1e-5)


def test_pads_it_does_not_take_run_the_ops_own_step() -> None:
    x = torch.randn(2, 4, 5, 5)

    class ChannelPad(nn.Module):
        def forward(self, t: torch.Tensor) -> torch.Tensor:
            return F.pad(t, (0, 0, 0, 0, 1, 1)) * 2.0

    g = partita.optimize(partita.import_torch(ChannelPad(), (x,)), "canonicalize")
    node = _pad_node(g)
    assert pads_hw(node) is None and pad_kernel(node) is None
    g2 = partita.optimize(partita.import_torch(Stem(8), (x[:, :3],)), PIPELINE)
    step = pad_kernel(_pad_node(g2))
    assert step is not None
    y = torch.randn(2, 8, 3, 3)   # NCHW memory: the op's torch form
    out = step([y], dict(_pad_node(g2).attrs))
    assert torch.equal(out, F.pad(y, (1, 1, 1, 1)))


class PoolThenConv(nn.Module):
    """ResNet's stem: convolution, max pool (its result read by the next convolution only)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.next = nn.Conv2d(3, 16, 7, stride=2, padding=3), nn.Conv2d(16, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.next(F.max_pool2d(F.relu(self.stem(x)), 3, 2, 1))


def test_a_max_pool_read_by_a_convolution_keeps_its_buffer_and_stays_right(monkeypatch: pytest.MonkeyPatch) -> None:
    from partita.codegen.pool import PreparedMaxPool

    kept: list[bool] = []
    run = PreparedMaxPool.__call__

    def counted(self: PreparedMaxPool, x: torch.Tensor) -> torch.Tensor:
        kept.append(self.kept is not None)
        return run(self, x)

    monkeypatch.setattr(PreparedMaxPool, "__call__", counted)
    torch.manual_seed(1)
    m = PoolThenConv().eval()
    x = torch.randn(2, 3, 23, 23)
    g = partita.optimize(partita.import_torch(m, (x,)), PIPELINE)
    assert result_dies_in_call(next(n for n in g.nodes if n.op == "max_pool2d"))
    prog = CompiledProgram(g, freeze=True)
    for seed in range(3):
        xi = torch.randn(2, 3, 23, 23, generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            torch.testing.assert_close(prog([xi])[0], m(xi), rtol=1e-5, atol=1e-5)
    assert kept and all(kept)
