"""SiLU, sigmoid and GELU as epilogues of the generated direct convolution (codegen/conv.py;
GELU of the depthwise one too): a squeeze-excitation's two 1 x 1 convolutions on 1 x 1 maps, an
EfficientNet's expansion and a PoolFormer's MLP run there, checked against torch in float64 (the kernel alone, with and without a residual, NaN
kept) and through the import path (the reference interpreter before ``fuse-library`` against
the compiled program, every kernel the measured choice can pick)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import partita
from partita.codegen import CompiledProgram, choose, library
from partita.codegen import conv as K
from partita.codegen import depthwise as D

ACTS = {"silu": F.silu, "sigmoid": torch.sigmoid, "gelu": F.gelu}


@pytest.mark.parametrize("act", sorted(ACTS))
@pytest.mark.parametrize("shape", [((4, 8, 16, 16), (48, 8, 1, 1), (1, 1), (0, 0)),
                                   ((4, 2, 1, 1), (8, 2, 1, 1), (1, 1), (0, 0)),
                                   ((2, 5, 9, 7), (37, 5, 3, 3), (2, 1), (1, 1))])
@pytest.mark.parametrize("residual", [False, True])
def test_the_kernel_applies_silu_and_sigmoid(act, shape, residual):
    if not library._generated_gemm():
        pytest.skip("no generated code on this machine")
    xs, ws, stride, padding = shape
    g = torch.Generator().manual_seed(0)
    x = (4 * torch.randn(xs, generator=g)).contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(ws, generator=g), torch.randn(ws[0], generator=g)
    want = F.conv2d(x.double(), w.double(), b.double(), stride=stride, padding=padding)
    other = torch.randn(want.shape, generator=g).contiguous(memory_format=torch.channels_last) if residual else None
    if other is not None:
        want = want + other.double()
    want = ACTS[act](want)
    pc = K.PreparedConv(xs, ws, list(stride), list(padding), act, other=residual)
    got = pc(x, pc.pack(w), b, other)
    assert float((got.double() - want).abs().max()) < 2e-6 * max(1.0, float(want.abs().max()))


def test_the_depthwise_kernel_applies_gelu():
    if not library._generated_gemm():
        pytest.skip("no generated code on this machine")
    g = torch.Generator().manual_seed(0)
    xs, ws = (2, 24, 9, 9), (24, 1, 3, 3)
    x, w, b = 3 * torch.randn(xs, generator=g), torch.randn(ws, generator=g), torch.randn(24, generator=g)
    pd = D.PreparedDepthwise(xs, ws, [1, 1], [1, 1], "gelu")
    want = F.gelu(F.conv2d(x.double(), w.double(), b.double(), padding=1, groups=24))
    assert float((pd(x, pd.pack(w), b).double() - want).abs().max()) < 2e-6 * float(want.abs().max())


def test_gelu_along_the_line():
    """GELU of every value in [-12, 12] within 5e-7 of float64's (erf's two approximations and
    the switch between them at |v / sqrt(2)| = 0.5)."""
    if not library._generated_gemm():
        pytest.skip("no generated code on this machine")
    pc = K.PreparedConv((1, 8, 1, 1), (8, 8, 1, 1), [1, 1], [0, 0], "gelu")
    packed = pc.pack(torch.zeros(8, 8, 1, 1))
    v = torch.cat([torch.linspace(-12, 12, 4000), torch.tensor([0.5 * 2 ** 0.5, -0.5 * 2 ** 0.5] * 4)])
    got = torch.cat([pc(torch.zeros(1, 8, 1, 1), packed, v[i:i + 8]).flatten() for i in range(0, len(v), 8)])
    assert float((got.double() - F.gelu(v.double())).abs().max()) < 5e-7


@pytest.mark.parametrize("act", sorted(ACTS))
def test_nan_and_large_values(act):
    if not library._generated_gemm():
        pytest.skip("no generated code on this machine")
    b = torch.tensor([float("nan"), -200.0, 200.0, -3.0, 0.0, 87.0, -90.0, 1e-3])
    pc = K.PreparedConv((1, 8, 1, 1), (8, 8, 1, 1), [1, 1], [0, 0], act)
    got = pc(torch.zeros(1, 8, 1, 1), pc.pack(torch.zeros(8, 8, 1, 1)), b).flatten()
    torch.testing.assert_close(got.double(), ACTS[act](b.double()), rtol=1e-6, atol=1e-6, equal_nan=True)


def test_an_unknown_activation_is_refused_by_name():
    with pytest.raises(ValueError, match="no activation 'gelu_tanh'"):
        K.conv_ir("k", K.conv_configs(K.vector_width())[0], "gelu_tanh", {})


class _SqueezeExcite(nn.Module):
    """A 1 x 1 expansion with SiLU, then squeeze-excitation: global average pool, 1 x 1 with
    SiLU, 1 x 1 with sigmoid, the scale; a 1 x 1 projection; a PoolFormer's MLP (1 x 1 with
    GELU, 1 x 1) beside."""

    def __init__(self) -> None:
        super().__init__()
        self.expand = nn.Conv2d(8, 48, 1)
        self.reduce = nn.Conv2d(48, 4, 1)
        self.excite = nn.Conv2d(4, 48, 1)
        self.project = nn.Conv2d(48, 16, 1)
        self.fc1 = nn.Conv2d(16, 32, 1)
        self.fc2 = nn.Conv2d(32, 16, 1)

    def forward(self, x):
        h = F.silu(self.expand(x))
        s = F.adaptive_avg_pool2d(h, 1)
        s = torch.sigmoid(self.excite(F.silu(self.reduce(s))))
        y = self.project(h * s)
        return y + self.fc2(F.gelu(self.fc1(y)))


@pytest.fixture
def measuring(monkeypatch, tmp_path):
    """Measuring on, with a choice cache of this test's own."""
    monkeypatch.setenv("PARTITA_KERNEL_CHOICE", "measure")
    monkeypatch.setenv("PARTITA_CACHE_DIR", str(tmp_path / "cache"))
    choose.clear(disk=False)
    yield
    choose.clear(disk=False)


