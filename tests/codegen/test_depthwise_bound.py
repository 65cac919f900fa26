"""The library convolution step's steady state (library.py: the generated call taken first when
the weight is the tensor of the last call at the same version, its packed copy kept) and the
depthwise kernel's whole-range entry (depthwise.py: ``kernels``, ``WHOLE_SUFFIX``): a program
whose weights are call arguments, called again after the weights change in place and after new
weight tensors come, against torch; odd channel counts, stride 2 on odd sizes, a 1 x 1 map."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

import partita
from partita.codegen import CompiledProgram, choose
from partita.codegen.depthwise import PreparedDepthwise, WHOLE_SUFFIX, depthwise_dims, depthwise_ir, kernels


@pytest.fixture
def own_cache(monkeypatch, tmp_path):
    """Kernel choices measured into a cache of this test's own."""
    monkeypatch.setenv("PARTITA_CACHE_DIR", str(tmp_path / "cache"))
    choose.clear(disk=False)
    yield
    choose.clear(disk=False)


def _block(c: int, stride: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(c, c, 3, stride, 1, groups=c), nn.ReLU6(),
                         nn.Conv2d(c, 7, 1), nn.ReLU6(), nn.Conv2d(7, c, 1)).eval()


@pytest.mark.parametrize("c, hw, stride", [(13, (9, 7), 2), (21, (6, 6), 1), (17, (1, 1), 1)])
def test_weights_changed_in_place_or_replaced_are_read_again(own_cache, c, hw, stride):
    torch.manual_seed(0)
    m = _block(c, stride)
    x = torch.randn(3, c, *hw)
    g = partita.optimize(partita.import_torch(m, (x,)), "canonicalize,fuse-library,fuse-kernels,cse,dce")
    prog = CompiledProgram(g)
    weights = {k: torch.from_numpy(np.array(v, copy=True)) for k, v in g.weights.items()}
    assert set(weights) == set(m.state_dict())
    for i in range(7):
        if i == 4:      # the same tensors, new contents
            for w in weights.values():
                w.mul_(0.5)
        if i == 5:      # new tensors
            weights = {k: v * -1.5 for k, v in weights.items()}
        ref = _block(c, stride)
        ref.load_state_dict(weights)
        with torch.inference_mode():
            want = ref.double()(x.double()).float()
            got = prog([x], weights)[0]
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_the_whole_range_entry_is_in_the_kernels_ir():
    dims = depthwise_dims((3, 13, 9, 7), (13, 1, 3, 3), [2, 2], [1, 1])
    ir = depthwise_ir("k", 16, "relu6", False, dims)
    assert f"define void @k{WHOLE_SUFFIX}(ptr %pp)" in ir
    assert f"i64 0, i64 {3 * dims['ho']}, i64 0)" in ir


def test_the_whole_range_entry_equals_the_range_kernel():
    torch.manual_seed(0)
    xs, ws = (3, 13, 9, 7), (13, 1, 3, 3)
    k = PreparedDepthwise(xs, ws, [2, 2], [1, 1], "relu6")
    fn, whole = kernels(k.lanes, "relu6", False, depthwise_dims(xs, ws, [2, 2], [1, 1]))
    assert fn is k.fn and whole is k.whole
    x = torch.randn(xs).contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(ws), torch.randn(13)
    out = torch.empty(k.shape).contiguous(memory_format=torch.channels_last)
    packed = k.pack(w)
    k(x, packed, b, None, out)
    first = out.clone()
    out.zero_()
    k.fn(k.addr, 0, k.rows, 0)                 # the range kernel over the same block
    torch.testing.assert_close(out, first, rtol=0, atol=0)
    want = torch.nn.functional.conv2d(x.double(), w.double(), b.double(), 2, 1, groups=13).clamp(0, 6).float()
    torch.testing.assert_close(first, want, rtol=1e-5, atol=1e-5)
