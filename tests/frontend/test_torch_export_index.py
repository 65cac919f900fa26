"""torch.export converters for the scatters, index_put, slice/select_scatter, cumprod, gather
and amax/amin: each exports a tiny module and matches eager on both executors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import partita
from partita.frontend import FrontendError

RTOL = 1e-5


def _matches_eager(module: nn.Module, args: tuple, want_op: str | None = None) -> None:
    g = partita.import_torch(module, args)
    partita.verify(g)
    if want_op is not None:
        assert want_op in [n.op for n in g.nodes]
    with torch.no_grad():
        ref = module(*args)
    refs = [r.numpy() for r in (ref if isinstance(ref, tuple) else (ref,))]
    for backend in ("numpy", "torch"):
        outs = partita.run(g, [a.numpy() for a in args] if backend == "numpy" else list(args), backend=backend)
        assert len(outs) == len(refs)
        for o, r in zip(outs, refs):
            o = np.asarray(o if backend == "numpy" else o.numpy())
            assert o.shape == r.shape and o.dtype == r.dtype
            np.testing.assert_allclose(o, r, rtol=RTOL, atol=RTOL)


def _perm_rows(n: int, cols: int, take: int) -> torch.Tensor:
    """An index of shape [take, cols] naming distinct rows in each column (no repeated write)."""
    return torch.argsort(torch.rand(n, cols), dim=0)[:take]


class Gather(nn.Module):
    def forward(self, x, i):
        return torch.gather(x, 1, i), x.amax(dim=1), x.amin(dim=(0, 1), keepdim=True)


def test_gather_and_amax_amin():
    _matches_eager(Gather(), (torch.randn(3, 5), torch.randint(0, 5, (3, 4))), "gather")


class Scatter(nn.Module):
    def forward(self, x, i, s):
        return (x.scatter(0, i, s), x.scatter(0, i, 2.5), x.scatter_add(0, i, s),
                x.scatter(0, i, s, reduce="multiply"), x.scatter(0, i, 1.5, reduce="add"))


def test_scatter_src_value_and_scatter_add():
    _matches_eager(Scatter(), (torch.randn(5, 4), _perm_rows(5, 4, 3), torch.randn(3, 4)), "scatter_elements")


class ScatterReduce(nn.Module):
    def __init__(self, reduce: str, include_self: bool) -> None:
        super().__init__()
        self.reduce, self.include_self = reduce, include_self

    def forward(self, x, i, s):
        return x.scatter_reduce(1, i, s, reduce=self.reduce, include_self=self.include_self)


@pytest.mark.parametrize("reduce", ["sum", "prod", "amax", "amin", "mean"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(reduce, include_self):
    x, s = torch.randn(3, 6), torch.randn(3, 5)
    i = torch.randint(0, 4, (3, 5))     # repeats, and columns 4 and 5 never reached
    _matches_eager(ScatterReduce(reduce, include_self), (x, i, s), "scatter_add" if reduce == "mean" else "scatter_elements")


def test_scatter_reduce_integers_without_self():
    x, s = torch.randint(-5, 5, (3, 6)), torch.randint(-5, 5, (3, 5))
    _matches_eager(ScatterReduce("amax", False), (x, torch.randint(0, 6, (3, 5)), s))


class IndexPut(nn.Module):
    def __init__(self, accumulate: bool) -> None:
        super().__init__()
        self.accumulate = accumulate

    def forward(self, x, i, i2, j, v, w):
        a = torch.ops.aten.index_put(x, [i], v, self.accumulate)             # x[i] = v
        b = torch.ops.aten.index_put(x, [None, i2, j], w, self.accumulate)   # x[:, i2, j] = w
        return a, b


@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put(accumulate):
    x = torch.randn(4, 5, 6)
    # Distinct targets for plain writes (negative indices count from the end); repeats to add.
    i = torch.tensor([0, 3, 0]) if accumulate else torch.tensor([0, -2, 3])
    i2 = torch.tensor([0, -2, 4])
    j = torch.tensor([[1], [5]])                                            # broadcasts against i2: [2, 3]
    v = torch.randn(3, 1, 6)                                                # broadcast to [3, 5, 6]
    w = torch.randn(4, 2, 3) if accumulate else torch.randn(4, 1, 3)
    _matches_eager(IndexPut(accumulate), (x, i, i2, j, v, w), "scatter_elements")


class SetItem(nn.Module):
    def forward(self, x, i, v):
        y = x.clone()
        y[i] = v
        z = x.clone()
        z[:, 1:5:2] = 0.5
        return y, z


def test_setitem_exports_to_index_put_and_slice_scatter():
    _matches_eager(SetItem(), (torch.randn(5, 6), torch.tensor([4, 1]), torch.randn(2, 6)))


class SliceSelectScatter(nn.Module):
    def forward(self, x, s, t):
        return torch.slice_scatter(x, s, dim=1, start=1, end=6, step=2), torch.select_scatter(x, t, 0, -1)


def test_slice_scatter_and_select_scatter():
    _matches_eager(SliceSelectScatter(), (torch.randn(3, 7), torch.randn(3, 3), torch.randn(7)), "scatter_elements")


class CumProd(nn.Module):
    def forward(self, x, k):
        return torch.cumprod(x, dim=1), torch.cumprod(k, dim=0), torch.cumprod(x, 0, dtype=torch.float64)


def test_cumprod():
    _matches_eager(CumProd(), (torch.randn(3, 5), torch.randint(-3, 4, (4, 2), dtype=torch.int32)), "cumprod")


class MaskPut(nn.Module):
    def forward(self, x):
        return torch.ops.aten.index_put(x, [x > 0], torch.tensor(0.0))


def test_index_put_with_a_mask_is_refused_with_the_reason():
    with pytest.raises(FrontendError, match="boolean-mask indexing"):
        partita.import_torch(MaskPut(), (torch.randn(3, 4),))


class VectorNorm(nn.Module):
    def __init__(self, ord: float, dim, keepdim: bool) -> None:
        super().__init__()
        self.ord, self.dim, self.keepdim = ord, dim, keepdim

    def forward(self, x):
        return torch.linalg.vector_norm(x, ord=self.ord, dim=self.dim, keepdim=self.keepdim)


@pytest.mark.parametrize("ord", [2, 1, float("inf"), float("-inf"), 0, 3.0, 0.5])
@pytest.mark.parametrize("dim,keepdim", [(None, False), ((1, 2), True), (-1, False)])
def test_linalg_vector_norm(ord, dim, keepdim):
    # ConvNeXt v2's global response norm: the 2-norm over the spatial dims, kept
    x = torch.randn(2, 4, 5, 3)
    x[0, 0, 0] = 0.0
    _matches_eager(VectorNorm(ord, dim, keepdim), (x,))


class CumsumAs(nn.Module):
    def forward(self, x, i):
        # MoE routing: tokens per expert as floats, their running offsets asked for in int32
        return torch.cumsum(x, dim=0, dtype=torch.int32), torch.cumsum(i, dim=1, dtype=torch.int16), torch.cumsum(i, 0)


def test_cumsum_keeps_the_dtype_asked_for():
    _matches_eager(CumsumAs(), (torch.tensor([3.0, 0.0, 2.0, 5.0]), torch.randint(-5, 5, (3, 4), dtype=torch.int32)))


class NoStats(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(3, track_running_stats=False)
        self.w = nn.Parameter(torch.randn(4, 3, 3, 3))

    def forward(self, x):
        # BiT's weight standardization: a batch norm of the weight, without running statistics
        w = F.batch_norm(self.w.reshape(1, 4, -1), None, None, training=True, momentum=0.0, eps=1e-6)
        return F.conv2d(self.bn(x), w.reshape_as(self.w))


def test_batch_norm_without_running_statistics():
    _matches_eager(NoStats().eval(), (torch.randn(2, 3, 6, 6),))