@pytest.mark.parametrize("winner", ["generated", "onednn", "aten"])
def test_squeeze_excitation_through_the_import_path(measuring, monkeypatch, winner):
    if not library._generated_gemm():
        pytest.skip("no generated code on this machine")

    def rigged(cands, clock=None, rounds=None):
        for fn in cands.values():
            fn()
        return {k: (1.0 if k == winner else 5.0) for k in cands}

    monkeypatch.setattr(choose, "measure", rigged)
    torch.manual_seed(0)
    m = _SqueezeExcite().eval()
    x = torch.randn(4, 8, 8, 8)
    g = partita.optimize(partita.import_torch(m, (x,)), "canonicalize,cse,dce")
    ref = partita.run(g, [x.numpy()])[0]
    fused = partita.optimize(g, "fold-batch-norm,fuse-library,fuse-kernels,cse,dce")
    acts = {n.attrs.get("unary") for n in fused.nodes if n.op == "conv2d_pointwise"}
    assert {"silu", "sigmoid", "gelu"} <= acts
    prog = CompiledProgram(fused)
    with torch.inference_mode():
        want = m.double()(x.double()).float()
    torch.testing.assert_close(torch.from_numpy(ref), want, rtol=1e-4, atol=1e-5)
    for _ in range(4):
        torch.testing.assert_close(prog([x])[0], want, rtol=1e-4, atol=1e-5)
    made = prog.kernel_choices()
    assert made and all("generated" in c.micros for c in made)
    assert all(c.picked == winner for c in made)
    before = library.packed_weight_stats()["generated_conv_calls"]   # measured: the choices run
    torch.testing.assert_close(prog([x])[0], want, rtol=1e-4, atol=1e-5)
    ran = library.packed_weight_stats()["generated_conv_calls"] - before
    assert (ran > 0) == (winner == "generated")
