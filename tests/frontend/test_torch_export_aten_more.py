"""ATen converters for what transformers and torchvision-style models reach beyond the
basics (repeat, copy, empty, as_strided, histc, any, diagonal, flip, max/min.dim, prod, the logs,
expm1, group norm, upsampling, unequal adaptive pools, masked_scatter, cdist), each exported from a
tiny module and compared with eager."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

import partita


def _check(module: nn.Module, *args: torch.Tensor, atol: float = 0.0) -> partita.Graph:
    g = partita.import_torch(module, args)
    with torch.no_grad():
        want = module(*args)
    want = want if isinstance(want, tuple) else (want,)
    for backend in ("numpy", "torch"):
        got = partita.run(g, [a.numpy() for a in args], backend=backend)
        for a, b in zip(got, want):
            np.testing.assert_allclose(np.asarray(a), b.numpy(), rtol=0, atol=atol)
    return g


class _Lambda(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


@pytest.mark.parametrize("reps", [(2, 3), (1, 1), (2, 1, 3), (3, 1, 1, 2)])
def test_repeat_tiles_and_adds_leading_dims(reps):
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    _check(_Lambda(lambda x: x.repeat(*reps)), x)


def test_repeat_with_fewer_counts_than_dims_is_refused_by_torch_first():
    with pytest.raises(Exception):
        partita.import_torch(_Lambda(lambda x: x.repeat(2)), (torch.randn(2, 3),))


def test_copy_broadcasts_and_casts_into_the_destination():
    def fn(x, y):
        z = torch.zeros(2, 3, dtype=torch.float32)
        z.copy_(y)            # y: [3] int64, broadcast and cast
        return z + x
    _check(_Lambda(fn), torch.randn(2, 3), torch.tensor([1, 2, 3]))


def test_empty_like_buffers_that_are_overwritten():
    def fn(x):
        e = torch.empty_like(x)
        e.fill_(2.0)
        return e * x
    _check(_Lambda(fn), torch.randn(3, 4))


@pytest.mark.parametrize("size,stride,offset", [((2, 2), (1, 2), 0), ((3, 2), (2, 1), 1), ((2, 3, 2), (6, 2, 1), 0)])
def test_as_strided_picks_the_storage_positions(size, stride, offset):
    x = torch.arange(12, dtype=torch.float32)
    _check(_Lambda(lambda x: torch.as_strided(x, size, stride, offset) * 1.0), x)


def test_as_strided_past_the_end_is_refused_naming_the_op():
    with pytest.raises(partita.PartitaError, match=r"as_strided.*reach past the 4 elements"):
        partita.import_torch(_Lambda(lambda x: torch.as_strided(x.reshape(4) * 1.0, (3,), (2,)) + 0), (torch.randn(2, 2),))


@pytest.mark.parametrize("bins,lo,hi", [(4, 0, 3), (5, -1.0, 1.0), (3, 0, 0), (8, 0.25, 0.75)])
def test_histc_counts_like_torch(bins, lo, hi):
    x = torch.tensor([0.0, 1, 1, 2, 3, 3, 3, -0.5, 0.5, 0.75, 0.25, 4.0, 0.999])
    g = _check(_Lambda(lambda x: torch.histc(x, bins=bins, min=lo, max=hi)), x)
    assert g.outputs[0].type.shape == (bins,)


def test_histc_of_expert_indices_as_mixture_of_experts_routers_count_them():
    idx = torch.tensor([[0, 3], [1, 3], [3, 2], [0, 0]])
    _check(_Lambda(lambda i: torch.histc(i.float(), bins=4, min=0, max=3)), idx)


@pytest.mark.parametrize("fn", [
    lambda x: torch.any(x > 0.5),
    lambda x: torch.any(x > 0.5, dim=1),
    lambda x: torch.any(x > 0.5, dim=(0, 2), keepdim=True),
    lambda x: torch.logical_xor(x > 0, x > 0.5),
    lambda x: torch.diagonal(x, 0, 1, 2) * 1.0,
    lambda x: torch.diagonal(x, -1, 0, 2) * 1.0,
    lambda x: torch.diagonal(x, 1, 2, 1) * 1.0,
    lambda x: torch.flip(x, (0, 2)),
    lambda x: torch.max(x, dim=1),
    lambda x: torch.min(x, dim=-1, keepdim=True),
    lambda x: torch.prod(x),
    lambda x: torch.prod(x, 1, keepdim=True),
    lambda x: torch.prod((x > 0).int(), 2),
])
def test_reductions_and_movements(fn):
    x = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(0))
    _check(_Lambda(fn), x, atol=1e-6)


def test_logs_and_expm1_are_accurate_near_zero():
    x = torch.tensor([1e-9, -3e-8, 1e-4, 0.5, 3.0, -0.9, 0.0, 60.0, -200.0, 100.0])
    for fn in (torch.log1p, torch.expm1):
        g = partita.import_torch(_Lambda(fn), (x,))
        for backend in ("numpy", "torch"):
            got = np.asarray(partita.run(g, [x.numpy()], backend=backend)[0], np.float64)
            want = fn(x.double()).numpy()
            np.testing.assert_allclose(got, want.astype(np.float32), rtol=2e-6, atol=0)
    pos = torch.tensor([0.5, 1.0, 8.0, 1e-3, 3.7])
    _check(_Lambda(lambda v: torch.log2(v)), pos, atol=1e-6)
    _check(_Lambda(lambda v: torch.log10(v)), pos, atol=1e-6)


@pytest.mark.parametrize("groups,affine", [(2, True), (4, False), (1, True)])
def test_group_norm(groups, affine):
    m = nn.GroupNorm(groups, 4, affine=affine).eval()
    if affine:
        with torch.no_grad():
            m.weight.uniform_(0.5, 1.5)
            m.bias.uniform_(-1, 1)
    _check(m, torch.randn(2, 4, 3, 5), atol=1e-5)


@pytest.mark.parametrize("kw", [dict(size=(7, 9)), dict(scale_factor=2), dict(scale_factor=1.5), dict(size=(3, 2))])
@pytest.mark.parametrize("mode", ["nearest", "bilinear", "bilinear-align"])
def test_upsample(kw, mode):
    import torch.nn.functional as F

    if mode == "nearest":
        fn = lambda x: F.interpolate(x, mode="nearest", **kw)  # noqa: E731
    else:
        fn = lambda x: F.interpolate(x, mode="bilinear", align_corners=mode.endswith("align"), **kw)  # noqa: E731
    _check(_Lambda(fn), torch.randn(1, 2, 4, 6, generator=torch.Generator().manual_seed(1)), atol=1e-5)


def test_adaptive_average_pool_with_unequal_windows():
    _check(nn.AdaptiveAvgPool2d((3, 5)), torch.randn(2, 3, 7, 8), atol=1e-6)
    _check(nn.AdaptiveAvgPool1d(3), torch.randn(2, 3, 7), atol=1e-6)


def test_masked_scatter_takes_the_source_in_order():
    x = torch.zeros(3, 4)
    mask = torch.tensor([[True, False, True, False], [False, False, False, True], [True, True, False, False]])
    src = torch.arange(12, dtype=torch.float32).reshape(3, 4) + 1
    _check(_Lambda(lambda x, m, s: x.masked_scatter(m, s)), x, mask, src)
    row = torch.tensor([True, False, True, True])
    _check(_Lambda(lambda x, m, s: x.masked_scatter(m, s)), x, row, src)


@pytest.mark.parametrize("p", [2.0, 1.0, 0.0, 3.0, float("inf")])
def test_cdist(p):
    a = torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(2))
    b = torch.randn(2, 4, 3, generator=torch.Generator().manual_seed(3))
    _check(_Lambda(lambda a, b: torch.cdist(a, b, p=p)), a, b, atol=1e-5)


def test_adaptive_average_pool_3d_and_pdist():
    _check(nn.AdaptiveAvgPool3d((2, 3, 2)), torch.randn(1, 2, 5, 7, 4), atol=1e-6)
    _check(nn.AdaptiveAvgPool3d(1), torch.randn(1, 2, 3, 3, 3), atol=1e-6)
    x = torch.randn(5, 3, generator=torch.Generator().manual_seed(4))
    for p in (2.0, 1.0):
        _check(_Lambda(lambda x: torch.pdist(x, p)), x, atol=1e-5)


@pytest.mark.parametrize("mode", ["trunc", "floor", None])
def test_div_with_a_rounding_mode_floats_and_integers(mode):
    a = torch.tensor([7.0, -7.0, 7.5, -7.5, 0.0, 1e-3, -5.0, 3.0, 6.0, -6.0])
    b = torch.tensor([2.0, 2.0, -2.0, -2.0, 3.0, -7.0, 0.0, 0.1, 3.0, -3.0])
    _check(_Lambda(lambda a, b: torch.div(a, b, rounding_mode=mode)), a, b, atol=1e-6)
    _check(_Lambda(lambda a: torch.div(a, 2.5, rounding_mode=mode)), a, atol=1e-6)
    if mode is not None:
        ia = torch.tensor([7, -7, 7, -7, 0, 100, -1, 9])
        ib = torch.tensor([2, 2, -2, -2, 5, 7, 3, -4])
        _check(_Lambda(lambda a, b: torch.div(a, b, rounding_mode=mode)), ia, ib)
        _check(_Lambda(lambda a: torch.div(a, 3, rounding_mode=mode)), ia)


def test_atan2_in_every_quadrant_and_on_the_axes():
    y = torch.tensor([1.0, 1.0, -1.0, -1.0, 0.0, 2.0, -2.0, 0.0, 0.5, 3.0])
    x = torch.tensor([1.0, -1.0, -1.0, 1.0, 1.0, 0.0, 0.0, -1.0, -4.0, 1e-3])
    _check(_Lambda(lambda y, x: torch.atan2(y, x)), y, x, atol=1e-6)


def test_sign_of_floats_and_integers():
    _check(_Lambda(lambda x: torch.sign(x)), torch.tensor([-2.0, 0.0, 3.5, -0.0]))
    _check(_Lambda(lambda x: torch.sign(x)), torch.tensor([-2, 0, 7]))
