"""canonicalize's ``pool-as-mean``: an average pool that is the identity is dropped, one whose
windows cover whole axes becomes a ``mean``; every other pool stays. Each case by the
reference interpreter before and after the pass, and against torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import partita
from partita.ops.nn import avg_pool_mean_axes


class _Pool(nn.Module):
    def __init__(self, kw: dict) -> None:
        super().__init__()
        self.kw = kw

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pool = F.avg_pool3d if x.dim() == 5 else F.avg_pool2d
        return pool(x, **self.kw) * 2.0


# (input shape, pool arguments, what canonicalize leaves: "none", "mean" or "pool")
CASES = [
    ((2, 3, 5, 4), dict(kernel_size=1), "none"),
    ((2, 3, 1, 1), dict(kernel_size=3, stride=1, padding=1, count_include_pad=False), "none"),
    ((2, 3, 1, 1), dict(kernel_size=320, ceil_mode=True), "none"),            # EfficientNet's head
    ((2, 3, 2, 3), dict(kernel_size=320, ceil_mode=True), "mean"),
    ((2, 3, 4, 6), dict(kernel_size=(4, 6)), "mean"),
    ((2, 3, 4, 6), dict(kernel_size=(4, 1)), "mean"),                         # over H alone
    ((2, 3, 2, 2, 3), dict(kernel_size=(2, 2, 3)), "mean"),
    ((2, 3, 1, 1), dict(kernel_size=3, stride=1, padding=1), "pool"),          # counts the padding: x / 9
    ((2, 3, 6, 6), dict(kernel_size=3, stride=1, padding=1), "pool"),
    ((2, 3, 6, 6), dict(kernel_size=2), "pool"),
    ((2, 3, 3, 3), dict(kernel_size=2, stride=1, ceil_mode=True), "pool"),
]


@pytest.mark.parametrize("shape,kw,left", CASES)
def test_pool_as_mean_keeps_the_meaning(shape, kw, left) -> None:
    torch.manual_seed(0)
    x = torch.randn(*shape)
    g = partita.import_torch(_Pool(kw).eval(), (x,))
    before = partita.run(g, [x.numpy()])[0]
    h = partita.optimize(g.clone(), "canonicalize")
    ops = {n.op for n in h.nodes}
    pools = {"avg_pool2d", "avg_pool3d"} & ops
    assert {"none": not pools and "mean" not in ops, "mean": not pools and "mean" in ops,
            "pool": bool(pools)}[left], ops
    after = partita.run(h, [x.numpy()])[0]
    np.testing.assert_allclose(after, before, rtol=1e-6, atol=1e-6)
    with torch.inference_mode():
        np.testing.assert_allclose(after, _Pool(kw)(x).numpy(), rtol=1e-5, atol=1e-6)


def test_mean_axes_name_the_whole_axes() -> None:
    attrs = dict(kernel=(4, 1), stride=None, padding=(0, 0), dilation=(1, 1), ceil_mode=False,
                 count_include_pad=True)
    assert avg_pool_mean_axes((2, 3, 4, 6), attrs) == (2,)
    assert avg_pool_mean_axes((2, 3, 4, 6), dict(attrs, kernel=(1, 1))) == ()
    assert avg_pool_mean_axes((2, 3, 4, 6), dict(attrs, kernel=(2, 2))) is None
