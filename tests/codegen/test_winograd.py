"""partita's generated Winograd convolution F(2x2, 3x3) (codegen/winograd.py): against the
formula in float64 on edge shapes (one output pixel, odd sizes that leave half tiles, paddings
0 to 2, channels left over by the register tile, several blocks with a partial last one), both
tiles of each vector width, every epilogue, NaN, a given result buffer and the residual's buffer
written over, two threads, what it does not take, and the executor choosing it for the 3 x 3
convolutions of a CNN (and the direct kernel when it is turned off) with equal results."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from partita.codegen import cpu
from partita.codegen import library as lib
from partita.codegen import winograd as W
from partita.codegen.gemm import GemmConfig
from partita.codegen.lowering import vector_width


def _cl(t):
    return t.contiguous(memory_format=torch.channels_last)


def _ref(x, wt, b, pad, other, act):
    ref = F.conv2d(x.double(), wt.double(), None if b is None else b.double(), padding=pad)
    if other is not None:
        ref = ref + other.double()
    return torch.relu(ref) if act == "relu" else ref


def _run(n, c, co, h, w, pad, act="none", bias=True, other=False, cfg=None, tb=None, seed=0, out=None):
    g = torch.Generator().manual_seed(seed)
    x = _cl(torch.randn(n, c, h, w, generator=g))
    wt = torch.randn(co, c, 3, 3, generator=g) / (9 * c) ** 0.5
    b = torch.randn(co, generator=g) if bias else None
    pw = W.PreparedWinograd(tuple(x.shape), tuple(wt.shape), [pad, pad] if isinstance(pad, int) else list(pad),
                            act, other, cfg=cfg, tb=tb)
    pads = [pad, pad] if isinstance(pad, int) else list(pad)
    shape = (n, co, h + 2 * pads[0] - 2, w + 2 * pads[1] - 2)
    o = _cl(torch.randn(shape, generator=g)) if other else None
    want = _ref(x, wt, b, pads, o, act)
    y = pw(x, pw.pack(wt), b, o, out)
    assert y.shape == want.shape and y.is_contiguous(memory_format=torch.channels_last)
    err = float((y.double() - want).abs().max())
    assert err <= 1e-5 * max(1.0, float(want.abs().max())), err
    return y


def _tiles(lanes):
    """The two register tiles of the convolution for ``lanes`` (conv.conv_configs')."""
    from partita.codegen.conv import conv_configs

    return conv_configs(lanes)


LANES = [8, 16] if vector_width() >= 16 else [8]

SHAPES = [
    # n, c, co, h, w, padding
    (1, 16, 16, 3, 3, 0),           # one output pixel, half a tile
    (1, 16, 16, 1, 1, 1),           # one pixel in, one out: every tap but the middle in the padding
    (2, 16, 16, 4, 4, 1),
    (3, 16, 40, 5, 7, 1),           # odd sizes: the last tile row and column half outside
    (2, 32, 17, 6, 9, 2),           # padding 2; output channels left over in a masked vector
    (1, 48, 70, 8, 8, (0, 2)),      # a second panel; paddings differ per direction
    (2, 16, 64, 2, 11, (1, 0)),
]


@pytest.mark.parametrize("shape", SHAPES, ids=[str(s) for s in SHAPES])
@pytest.mark.parametrize("lanes", LANES)
@pytest.mark.parametrize("tile", [0, 1])
def test_the_formula_on_edge_shapes(shape, lanes, tile):
    cfg = _tiles(lanes)[tile]
    n, c, co, h, w, pad = shape
    _run(n, c, co, h, w, pad, "relu", cfg=cfg)


@pytest.mark.parametrize("tb_tiles", [1, 2, 3])
def test_blocks_of_any_size_and_a_partial_last_block(tb_tiles):
    cfg = _tiles(vector_width())[1]
    # 2 x 5 x 6 tiles = 60: blocks of MR, 2 MR, 3 MR tiles, the last one partial
    _run(2, 16, 32, 10, 11, 1, "relu", cfg=cfg, tb=tb_tiles * cfg.mr)


@pytest.mark.parametrize("act,bias,other", [("relu", True, False), ("none", False, True), ("relu", True, True),
                                            ("none", True, False), ("relu", False, False)])
def test_each_epilogue(act, bias, other):
    _run(2, 32, 32, 9, 6, 1, act, bias, other)


def test_the_default_plan_on_the_cnn_shapes():
    for n, c, h in ((8, 32, 64), (2, 64, 32), (2, 128, 16)):
        pw = W.PreparedWinograd((n, c, h, h), (c, c, 3, 3), [1, 1], "relu")
        assert pw.tb % pw.cfg.mr == 0 and pw.tb >= pw.cfg.mr
        _run(n, c, c, h, h, 1, "relu", other=True)


def test_nan_stays_nan_through_relu_and_input_in_nchw_is_taken():
    x = torch.randn(1, 16, 6, 6)           # NCHW: converted
    x[0, 3, 2, 2] = float("nan")
    wt = torch.randn(16, 16, 3, 3)
    pw = W.PreparedWinograd((1, 16, 6, 6), (16, 16, 3, 3), [1, 1], "relu")
    y = pw(x, pw.pack(wt))
    want = torch.relu(F.conv2d(x, wt, padding=1))
    assert torch.equal(torch.isnan(y), torch.isnan(want)) and bool(torch.isnan(y).any())
    ok = ~torch.isnan(want)
    assert torch.allclose(y[ok], want[ok], atol=1e-4, rtol=1e-4)


def test_the_result_goes_where_it_is_asked_even_over_the_residual():
    g = torch.Generator().manual_seed(1)
    x = _cl(torch.randn(2, 16, 7, 7, generator=g))
    wt = torch.randn(32, 16, 3, 3, generator=g)
    b = torch.randn(32, generator=g)
    o = _cl(torch.randn(2, 32, 7, 7, generator=g))
    want = _ref(x, wt, b, [1, 1], o, "relu")
    pw = W.PreparedWinograd(tuple(x.shape), tuple(wt.shape), [1, 1], "relu", True, cfg=_tiles(vector_width())[1],
                            tb=_tiles(vector_width())[1].mr)     # many blocks
    y = pw(x, pw.pack(wt), b, o, o)        # the result over its residual, as the memory plan does
    assert y.data_ptr() == o.data_ptr()
    assert float((y.double() - want).abs().max()) <= 1e-5 * float(want.abs().max())


def test_two_threads_agree_with_one_on_the_team_and_on_the_pool(monkeypatch):
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _run(2, 32, 32, 12, 12, 1, "relu", tb=8)
        torch.set_num_threads(2)
        two = _run(2, 32, 32, 12, 12, 1, "relu", tb=8)
        monkeypatch.setattr(cpu, "_SPLIT", False)    # as on a machine whose torch uses no libgomp
        pool = _run(2, 32, 32, 12, 12, 1, "relu", tb=8)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two) and torch.equal(one, pool)


