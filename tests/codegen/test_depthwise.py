"""partita's generated depthwise convolution (codegen/depthwise.py): against torch's conv2d with
groups = channels and the epilogue, over channel counts that fill whole vectors and leave a
remainder, 3 x 3 to 7 x 7 kernels, strides 1 and 2, with and without padding, dilation, odd
image sizes, channels-last and contiguous inputs, bias, residual (also written over in place)
and relu, silu or sigmoid, NaN and large values, 8 and 16 lanes, two threads; the reasons it
refuses a convolution; and a compiled program running its depthwise convolutions on the
kernel, which ``--emit kernels`` prints."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import partita
from partita.codegen import CompiledProgram
from partita.codegen import depthwise as D
from partita.codegen import library as lib

pytestmark = pytest.mark.skipif(not lib._generated_gemm(), reason="no generated code on this machine")

# (bias, residual, activation) variants, taken in turn across the grid
EPILOGUES = list(itertools.product((True, False), (False, True), D.ACTS))
ACT = {"none": lambda t: t, "relu": torch.relu, "silu": F.silu, "sigmoid": torch.sigmoid, "gelu": F.gelu}


def _cl(t):
    return t.contiguous(memory_format=torch.channels_last)


def _check(n, c, h, w, k, s, p, bias=True, other=False, act="none", channels_last=True, seed=0, into=None, d=1):
    """Run the kernel once and compare it with torch; returns the max relative error."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, h, w, generator=g)
    if channels_last:
        x = _cl(x)
    wt = torch.randn(c, 1, k, k, generator=g)
    b = torch.randn(c, generator=g) if bias else None
    assert D.supported(tuple(x.shape), tuple(wt.shape), [s, s], [p, p], [d, d], c) == ""
    ref = F.conv2d(x.double(), wt.double(), None if b is None else b.double(), stride=s, padding=p, dilation=d,
                   groups=c)
    o = _cl(torch.randn(ref.shape, generator=g)) if other else None
    if other:
        ref = ref + o.double()
    ref = ACT[act](ref)
    pd = D.PreparedDepthwise(tuple(x.shape), tuple(wt.shape), [s, s], [p, p], act, other, [d, d])
    out = o if into == "other" else (_cl(torch.empty(ref.shape)) if into == "out" else None)
    y = pd(x, pd.pack(wt), b, o, out)
    assert y.shape == ref.shape and y.is_contiguous(memory_format=torch.channels_last)
    if out is not None:
        assert y.data_ptr() == out.data_ptr()
    return float((y.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


@pytest.mark.parametrize("c", [8, 16, 24, 37, 64])
@pytest.mark.parametrize("k", [3, 5, 7])
@pytest.mark.parametrize("s", [1, 2])
def test_the_kernel_matches_torch_on_a_grid_of_shapes(c, k, s):
    i = c + 3 * k + s
    for j, p in enumerate((0, k // 2)):
        bias, other, act = EPILOGUES[(i + j) % len(EPILOGUES)]
        n = (1, 3)[(i + j) % 2]
        h, w = (k + 4 + 2 * (i % 3) + 1, k + 2 + 2 * (j % 2) + 1)   # odd sizes, not square
        err = _check(n, c, h, w, k, s, p, bias, other, act, channels_last=bool((i + j) % 3), seed=i + j)
        assert err <= 1e-5, (n, c, h, w, k, s, p, bias, other, act, err)


@pytest.mark.parametrize("bias,other,act", EPILOGUES)
def test_every_epilogue_matches_torch(bias, other, act):
    for cl in (True, False):
        assert _check(3, 37, 13, 11, 3, 1, 1, bias, other, act, channels_last=cl) <= 1e-5
        assert _check(1, 24, 9, 15, 5, 2, 2, bias, other, act, channels_last=cl) <= 1e-5


def test_results_go_into_the_buffer_given_and_over_the_residual_in_place():
    assert _check(2, 37, 11, 9, 3, 1, 1, other=True, act="relu", into="out") <= 1e-5
    assert _check(2, 37, 11, 9, 3, 1, 1, other=True, act="silu", into="other") <= 1e-5
    assert _check(1, 64, 7, 7, 7, 1, 3, other=True, into="other") <= 1e-5


def test_edge_shapes_match_torch():
    # one output pixel, a kernel as wide as the image (every column a border column), one
    # channel, rectangular images, 1 x 1
    for n, c, h, w, k, s, p in ((1, 16, 3, 3, 3, 1, 0), (2, 8, 5, 5, 7, 1, 3), (1, 1, 9, 7, 3, 2, 1),
                                (2, 17, 1, 13, 3, 1, 1), (1, 33, 6, 4, 1, 1, 0), (3, 5, 8, 8, 5, 2, 0)):
        assert _check(n, c, h, w, k, s, p, act="relu") <= 1e-5, (n, c, h, w, k, s, p)


def test_dilated_kernels_match_torch():
    # dilation 2 and 4 (a dilated MobileNet's), the padding as wide as the dilated kernel's
    # half or none, the image smaller than the dilated kernel (only some taps ever inside)
    for n, c, h, w, k, s, p, d in ((2, 24, 9, 11, 3, 1, 2, 2), (1, 37, 13, 13, 3, 2, 2, 2), (2, 16, 4, 4, 3, 1, 4, 4),
                                   (1, 48, 12, 10, 5, 1, 4, 2), (1, 8, 15, 15, 3, 1, 0, 3), (3, 17, 7, 9, 7, 1, 6, 2)):
        assert _check(n, c, h, w, k, s, p, act="relu", other=bool(s == 1), d=d) <= 1e-5, (n, c, h, w, k, s, p, d)


def test_eight_lanes_as_on_avx2(monkeypatch):
    monkeypatch.setattr(D, "vector_width", lambda: 8)
    for c, k, s, act in ((37, 3, 1, "relu"), (8, 5, 2, "silu"), (20, 7, 1, "sigmoid")):
        assert _check(2, c, 11, 9, k, s, k // 2, other=True, act=act) <= 1e-5, (c, k, s, act)


def test_two_threads_give_the_same_result():
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert _check(3, 24, 17, 17, 3, 2, 1, other=True, act="relu") <= 1e-5
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("act", D.ACTS)
def test_nan_stays_nan_and_large_values_stay_finite(act):
    x = _cl(torch.randn(1, 16, 5, 5) * 100)       # sums far into exp's over- and underflow
    x[0, 3, 2, 2] = float("nan")
    wt = torch.randn(16, 1, 3, 3)
    pd = D.PreparedDepthwise(tuple(x.shape), tuple(wt.shape), [1, 1], [1, 1], act)
    y = pd(x, pd.pack(wt))
    assert torch.isnan(y[0, 3, 1:4, 1:4]).all() and not torch.isnan(y[0, 2]).any()
    ref = ACT[act](F.conv2d(x.double(), wt.double(), padding=1, groups=16))
    ok = ~torch.isnan(ref)
    torch.testing.assert_close(y.double()[ok], ref[ok], rtol=1e-5, atol=1e-4)


def test_supported_says_why_not():
    ok = ((2, 16, 8, 8), (16, 1, 3, 3), [1, 1], [1, 1], [1, 1], 16)
    assert D.supported(*ok) == ""
    assert "depthwise" in D.supported((2, 16, 8, 8), (16, 4, 3, 3), [1, 1], [1, 1], [1, 1], 4)
    assert "depthwise" in D.supported((2, 16, 8, 8), (32, 1, 3, 3), [1, 1], [1, 1], [1, 1], 16)
    assert D.supported((2, 16, 8, 8), (16, 1, 3, 3), [1, 1], [2, 2], [2, 2], 16) == ""
    assert "dilation" in D.supported((2, 16, 8, 8), (16, 1, 3, 3), [1, 1], [1, 1], [0, 1], 16)
    assert "kernel" in D.supported((2, 16, 30, 30), (16, 1, 13, 13), [1, 1], [6, 6], [1, 1], 16)
    assert "padding" in D.supported((2, 16, 8, 8), (16, 1, 3, 3), [1, 1], [3, 3], [1, 1], 16)
    assert "empty" in D.supported((2, 16, 2, 2), (16, 1, 3, 3), [1, 1], [0, 0], [1, 1], 16)
    assert "border" in D.supported((1, 16, 40, 40), (16, 1, 11, 11), [1, 1], [10, 10], [1, 1], 16)


def test_column_blocks_cover_each_column_once():
    for w, k, s, p, dl in ((32, 3, 1, 1, 1), (31, 7, 2, 3, 1), (5, 7, 1, 3, 1), (9, 5, 2, 0, 1), (16, 3, 1, 4, 4)):
        d = D.depthwise_dims((1, 16, 8, w), (16, 1, k, k), [1, s], [0, p], [1, dl])
        for px in (1, 3, 8):
            cols = [ox + b * P + q for ox, P, reps in D.column_blocks(d, px) for b in range(reps) for q in range(P)]
            assert cols == list(range(d["wo"]))


class _Dw(nn.Module):
    """A MobileNet-like block: pointwise, depthwise 3 x 3 dilated 2 with relu, a depthwise
    7 x 7 whose result the block's input is added to (ConvNeXt's), depthwise 5 x 5 stride 2
    with SiLU (EfficientNet's)."""

    def __init__(self) -> None:
        super().__init__()
        self.pw = nn.Conv2d(3, 24, 1)
        self.dw3 = nn.Conv2d(24, 24, 3, padding=2, dilation=2, groups=24)
        self.dw7 = nn.Conv2d(24, 24, 7, padding=3, groups=24)
        self.dw5 = nn.Conv2d(24, 24, 5, stride=2, padding=2, groups=24)

    def forward(self, x):
        h = torch.relu(self.pw(x))
        h = torch.relu(self.dw3(h))
        h = self.dw7(h) + h
        return F.silu(self.dw5(h))


def _program():
    torch.manual_seed(0)
    m = _Dw().eval()
    x = torch.randn(2, 3, 13, 13)
    g = partita.optimize(partita.import_torch(m, (x,)), "canonicalize,cse,dce")
    with torch.inference_mode():
        want = m(x)
    return CompiledProgram(g), x, want


def test_a_compiled_program_runs_its_depthwise_convolutions_on_the_kernel(monkeypatch):
    monkeypatch.setenv("PARTITA_KERNEL_CHOICE", "off")
    prog, x, want = _program()
    dws = [n for n in prog.graph.nodes if n.op == "conv2d_pointwise" and n.attrs["groups"] > 1]
    assert len(dws) == 3 and all(lib.writes_into(n) for n in dws)
    assert any(n.attrs["binary"] == "add" for n in dws)
    assert {"relu", "silu"} <= {n.attrs["unary"] for n in dws}
    gens = [lib._generated_conv(n, n.attrs["binary"], n.attrs["unary"]) for n in dws]
    assert all(lib.conv_kernel_name(g) == "depthwise" for g in gens)
    before = lib.packed_weight_stats()["generated_conv_calls"]
    for i in range(4):          # the first call packs; then every convolution runs generated code
        torch.testing.assert_close(prog([x + i])[0], _eager(x + i), rtol=1e-4, atol=1e-5)
    assert lib.packed_weight_stats()["generated_conv_calls"] - before >= 2 * len(dws)
    torch.testing.assert_close(prog([x])[0], want, rtol=1e-4, atol=1e-5)


def _eager(x):
    torch.manual_seed(0)
    with torch.inference_mode():
        return _Dw().eval()(x)


def test_emit_kernels_prints_the_depthwise_kernels():
    from partita.codegen import emit_kernels

    prog, _, _ = _program()
    text = emit_kernels(prog.graph)
    assert text.count("; ---- convolution kernel pt_dwconv_") == 3 and "codegen/depthwise.py" in text
    assert "define void @pt_dwconv_" in text and "llvm.fma" in text
