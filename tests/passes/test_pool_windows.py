"""Average pools whose windows tile their input, as a reshape and a mean (passes/pool_windows.py):
the rewrite against the reference interpreter and torch on odd shapes, and the pools it leaves."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import partita
from partita.backend.numpy_ref import run as ref_run
from partita.passes.pool_windows import window_tiling


class _Pool(torch.nn.Module):
    def __init__(self, kernel: tuple, stride: tuple | None, padding: int = 0, ceil_mode: bool = False) -> None:
        super().__init__()
        self.kernel, self.stride, self.padding, self.ceil_mode = kernel, stride, padding, ceil_mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pool = F.avg_pool2d if len(self.kernel) == 2 else F.avg_pool3d
        return pool(x * 1.5, self.kernel, self.stride, self.padding, ceil_mode=self.ceil_mode) + 1.0


@pytest.mark.parametrize("shape,kernel,stride,padding,ceil_mode,rewritten", [
    ((4, 1, 8, 64), (2, 1), (2, 1), 0, True, True),      # Funnel's query pooling
    ((2, 3, 9, 10), (3, 1), None, 0, False, True),
    ((2, 3, 6, 7), (1, 7), (1, 7), 0, True, True),
    ((1, 2, 4, 6, 10), (1, 1, 5), None, 0, False, True),
    ((2, 3, 9, 10), (3, 5), None, 0, False, False),       # windows over two axes stay pools
    ((2, 3, 9, 10), (2, 2), (2, 2), 0, True, False),      # 9 rows: the last window is cut short
    ((2, 3, 8, 8), (3, 3), (1, 1), 1, False, False),      # overlapping windows
    ((2, 3, 8, 8), (2, 2), (2, 2), 1, False, False),      # padded
])
def test_tiling_pools_become_a_mean_with_the_same_values(shape, kernel, stride, padding, ceil_mode, rewritten) -> None:
    torch.manual_seed(0)
    m = _Pool(kernel, stride, padding, ceil_mode).eval()
    x = torch.randn(shape)
    g0 = partita.import_torch(m, (x,))
    g = partita.optimize(partita.import_torch(m, (x,)), "canonicalize")
    ops = [n.op for n in g.nodes]
    assert (not any(op.startswith("avg_pool") for op in ops)) == rewritten
    assert ("mean" in ops) == rewritten
    want = m(x).numpy()
    np.testing.assert_allclose(ref_run(g, [x.numpy()])[0], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ref_run(g0, [x.numpy()])[0], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(partita.run(g, [x.numpy()])[0], want, rtol=1e-5, atol=1e-6)


def test_window_tiling_names_the_windows() -> None:
    assert window_tiling((4, 1, 8, 64), {"kernel": [2, 1], "stride": [2, 1], "padding": [0, 0],
                                         "dilation": [1, 1]}) == [2, 1]
    assert window_tiling((4, 1, 8, 64), {"kernel": [1, 1], "stride": None}) is None     # the identity
    assert window_tiling((4, 1, 8, 64), {"kernel": [2, 2], "stride": None}) is None     # two axes
    assert window_tiling((4, 1, 8, 64), {"kernel": [2, 2], "stride": [2, 2], "dilation": [2, 2]}) is None