def test_what_the_kernel_does_not_take_is_said():
    L = vector_width()
    ok = ((2, 32, 8, 8), (32, 32, 3, 3), [1, 1], [1, 1], [1, 1], 1)
    assert W.supported(*ok) == ""
    cases = {
        "5 x 5": ((2, 32, 8, 8), (32, 32, 5, 5), [1, 1], [2, 2], [1, 1], 1),
        "stride": ((2, 32, 8, 8), (32, 32, 3, 3), [2, 2], [1, 1], [1, 1], 1),
        "dilation": ((2, 32, 8, 8), (32, 32, 3, 3), [1, 1], [1, 1], [2, 2], 1),
        "groups": ((2, 32, 8, 8), (32, 16, 3, 3), [1, 1], [1, 1], [1, 1], 2),
        "padding": ((2, 32, 8, 8), (32, 32, 3, 3), [1, 1], [3, 3], [1, 1], 1),
        "or more": ((2, 3, 8, 8), (32, 3, 3, 3), [1, 1], [1, 1], [1, 1], 1),
        "multiple": ((2, L + 8, 8, 8) if L == 16 else (2, 20, 8, 8), (32, L + 8 if L == 16 else 20, 3, 3),
                     [1, 1], [1, 1], [1, 1], 1),
        "tile": ((2, 32, 8, 8), (17, 32, 3, 3), [1, 1], [1, 1], [1, 1], 1),
        "empty": ((2, 32, 1, 1), (32, 32, 3, 3), [1, 1], [0, 0], [1, 1], 1),
    }
    for word, args in cases.items():
        why = W.supported(*args)
        assert word in why, (word, why)


