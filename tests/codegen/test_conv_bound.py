"""The generated convolution's whole-range entry (conv.py: ``kernels``, ``whole_entry``,
``WHOLE_SUFFIX``) and its inlined same-tensors check: a program whose weights are call
arguments, called again after the weights change in place and after new weight tensors
come, against torch; a residual whose storage moves between calls; odd channel counts,
stride 2 on odd sizes, a 1 x 1 map."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

import partita
from partita.codegen import CompiledProgram, choose
from partita.codegen.conv import PreparedConv, WHOLE_SUFFIX, conv_dims, conv_ir, kernels, segments, tile_for


@pytest.fixture
def own_cache(monkeypatch, tmp_path):
    """Kernel choices measured into a cache of this test's own."""
    monkeypatch.setenv("PARTITA_CACHE_DIR", str(tmp_path / "cache"))
    choose.clear(disk=False)
    yield
    choose.clear(disk=False)


class _Block(nn.Module):
    """A 3 x 3 convolution, two 1 x 1 ones and a residual add: the generated kernel's steps."""

    def __init__(self, c: int, stride: int) -> None:
        super().__init__()
        self.a = nn.Conv2d(c, 19, 3, stride, 1)
        self.b = nn.Conv2d(19, 19, 1)
        self.c = nn.Conv2d(19, 11, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.a(x))
        return self.c(torch.relu(self.b(y) + y))


@pytest.mark.parametrize("c, hw, stride", [(13, (9, 7), 2), (21, (6, 6), 1), (17, (1, 1), 1)])
def test_weights_changed_in_place_or_replaced_are_read_again(own_cache, c, hw, stride):
    torch.manual_seed(0)
    m = _Block(c, stride).eval()
    x = torch.randn(3, c, *hw)
    g = partita.optimize(partita.import_torch(m, (x,)), "canonicalize,fuse-library,fuse-kernels,cse,dce")
    prog = CompiledProgram(g)
    weights = {k: torch.from_numpy(np.array(v, copy=True)) for k, v in g.weights.items()}
    assert set(weights) == set(m.state_dict())
    for i in range(8):
        if i == 4:      # the same tensors, new contents
            for w in weights.values():
                w.mul_(0.5)
        if i == 5:      # new tensors
            weights = {k: v * -1.5 for k, v in weights.items()}
        if i == 6:      # a new input tensor
            x = torch.randn(3, c, *hw)
        ref = _Block(c, stride).eval()
        ref.load_state_dict(weights)
        with torch.inference_mode():
            want = ref.double()(x.double()).float()
            got = prog([x], weights)[0]
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_the_whole_range_entry_is_in_the_kernels_ir():
    dims = conv_dims((3, 13, 9, 7), (19, 13, 3, 3), [2, 2], [1, 1])
    cfg = tile_for(3 * dims["ho"] * dims["wo"], 19)
    ir = conv_ir("k", cfg, "relu", dims)
    tiles = sum(sg[2] for sg in segments(dims, cfg.mr))
    assert f"define void @k{WHOLE_SUFFIX}(ptr %pp)" in ir
    assert f"i64 0, i64 {tiles}, i64 0)" in ir


@pytest.mark.parametrize("xs, ws, stride, act, other", [
    ((3, 13, 9, 7), (19, 13, 3, 3), [2, 2], "relu", False),
    ((2, 21, 6, 6), (37, 21, 1, 1), [1, 1], "none", True),
    ((1, 17, 1, 1), (5, 17, 1, 1), [1, 1], "relu6", False),
])
def test_the_whole_range_entry_equals_the_range_kernel_and_torch(xs, ws, stride, act, other):
    torch.manual_seed(0)
    pad = [ws[2] // 2, ws[3] // 2]
    k = PreparedConv(xs, ws, stride, pad, act, other)
    fn, whole = kernels(k.cfg, act, conv_dims(xs, ws, stride, pad))
    assert fn is k.fn and whole is k.whole
    cl = torch.channels_last
    x = torch.randn(xs).contiguous(memory_format=cl)
    w, b = torch.randn(ws), torch.randn(ws[0])
    out = torch.empty(k.shape).contiguous(memory_format=cl)
    res = torch.randn(k.shape).contiguous(memory_format=cl) if other else None
    packed = k.pack(w)
    k(x, packed, b, res, out)
    first = out.clone()
    out.zero_()
    k.fn(k.addr, 0, k.tiles, 0)                 # the range kernel over the same block
    torch.testing.assert_close(out, first, rtol=0, atol=0)
    want = torch.nn.functional.conv2d(x.double(), w.double(), b.double(), stride, pad)
    if other:
        want = want + res.double()
    want = {"none": want, "relu": want.relu(), "relu6": want.clamp(0, 6)}[act].float()
    torch.testing.assert_close(first, want, rtol=1e-5, atol=1e-5)
    # bound again: the same tensors (the block is not written), then a residual and an input
    # whose storage moved (the block is written again)
    out.zero_()
    k(x, packed, b, res, out)
    torch.testing.assert_close(out, first, rtol=0, atol=0)
    x.set_(x.clone())
    if other:
        res.set_(res.clone() * 2)
    out.zero_()
    k(x, packed, b, res, out)
    if other:
        torch.testing.assert_close(out, first + res / 2, rtol=1e-5, atol=1e-5)
    else:
        torch.testing.assert_close(out, first, rtol=0, atol=0)
