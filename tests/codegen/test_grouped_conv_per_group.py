"""Grouped convolutions of wide groups as one generated direct kernel per group
(codegen/grouped_conv.py): the kernel against torch's grouped conv2d on odd shapes, and
HuBERT's positional convolution through the program with each kernel the measured choice picks;
a convolution's dropped last columns folded into its padding (codegen/trailing_slice.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import partita
from partita.codegen import CompiledProgram, choose
from partita.codegen.grouped_conv import PreparedGroupedConv, supported

CL = torch.channels_last


@pytest.fixture
def measuring(monkeypatch, tmp_path):
    """Measuring on, with a choice cache of this test's own."""
    monkeypatch.setenv("PARTITA_KERNEL_CHOICE", "measure")
    monkeypatch.setenv("PARTITA_CACHE_DIR", str(tmp_path / "cache"))
    choose.clear(disk=False)
    yield
    choose.clear(disk=False)


@pytest.mark.parametrize("xs,co,groups,kernel,stride,padding,act,end", [
    ((4, 64, 1, 31), 64, 4, (1, 8), 1, (0, 4), "none", None),      # HuBERT's positional convolution
    ((3, 48, 1, 29), 96, 3, (1, 5), 1, (0, 2), "gelu", None),
    ((2, 32, 7, 9), 48, 2, (3, 3), 2, (1, 1), "relu", None),
    ((1, 34, 5, 6), 17, 1, (3, 3), 1, (1, 1), "none", None),       # not grouped: refused
    ((2, 64, 1, 17), 32, 4, (1, 4), 1, (0, 2), "silu", [0, 1]),    # uneven padding
])
def test_per_group_kernel_gives_torchs_grouped_convolution(xs, co, groups, kernel, stride, padding, act, end) -> None:
    torch.manual_seed(0)
    ws = (co, xs[1] // groups, *kernel)
    why = supported(xs, ws, [stride] * 2, list(padding), [1, 1], groups)
    if groups == 1:
        assert "groups=1" in why
        return
    assert why == ""
    x = torch.randn(xs).contiguous(memory_format=CL)
    w, b = torch.randn(ws), torch.randn(co)
    conv = PreparedGroupedConv(xs, ws, [stride] * 2, list(padding), groups, act, end)
    xd = x.double()
    if end is not None:
        xd = F.pad(xd, (0, end[1], 0, end[0]))
        want = F.conv2d(F.pad(xd, (padding[1], 0, padding[0], 0)), w.double(), b.double(), stride, 0, 1, groups)
    else:
        want = F.conv2d(xd, w.double(), b.double(), stride, padding, 1, groups)
    want = {"none": want, "relu": F.relu(want), "silu": F.silu(want), "gelu": F.gelu(want)}[act].float()
    packed = conv.pack(w)
    out = torch.empty(want.shape).contiguous(memory_format=CL)
    for _ in range(2):                                 # the second call on the kept views
        torch.testing.assert_close(conv(x, packed, b, None, out), want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(conv(x.contiguous(), packed, b), want, rtol=1e-4, atol=1e-4)  # NCHW input, new result
    x2 = torch.randn(xs).contiguous(memory_format=CL)  # another input into the same buffers
    want2 = F.conv2d(x2.double() if end is None else F.pad(F.pad(x2.double(), (0, end[1], 0, end[0])),
                     (padding[1], 0, padding[0], 0)), w.double(), b.double(), stride,
                     padding if end is None else 0, 1, groups)
    want2 = {"none": want2, "relu": F.relu(want2), "silu": F.silu(want2), "gelu": F.gelu(want2)}[act].float()
    torch.testing.assert_close(conv(x2, packed, b, None, out), want2, rtol=1e-4, atol=1e-4)


def test_narrow_groups_and_residuals_are_left_to_the_block_diagonal_kernel() -> None:
    assert "under 16" in supported((4, 32, 8, 8), (32, 8, 3, 3), [2, 2], [1, 1], [1, 1], 4)
    assert "residual" in supported((4, 64, 1, 31), (64, 16, 1, 8), [1, 1], [0, 4], [1, 1], 4, other=True)
    assert "groups=64" in supported((4, 64, 8, 8), (64, 1, 3, 3), [1, 1], [1, 1], [1, 1], 64)


class _PositionalConv(nn.Module):
    """HuBERT's positional convolution: a grouped 1-D convolution, the last step dropped, GELU."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(64, 64, 8, padding=4, groups=4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.gelu(self.conv(x.transpose(1, 2))[:, :, :-1]).transpose(1, 2)


@pytest.mark.parametrize("winner", ["generated", "onednn", "aten"])
def test_the_positional_convolution_gives_eagers_results_with_each_kernel(measuring, monkeypatch, winner) -> None:
    def rigged(cands, clock=None, rounds=None):
        for fn in cands.values():                      # each candidate runs, on the real arguments
            fn()
        return {k: (1.0 if k == winner else 5.0) for k in cands}

    monkeypatch.setattr(choose, "measure", rigged)
    torch.manual_seed(0)
    m = _PositionalConv().eval()
    x = torch.randn(4, 31, 64)
    g = partita.optimize(partita.import_torch(m, (x,)), "canonicalize,fuse-library,cse,dce")
    with torch.inference_mode():
        want = m(x)
    prog = CompiledProgram(g)
    for _ in range(4):                                 # unpacked, packed and measured, then the pick
        torch.testing.assert_close(prog([x])[0], want, rtol=1e-4, atol=1e-5)
    grouped = [c for c in prog.kernel_choices() if "groups 4" in str(c)]
    assert len(grouped) == 1
    assert "generated" in grouped[0].micros and grouped[0].picked == winner


class _TrailingSlice(nn.Module):
    """A 2-d convolution whose last ``drop`` output columns are dropped, then an activation."""

    def __init__(self, padding: int, drop: int, act: str) -> None:
        super().__init__()
        self.conv = nn.Conv2d(6, 10, (3, 5), padding=(1, padding))
        self.drop, self.act = drop, act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)[..., :-self.drop]
        return {"relu": torch.relu, "gelu": F.gelu, "none": lambda t: t * 2.0}[self.act](y)


@pytest.mark.parametrize("padding,drop,act,folded", [(3, 2, "relu", True), (2, 2, "gelu", True),
                                                     (1, 2, "relu", False), (2, 1, "none", True)])
def test_a_trailing_slice_folds_into_the_padding_and_keeps_the_values(padding, drop, act, folded) -> None:
    from partita.backend.numpy_ref import run as ref_run

    torch.manual_seed(0)
    m = _TrailingSlice(padding, drop, act).eval()
    x = torch.randn(2, 6, 5, 11)
    imported = partita.import_torch(m, (x,))
    g = partita.optimize(imported, "canonicalize,fuse-library,cse,dce")
    ops = [n.op for n in g.nodes]
    assert ("slice" not in ops) == folded
    with torch.inference_mode():
        want = m(x)
    got_ref = ref_run(g, [x.numpy()], dict(g.weights))
    torch.testing.assert_close(torch.as_tensor(got_ref[0]), want, rtol=1e-4, atol=1e-5)
    prog = CompiledProgram(g)
    for _ in range(3):
        torch.testing.assert_close(prog([x])[0], want, rtol=1e-4, atol=1e-5)


def test_the_positional_convolution_takes_its_gelu_across_the_slice() -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 31, 64)
    g = partita.optimize(partita.import_torch(_PositionalConv().eval(), (x,)), "canonicalize,fuse-library,cse,dce")
    convs = [n for n in g.nodes if n.op == "conv2d_pointwise"]
    assert len(convs) == 1 and convs[0].attrs["unary"] == "gelu" and list(convs[0].attrs["padding_end"]) == [0, 3]
    assert not [n for n in g.nodes if n.op in ("slice", "gelu")]
