"""Grouped convolutions on the generated direct kernel, as the dense convolution of a
block-diagonal weight (codegen/conv.py): the kernel against torch's grouped conv2d, and RegNet's
grouped block through the program with each kernel the measured choice can pick."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import partita
from partita.codegen import CompiledProgram, choose
from partita.codegen.conv import PreparedConv, block_diagonal, supported

CL = torch.channels_last


@pytest.fixture
def measuring(monkeypatch, tmp_path):
    """Measuring on, with a choice cache of this test's own."""
    monkeypatch.setenv("PARTITA_KERNEL_CHOICE", "measure")
    monkeypatch.setenv("PARTITA_CACHE_DIR", str(tmp_path / "cache"))
    choose.clear(disk=False)
    yield
    choose.clear(disk=False)


@pytest.mark.parametrize("xs,co,groups,stride,act,other", [
    ((4, 16, 16, 16), 16, 2, 2, "relu", False),
    ((4, 32, 8, 8), 32, 4, 2, "relu", False),
    ((2, 12, 7, 9), 24, 3, 1, "none", True),
    ((2, 8, 5, 5), 8, 4, 1, "silu", False),
])
def test_the_kernel_gives_torchs_grouped_convolution(xs, co, groups, stride, act, other) -> None:
    torch.manual_seed(0)
    x = torch.randn(xs).contiguous(memory_format=CL)
    w = torch.randn(co, xs[1] // groups, 3, 3)
    b = torch.randn(co)
    assert supported(xs, tuple(w.shape), [stride] * 2, [1, 1], [1, 1], groups, candidate=True) == ""
    assert supported(xs, tuple(w.shape), [stride] * 2, [1, 1], [1, 1], groups) != ""  # not the rules' pick
    conv = PreparedConv(xs, tuple(w.shape), [stride] * 2, [1, 1], act, other, groups=groups)
    want = F.conv2d(x.double(), w.double(), b.double(), stride, 1, 1, groups)
    res = torch.randn(want.shape).contiguous(memory_format=CL) if other else None
    if other:
        want = want + res.double()
    want = {"none": want, "relu": F.relu(want), "silu": F.silu(want)}[act].float()
    got = conv(x, conv.pack(w), b, res)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_block_diagonal_is_the_same_convolution() -> None:
    torch.manual_seed(0)
    x, w = torch.randn(2, 12, 6, 6), torch.randn(6, 4, 3, 3)
    dense = block_diagonal(w, 3)
    assert dense.shape == (6, 12, 3, 3)
    torch.testing.assert_close(F.conv2d(x, dense, padding=1), F.conv2d(x, w, padding=1, groups=3))


def test_wide_groups_are_left_to_the_library() -> None:
    assert "groups=8" in supported((4, 64, 8, 8), (64, 8, 3, 3), [1, 1], [1, 1], [1, 1], 8, candidate=True)
    assert supported((4, 128, 8, 8), (128, 32, 3, 3), [1, 1], [1, 1], [1, 1], 4, candidate=True) != ""


class _RegNetBlock(nn.Module):
    """RegNet's X block: 1 x 1, grouped 3 x 3 of stride 2, 1 x 1, with a strided shortcut."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(16, 32, 1)
        self.b = nn.Conv2d(32, 32, 3, 2, 1, groups=4)
        self.c = nn.Conv2d(32, 32, 1)
        self.short = nn.Conv2d(16, 32, 1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.c(torch.relu(self.b(torch.relu(self.a(x)))))
        return torch.relu(h + self.short(x))


@pytest.mark.parametrize("winner", ["generated", "onednn", "aten"])
def test_the_grouped_block_gives_eagers_results_with_each_kernel(measuring, monkeypatch, winner) -> None:
    def rigged(cands, clock=None, rounds=None):
        for fn in cands.values():                     # each candidate runs, on the real arguments
            fn()
        return {k: (1.0 if k == winner else 5.0) for k in cands}

    monkeypatch.setattr(choose, "measure", rigged)
    torch.manual_seed(0)
    m = _RegNetBlock().eval()
    x = torch.randn(4, 16, 16, 16)
    g = partita.optimize(partita.import_torch(m, (x,)), "canonicalize,fold-batch-norm,fuse-library,cse,dce")
    with torch.inference_mode():
        want = m(x)
    prog = CompiledProgram(g)
    for _ in range(4):                                # unpacked, packed and measured, then the pick
        torch.testing.assert_close(prog([x])[0], want, rtol=1e-4, atol=1e-5)
    grouped = [c for c in prog.kernel_choices() if "groups 4" in str(c)]
    assert len(grouped) == 1
    assert "generated" in grouped[0].micros and grouped[0].picked == winner
