"""ATen converters for what transformers and torchvision-style models reach beyond the
basics: repeat, copy, empty / empty_permuted, as_strided and histc, each exported from a
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
