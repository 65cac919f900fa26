"""The generated patch convolution (partita/codegen/patch_conv.py: stride = kernel, ConvNeXt's stem
and downsampling): the kernel against torch on odd shapes, from NCHW, channels-last and strided
inputs, with and without a bias; what it refuses; and a compiled program whose patch
convolutions run on it (the 4 x 4 and 2 x 2 ones that are no longer rewritten as GEMMs)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import partita
from partita.codegen import CompiledProgram
from partita.codegen import library as lib
from partita.codegen.patch_conv import PreparedPatchConv, patch_ir, supported

# (x, w): the zoo's stem and downsampling, odd channels and sizes, a rectangular window, one
# output channel, more output channels than 8 pixels x 2 vectors of accumulators hold
_CASES = [((4, 3, 32, 32), (16, 3, 4, 4)), ((4, 16, 8, 8), (32, 16, 2, 2)), ((3, 5, 12, 9), (7, 5, 4, 3)),
          ((1, 1, 2, 2), (1, 1, 2, 2)), ((2, 3, 8, 8), (24, 3, 2, 4)), ((1, 6, 6, 6), (96, 6, 3, 3)),
          ((5, 2, 4, 8), (3, 2, 1, 2))]


@pytest.mark.parametrize("xs,ws", _CASES)
@pytest.mark.parametrize("layout", ["nchw", "channels_last", "strided"])
def test_the_kernel_equals_torch(xs, ws, layout):
    g = torch.Generator().manual_seed(sum(xs) + sum(ws))
    x, w, b = torch.randn(xs, generator=g), torch.randn(ws, generator=g), torch.randn(ws[0], generator=g)
    stride = [ws[2], ws[3]]
    assert supported(xs, ws, stride, [0, 0], [1, 1], 1, None, "none", False) == ""
    xin = {"nchw": x, "channels_last": x.contiguous(memory_format=torch.channels_last),
           "strided": x.transpose(2, 3).contiguous().transpose(2, 3)}[layout]
    pc = PreparedPatchConv(xs, ws)
    packed = pc.pack(w)
    for bias in (b, None):
        y = pc(xin, packed, bias)
        assert y.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(y, F.conv2d(x, w, bias, stride=stride), rtol=1e-5, atol=1e-5)
    out = torch.empty(pc.shape, memory_format=torch.channels_last)
    assert pc(xin, packed, b, out=out) is out


def test_what_the_kernel_refuses():
    xs, ws = (2, 3, 8, 8), (4, 3, 2, 2)
    assert "stride" in supported(xs, ws, [1, 1], [0, 0], [1, 1], 1, None, "none", False)
    assert "stride" in supported(xs, ws, [2, 2], [1, 1], [1, 1], 1, None, "none", False)
    assert "groups" in supported(xs, (4, 1, 2, 2), [2, 2], [0, 0], [1, 1], 3, None, "none", False)
    assert "epilogue" in supported(xs, ws, [2, 2], [0, 0], [1, 1], 1, None, "relu", False)
    assert "tile" in supported((2, 3, 9, 8), ws, [2, 2], [0, 0], [1, 1], 1, None, "none", False)
    assert "taps" in supported((2, 3, 1, 8), (4, 3, 1, 1), [1, 1], [0, 0], [1, 1], 1, None, "none", False)
    assert "fmuladd" in patch_ir("k", {"n": 1, "c": 3, "h": 4, "w": 4, "o": 16, "kh": 2, "kw": 2}, False, 16)


class _Stem(torch.nn.Module):
    """ConvNeXt's stem and downsampling, with a layer norm over the channels between."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 4, stride=4)
        self.norm = torch.nn.LayerNorm(16)
        self.down = torch.nn.Conv2d(16, 24, 2, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        h = self.norm(h.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return self.down(h)


def test_a_compiled_program_runs_its_patch_convolutions_on_the_kernel(monkeypatch):
    monkeypatch.setenv("PARTITA_KERNEL_CHOICE", "off")
    torch.manual_seed(0)
    m = _Stem().eval()
    x = torch.randn(2, 3, 16, 24)
    g = partita.optimize(partita.import_torch(m, (x,)), "canonicalize,cse,dce")
    prog = CompiledProgram(g)
    convs = [n for n in prog.graph.nodes if n.op == "conv2d_pointwise"]
    assert len(convs) == 2 and "linear_pointwise" not in [n.op for n in prog.graph.nodes]
    gens = [lib._generated_conv(n, n.attrs["binary"], n.attrs["unary"]) for n in convs]
    assert all(lib.conv_kernel_name(gen) == "patch" for gen in gens)
    before = lib.packed_weight_stats()["generated_conv_calls"]
    with torch.inference_mode():
        for i in range(3):
            torch.testing.assert_close(prog([x + i])[0], m(x + i), rtol=1e-4, atol=1e-5)
    assert lib.packed_weight_stats()["generated_conv_calls"] - before >= 2 * len(convs)
