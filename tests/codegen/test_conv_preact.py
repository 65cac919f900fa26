"""The pre-activation GroupNorm on channels-last memory (partita/codegen/conv_preact.py): the NHWC
kernel against torch.nn.functional.group_norm on odd shapes, the step's choice of kernel by the
input's memory, and a pre-activation block (BiT's: GroupNorm -> ReLU -> convolution) through the
import path against eager, with the norm's result handed on in channels-last memory."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import partita
from partita.codegen import CompiledProgram
from partita.codegen.conv_preact import NhwcGroupNorm, nhwc_for, preact_group_norm_kernel, takes_channels_last
from partita.ir.dtypes import f32
from partita.ir.graph import Graph, Node
from partita.ir.types import TensorType
from partita.ops.registry import OPS

CL = torch.channels_last
# (n, c, h, w, groups): groups 1, 2, C / 8 and C; H x W of 1, 7 x 9, 5 x 3; C up to MAX_CHANNELS
SHAPES = [(2, 8, 7, 9, 2), (1, 24, 5, 3, 1), (3, 64, 4, 4, 32), (2, 16, 1, 1, 4), (1, 8, 3, 5, 8),
          (2, 256, 3, 3, 8), (4, 32, 8, 8, 8)]


def _want(x: torch.Tensor, g: int, w, b, relu: bool) -> torch.Tensor:
    y = F.group_norm(x.contiguous(), g, w, b, 1e-5)
    return y.relu() if relu else y


@pytest.mark.parametrize("n,c,h,w,g", SHAPES)
@pytest.mark.parametrize("affine", [False, True])
@pytest.mark.parametrize("relu", [False, True])
def test_nhwc_kernel_matches_torch_and_writes_channels_last(n: int, c: int, h: int, w: int, g: int,
                                                            affine: bool, relu: bool) -> None:
    torch.manual_seed(n * 1000 + c + g)
    x = (torch.randn(n, c, h, w) * 3 + 1).contiguous(memory_format=CL)
    wt, bt = (torch.randn(c), torch.randn(c)) if affine else (None, None)
    k = NhwcGroupNorm((n, c, h, w), g, 1e-5, affine, relu)
    y = k(x, wt, bt) if affine else k(x)
    assert y.is_contiguous(memory_format=CL)
    torch.testing.assert_close(y, _want(x, g, wt, bt, relu), rtol=1e-5, atol=2e-5)
    if affine:   # the [1, C, 1, 1] params freezing folds them into
        y4 = k(x, wt.reshape(1, c, 1, 1), bt.reshape(1, c, 1, 1))
        torch.testing.assert_close(y4, y, rtol=0, atol=0)


def test_nan_and_infinity_propagate_as_the_reference() -> None:
    x = torch.randn(2, 8, 3, 3)
    x[0, 1, 1, 1] = float("nan")
    x[1, 5, 0, 2] = float("inf")
    xl = x.contiguous(memory_format=CL)
    y = NhwcGroupNorm((2, 8, 3, 3), 2, 1e-5, False, True)(xl)
    want = _want(x, 2, None, None, True)
    torch.testing.assert_close(y, want, rtol=1e-5, atol=2e-5, equal_nan=True)
    assert torch.isnan(y[0, :4]).all() and torch.isnan(y[1, 4:]).all()


def _node(shape: tuple, groups: int, unary: str, affine: bool) -> tuple[Node, dict]:
    attrs = OPS["group_norm"].normalize_attrs({"groups": groups, "eps": 1e-5, "unary": unary})
    xt = TensorType(shape, f32)
    gr = Graph("g")
    ops = [gr.add_input("x", xt)] + ([gr.add_input(k, TensorType((shape[1],), f32)) for k in "wb"] if affine else [])
    return Node("group_norm", ops, attrs, [xt]), attrs


@pytest.mark.parametrize("shape,unary,taken", [((2, 8, 4, 4), "relu", True), ((2, 12, 4, 4), "relu", False),
                                               ((2, 8, 4, 4), "silu", False), ((2, 8, 4), "none", False),
                                               ((1, 512, 2, 2), "none", False)])
def test_nhwc_kernel_takes_what_it_says(shape: tuple, unary: str, taken: bool) -> None:
    node, _ = _node(shape, 4 if shape[1] % 4 == 0 else 2, unary, True)
    assert (nhwc_for(node) is not None) == taken


@pytest.mark.parametrize("unary", ["relu", "silu"])
def test_step_runs_nhwc_on_channels_last_and_group_norms_step_on_nchw(unary: str) -> None:
    torch.manual_seed(0)
    shape = (2, 16, 5, 6)
    node, attrs = _node(shape, 4, unary, True)
    step = preact_group_norm_kernel(node)
    assert step is not None
    x, w, b = torch.randn(shape), torch.randn(16), torch.randn(16)
    act = torch.relu if unary == "relu" else F.silu
    want = act(F.group_norm(x, 4, w, b, 1e-5))
    xl = x.contiguous(memory_format=CL)
    assert takes_channels_last(xl) and not takes_channels_last(x)
    y_nchw, y_cl = step([x, w, b], attrs), step([xl, w, b], attrs)
    torch.testing.assert_close(y_nchw, want, rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(y_cl, want, rtol=1e-5, atol=2e-5)
    assert y_nchw.is_contiguous()
    # ReLU (measuring off in the tests: the default, the NHWC kernel) keeps channels-last memory
    assert y_cl.is_contiguous(memory_format=CL) == (unary == "relu")


class PreactBlock(nn.Module):
    """A pre-activation bottleneck: GroupNorm -> ReLU -> conv, three times, and the shortcut."""

    def __init__(self, c: int, mid: int, groups: int) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1, bias=False)
        self.n1, self.n2, self.n3 = nn.GroupNorm(groups, c), nn.GroupNorm(groups, mid), nn.GroupNorm(groups, mid)
        self.c1, self.c2 = nn.Conv2d(c, mid, 1, bias=False), nn.Conv2d(mid, mid, 3, padding=1, bias=False)
        self.c3, self.short = nn.Conv2d(mid, 2 * c, 1, bias=False), nn.Conv2d(c, 2 * c, 1, bias=False)
        self.head = nn.GroupNorm(groups, 2 * c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        p = F.relu(self.n1(x))
        y = self.c3(F.relu(self.n3(self.c2(F.relu(self.n2(self.c1(p)))))))
        y = y + self.short(p)
        return F.relu(self.head(y)).mean(dim=(2, 3))


@pytest.mark.parametrize("c,mid,groups,hw", [(16, 8, 8, 8), (24, 16, 4, 7), (16, 12, 4, 5)])
def test_preact_block_through_the_import_path_matches_eager(c: int, mid: int, groups: int, hw: int,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bool] = []
    run = NhwcGroupNorm.__call__

    def counted(self: NhwcGroupNorm, *args: torch.Tensor) -> torch.Tensor:
        calls.append(True)
        return run(self, *args)

    monkeypatch.setattr(NhwcGroupNorm, "__call__", counted)
    torch.manual_seed(c + mid + hw)
    m = PreactBlock(c, mid, groups).eval()
    for p in m.parameters():   # non-trivial affine params
        if p.dim() == 1:
            p.data.normal_()
    x = torch.randn(2, 3, hw, hw)
    with torch.no_grad():
        want = m(x)
    g = partita.optimize(partita.import_torch(m, (x,)), "canonicalize,fold-batch-norm,fuse-library,fuse-kernels,cse,dce")
    assert sum(n.op == "group_norm" for n in g.nodes) == 4
    prog = CompiledProgram(g, freeze=True)
    for _ in range(3):   # the first call runs unpacked kernels, the later ones packed
        calls.clear()
        torch.testing.assert_close(prog([x])[0], want, rtol=1e-4, atol=1e-4)
    # each norm whose channels the kernel takes read a convolution's channels-last result
    assert len(calls) == sum(ch % 8 == 0 for ch in (c, mid, mid, 2 * c))
