"""ReLU6 (``nn.ReLU6``, ``F.hardtanh(x, 0, 6)``: maximum by 0 then minimum by 6 as imported) and
hardswish (x * min(max(x + 3, 0), 6) / 6) as the ``relu6`` and ``hardswish`` epilogues of
``conv2d_pointwise``: fuse-library takes it after a plain, a depthwise
and a small-channel convolution, the reference interpreter agrees before and after, the
generated direct and depthwise kernels apply it in their store (NaN stays NaN), oneDNN as its
hardtanh post-op and ATen as the two ops; every kernel a node may pick gives torch's results.
A clamp to other bounds is left to fuse-kernels, and so is ReLU6 with ``CLAMP_EPILOGUES`` off
(PARTITA_CLAMP_EPILOGUES=0; on by default)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import partita
from partita.codegen import CompiledProgram, choose, library
from partita.codegen import conv as K
from partita.codegen import depthwise as D

PIPELINE = "canonicalize,fold-batch-norm,fuse-library,fuse-kernels,cse,dce"


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 32, 3), nn.ReLU6(), nn.Conv2d(32, 32, 3, groups=32), nn.ReLU6(),
                         nn.Conv2d(32, 40, 3), nn.Hardtanh(0.0, 6.0), nn.Conv2d(40, 8, 1), nn.ReLU6(),
                         nn.Conv2d(8, 8, 1), nn.Hardtanh(-1.0, 1.0)).eval()


@pytest.fixture(autouse=True)
def clamps_taken(monkeypatch):
    """fuse-library takes ReLU6 (off by default)."""
    monkeypatch.setattr(library, "CLAMP_EPILOGUES", True)


def _graphs():
    m = _model()
    x = torch.randn(2, 3, 12, 12) * 4
    g0 = partita.import_torch(m, (x,))
    with torch.inference_mode():
        want = m.double()(x.double()).float()
    return g0, partita.optimize(g0, PIPELINE), x, want


def test_the_pass_takes_relu6_and_the_reference_agrees():
    g0, g, x, want = _graphs()
    convs = [n for n in g.nodes if n.op == "conv2d_pointwise"]
    assert [n.attrs["unary"] for n in convs] == ["relu6"] * 4 + ["none"]
    w0 = {k: np.array(v, copy=True) for k, v in g0.weights.items()}
    w = {k: np.array(v, copy=True) for k, v in g.weights.items()}
    before = partita.run(g0, {"input": x.numpy()}, w0)[0]
    after = partita.run(g, {"input": x.numpy()}, w)[0]
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(after, want.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("winner", ["generated", "onednn", "aten", None])
def test_every_kernel_gives_torchs_results(monkeypatch, tmp_path, winner):
    if winner is not None:
        monkeypatch.setenv("PARTITA_KERNEL_CHOICE", "measure")
        monkeypatch.setenv("PARTITA_CACHE_DIR", str(tmp_path / "cache"))

        def rigged(cands, clock=None, rounds=None):
            for fn in cands.values():
                fn()
            return {k: (1.0 if k == winner else 5.0) for k in cands}

        monkeypatch.setattr(choose, "measure", rigged)
    choose.clear(disk=False)
    try:
        _, g, x, want = _graphs()
        prog = CompiledProgram(g)
        for _ in range(4):
            torch.testing.assert_close(prog([x])[0], want, rtol=1e-4, atol=1e-4)
    finally:
        choose.clear(disk=False)


def test_the_generated_kernels_clamp_in_their_store_and_nan_stays_nan():
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(2, 16, 7, 9, generator=g) * 8).contiguous(memory_format=torch.channels_last)
    x[0, 3, 2, 2] = float("nan")
    w, b = torch.randn(24, 16, 3, 3, generator=g), torch.randn(24, generator=g)
    pc = K.PreparedConv(tuple(x.shape), tuple(w.shape), [1, 1], [1, 1], "relu6")
    want = F.hardtanh(F.conv2d(x, w, b, padding=1), 0.0, 6.0)
    y = pc(x, pc.pack(w), b)
    assert torch.equal(torch.isnan(y), torch.isnan(want)) and int(torch.isnan(y).sum()) > 0
    ok = ~torch.isnan(want)
    assert float((y[ok] - want[ok]).abs().max()) < 1e-4 and float(y[ok].max()) == 6.0
    wd = torch.randn(16, 1, 3, 3, generator=g)
    pd = D.PreparedDepthwise(tuple(x.shape), tuple(wd.shape), [2, 2], [1, 1], "relu6")
    want = F.hardtanh(F.conv2d(x, wd, b[:16], stride=2, padding=1, groups=16), 0.0, 6.0)
    y = pd(x, pd.pack(wd), b[:16])
    assert torch.equal(torch.isnan(y), torch.isnan(want))
    ok = ~torch.isnan(want)
    assert float((y[ok] - want[ok]).abs().max()) < 1e-4


def test_switched_off_relu6_is_left_to_the_fused_kernels(monkeypatch):
    monkeypatch.setattr(library, "CLAMP_EPILOGUES", False)
    _, g, x, want = _graphs()
    assert {n.attrs["unary"] for n in g.nodes if n.op == "conv2d_pointwise"} == {"none"}
    torch.testing.assert_close(CompiledProgram(g)([x])[0], want, rtol=1e-4, atol=1e-4)


# --- hardswish (x * min(max(x + 3, 0), 6) / 6, as torch.export decomposes nn.Hardswish) -----------

def _hs_graphs():
    torch.manual_seed(1)
    m = nn.Sequential(nn.Conv2d(3, 32, 3), nn.Hardswish(), nn.Conv2d(32, 32, 3, groups=32), nn.Hardswish(),
                      nn.Conv2d(32, 8, 1), nn.Hardswish()).eval()
    x = torch.randn(2, 3, 12, 12) * 4
    g0 = partita.import_torch(m, (x,))
    with torch.inference_mode():
        want = m.double()(x.double()).float()
    return g0, partita.optimize(g0, PIPELINE), x, want


@pytest.mark.parametrize("winner", ["generated", "onednn", "aten", None])
def test_hardswish_is_taken_and_every_kernel_gives_torchs_results(monkeypatch, tmp_path, winner):
    if winner is not None:
        monkeypatch.setenv("PARTITA_KERNEL_CHOICE", "measure")
        monkeypatch.setenv("PARTITA_CACHE_DIR", str(tmp_path / "cache"))
        monkeypatch.setattr(choose, "measure", lambda cands, clock=None, rounds=None: {
            k: (fn(), 1.0 if k == winner else 5.0)[1] for k, fn in cands.items()})
    choose.clear(disk=False)
    try:
        g0, g, x, want = _hs_graphs()
        assert [n.attrs["unary"] for n in g.nodes if n.op == "conv2d_pointwise"] == ["hardswish"] * 3
        w0 = {k: np.array(v, copy=True) for k, v in g0.weights.items()}
        w = {k: np.array(v, copy=True) for k, v in g.weights.items()}
        np.testing.assert_allclose(partita.run(g, {"input": x.numpy()}, w)[0],
                                   partita.run(g0, {"input": x.numpy()}, w0)[0], rtol=1e-5, atol=1e-5)
        prog = CompiledProgram(g)
        for _ in range(4):
            torch.testing.assert_close(prog([x])[0], want, rtol=1e-4, atol=1e-4)
    finally:
        choose.clear(disk=False)


def test_the_generated_kernels_apply_hardswish_and_nan_stays_nan():
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(2, 16, 7, 9, generator=g) * 4).contiguous(memory_format=torch.channels_last)
    x[0, 3, 2, 2] = float("nan")
    w, b = torch.randn(24, 16, 3, 3, generator=g), torch.randn(24, generator=g)
    pc = K.PreparedConv(tuple(x.shape), tuple(w.shape), [1, 1], [1, 1], "hardswish")
    want = F.hardswish(F.conv2d(x, w, b, padding=1))
    y = pc(x, pc.pack(w), b)
    assert torch.equal(torch.isnan(y), torch.isnan(want)) and int(torch.isnan(y).sum()) > 0
    ok = ~torch.isnan(want)
    assert float((y[ok] - want[ok]).abs().max()) < 1e-4
    wd = torch.randn(16, 1, 3, 3, generator=g)
    pd = D.PreparedDepthwise(tuple(x.shape), tuple(wd.shape), [2, 2], [1, 1], "hardswish")
    want = F.hardswish(F.conv2d(x, wd, b[:16], stride=2, padding=1, groups=16))
    y = pd(x, pd.pack(wd), b[:16])
    assert torch.equal(torch.isnan(y), torch.isnan(want))
    ok = ~torch.isnan(want)
    assert float((y[ok] - want[ok]).abs().max()) < 1e-4
