"""The generated max pool and global average pool (codegen/pool.py): each kernel against torch
on odd shapes (channels not a multiple of the vector width; H * W of 1, 7, 49; ceil_mode,
padding, dilation; NaN), from channels-last and NCHW memory, and the steps' measured choice."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from partita.codegen import choose
from partita.codegen.pool import PreparedMaxPool, PreparedMean, kernel_source, pool_windows

MAX_CASES = [
    # (shape, kernel, stride, padding, dilation, ceil_mode)
    ((4, 16, 16, 16), (3, 3), (2, 2), (1, 1), (1, 1), False),   # ResNet's stem pool
    ((2, 3, 7, 7), (3, 3), (2, 2), (1, 1), (1, 1), True),
    ((1, 5, 9, 8), (3, 2), (2, 1), (1, 0), (2, 1), True),
    ((3, 24, 1, 1), (1, 1), (1, 1), (0, 0), (1, 1), False),
    ((2, 17, 7, 7), (2, 2), (2, 2), (0, 0), (1, 1), True),
    ((2, 33, 6, 5), (3, 3), (1, 1), (1, 1), (1, 1), False),
    ((1, 20, 11, 11), (5, 5), (3, 3), (2, 2), (1, 1), True),
]


def _torch_max(x, k, s, p, d, ceil):
    return F.max_pool2d(x, k, s, p, d, ceil_mode=ceil)


@pytest.mark.parametrize("case", MAX_CASES, ids=lambda c: "x".join(map(str, c[0])))
@pytest.mark.parametrize("channels_last", [True, False])
def test_max_pool_equals_torch(case, channels_last):
    shape, k, s, p, d, ceil = case
    torch.manual_seed(0)
    x = torch.randn(shape)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    want = _torch_max(x, k, s, p, d, ceil)
    y = PreparedMaxPool(shape, want.shape[2:], k, s, p, d)(x)
    assert y.shape == want.shape and y.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(y, want)   # a max picks one of the inputs: exact


def test_max_pool_propagates_nan_and_infinities():
    x = torch.randn(2, 9, 6, 6)
    x[0, 0, 0, 0] = float("nan")
    x[0, 1, 3, 3] = float("nan")
    x[1, 2] = float("-inf")
    x[1, 3, 2, 2] = float("inf")
    want = F.max_pool2d(x, 3, 2, 1)
    y = PreparedMaxPool(tuple(x.shape), want.shape[2:], (3, 3), (2, 2), (1, 1), (1, 1))(x)
    assert torch.equal(y.isnan(), want.isnan())
    assert torch.equal(y.nan_to_num(), want.nan_to_num())


def test_pool_windows_keep_taps_inside_the_input():
    assert pool_windows(4, 2, 3, 2, 1, 1) == [(1, 3), (0, 3)]
    assert pool_windows(5, 3, 2, 2, 0, 1) == [(0, 2), (0, 2), (0, 1)]   # ceil_mode's last window
    with pytest.raises(ValueError, match="no tap inside the input"):
        pool_windows(2, 3, 1, 2, 0, 1)


@pytest.mark.parametrize("shape", [(4, 64, 4, 4), (2, 3, 7, 7), (1, 17, 1, 1), (3, 48, 1, 7), (2, 5, 7, 7),
                                   (2, 20, 7, 1)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("kernel_layout", ["nhwc", "nchw"])
@pytest.mark.parametrize("keepdim", [True, False])
def test_global_mean_equals_torch(shape, kernel_layout, keepdim):
    torch.manual_seed(1)
    x64 = torch.randn(shape, dtype=torch.float64)
    want = x64.mean((2, 3), keepdim=keepdim).float()
    out = tuple(want.shape)
    pm = PreparedMean(shape, out, kernel_layout == "nhwc")
    for x in (x64.float(), x64.float().contiguous(memory_format=torch.channels_last)):
        y = pm(x)
        assert y.shape == want.shape
        torch.testing.assert_close(y, want, rtol=1e-6, atol=1e-6)


def test_kernel_source_names_the_kinds():
    name, ir = kernel_source("mean_cl", hw=49, c=17)
    assert name.startswith("pt_mean_clpool") and "define void" in ir
    with pytest.raises(ValueError, match="no kernel kind"):
        kernel_source("min", hw=1, c=1)


def test_steps_measure_against_aten(monkeypatch, tmp_path):
    """With measuring on, each layout's first call times the generated kernel against ATen's
    op and the result equals torch's whichever is picked."""
    import partita
    from partita.codegen import CompiledProgram

    monkeypatch.setenv("PARTITA_KERNEL_CHOICE", "measure")
    monkeypatch.setenv("PARTITA_CACHE_DIR", str(tmp_path))
    choose.clear(disk=False)

    class Head(torch.nn.Module):
        def forward(self, x):
            return F.max_pool2d(x, 3, 2, 1).mean((2, 3))

    x = torch.randn(2, 12, 9, 9)
    g = partita.import_torch(Head().eval(), (x,))
    prog = CompiledProgram(g)
    for _ in range(2):
        torch.testing.assert_close(prog([x])[0], Head()(x))
    keys = [c.key for c in choose.choices()]
    assert any(k.startswith("max_pool2d") for k in keys) and any(k.startswith("mean") for k in keys)
    choose.clear(disk=False)


@pytest.mark.parametrize("shape", [(4, 8, 8, 32), (2, 7, 7, 13), (3, 1, 1, 5), (1, 7, 1, 24)])
@pytest.mark.parametrize("keepdim", [True, False])
def test_nhwc_mean_over_axes_1_2_equals_torch(shape, keepdim):
    """A squeeze-excitation's pool after assign-layout: a mean over axes (1, 2) of [N, H, W, C]."""
    from partita.codegen.pool import PreparedMeanNHWC

    torch.manual_seed(1)
    x = torch.randn(shape)
    want = x.mean(dim=(1, 2), keepdim=keepdim)
    y = PreparedMeanNHWC(shape, tuple(want.shape))(x)
    assert y.shape == want.shape
    torch.testing.assert_close(y, want, rtol=1e-6, atol=1e-6)


def test_nhwc_mean_step_in_a_compiled_program():
    """A mean over axes (1, 2) of an [N, H, W, C] value compiled: the step matches the reference
    interpreter and eager."""
    import partita
    from partita.backend import numpy_ref
    from partita.codegen import CompiledProgram

    class _M(torch.nn.Module):
        def forward(self, x):
            return x.permute(0, 2, 3, 1).mean(dim=(1, 2), keepdim=True) * 2.0

    torch.manual_seed(2)
    x = torch.randn(2, 12, 5, 5)
    g = partita.import_torch(_M(), (x,))
    want = numpy_ref.run(g, [x.numpy()])[0]
    torch.testing.assert_close(CompiledProgram(g)([x])[0], torch.from_numpy(want), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(CompiledProgram(g)([x])[0], _M()(x), rtol=1e-6, atol=1e-6)