def test_the_weight_transform_is_g_w_g_transposed():
    w = torch.zeros(16, 16, 3, 3)
    w[0, 0] = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    nr = 32
    u = W.transform_weight(w, nr)
    assert u.shape == (16, 1, 16, nr)
    g = torch.tensor(W._G, dtype=torch.float64)
    want = g @ w[0, 0].double() @ g.t()
    got = u[:, 0, 0, 0].reshape(4, 4).double()
    assert torch.allclose(got, want)
    assert float(u[:, 0, 1:, :].abs().max()) == 0 and float(u[:, 0, :, 16:].abs().max()) == 0   # padded columns


class _Net(torch.nn.Module):
    """conv-relu, a residual block of two 3 x 3 convolutions, a strided one: Winograd takes the
    3 x 3 stride-1 ones with at least 16 channels."""

    def __init__(self, c=16, co=32):
        super().__init__()
        self.a = torch.nn.Conv2d(3, co, 3, padding=1)
        self.b = torch.nn.Conv2d(co, co, 3, padding=1)
        self.c = torch.nn.Conv2d(co, co, 3, padding=1, bias=False)
        self.d = torch.nn.Conv2d(co, 64, 3, stride=2, padding=1)

    def forward(self, x):
        y = F.relu(self.a(x))
        y = F.relu(self.c(F.relu(self.b(y))) + y)
        return self.d(y)


def _program(monkeypatch, winograd):
    import partita
    from partita.codegen import CompiledProgram

    monkeypatch.setattr(lib, "WINOGRAD", winograd)
    torch.manual_seed(0)
    m = _Net().eval().requires_grad_(False)
    x = torch.randn(2, 3, 11, 10)
    return m, x, CompiledProgram(partita.optimize(partita.import_torch(m, (x,))))


def test_programs_run_the_3x3_convolutions_on_winograd_and_agree_with_the_direct_kernel(monkeypatch):
    m, x, prog = _program(monkeypatch, True)
    _, _, direct = _program(monkeypatch, False)
    convs = [n for n in prog.graph.nodes if n.op == "conv2d_pointwise"]
    assert len(convs) == 4 and all(lib.writes_into(n) for n in convs)
    assert prog.memory_plan.shared       # the residual's buffer written over, in place
    for i in range(3):                   # the first call packs; then the generated kernels
        xi = x * (1 + i)
        before = lib.packed_weight_stats()
        (got,) = prog([xi])
        mid = lib.packed_weight_stats()
        (dgot,) = direct([xi])
        after = lib.packed_weight_stats()
        want = m(xi)
        scale = max(1.0, float(want.abs().max()))
        assert float((got - want).abs().max()) <= 1e-4 * scale
        assert float((got - dgot).abs().max()) <= 1e-4 * scale
        if i:
            assert mid["winograd_calls"] - before["winograd_calls"] == 2    # b and c
            assert mid["generated_conv_calls"] - before["generated_conv_calls"] == 4
            assert after["winograd_calls"] == mid["winograd_calls"]
            assert after["generated_conv_calls"] - mid["generated_conv_calls"] == 4


def test_emit_kernels_prints_the_winograd_kernel(monkeypatch):
    from partita.codegen import emit_kernels

    _, _, prog = _program(monkeypatch, True)
    text = emit_kernels(prog.graph)
    assert "define void @pt_wino23_" in text and "define void @pt_conv_" in text
    assert "F(2x2, 3x3)" in text
    monkeypatch.setattr(lib, "WINOGRAD", False)
    assert "pt_wino23_" not in emit_kernels(prog.graph)
